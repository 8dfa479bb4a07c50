"""A host is its memory: ``host=`` as the estimator takes it.

Decode on the host CPU streams expert weights from DRAM, so what prices it is the DRAM bandwidth one process
gets, not the CPU's name. ``host=`` may be

* a memory description ``"ddr5-5600x2"`` / ``"ddr4-3200x4"`` (type-MT/s x channels of 64 bits): peak =
  MT/s x 8 bytes x channels; delivered = peak x the geometric mean of the published desktop measurements
  (:data:`~specter_lab.pricing.profiles.DRAM_MEASUREMENTS`), the band their lowest to highest;
* a measured GB/s (``45.0``, ``"45GB/s"``): what one process reads on your box, +/-10 %;
* ``"calibrated"`` (or the path of a host file): what ``specter-lab calibrate --host`` measured here;
* a :class:`~specter_lab.pricing.profiles.HostCPU`, or a named host in ``HOSTS`` (the published rows' boxes);
* ``None``: not given. The estimate says so and prices :data:`UNKNOWN_DESKTOP`, whose band runs from dual-channel
  DDR4-2666 at the lowest measured fraction to dual-channel DDR5-6400 at the highest.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

_GB = 1e9
HOST_FILE = "host.json"  # written by specter-lab calibrate --host (pricing/hostcal.py)


def profile_dir() -> Path:
    """Where calibrations live (``$SPECTER_LAB_PROFILES``, else ``~/.cache/specter_lab/profiles``)."""
    return Path(os.environ.get("SPECTER_LAB_PROFILES", Path.home() / ".cache" / "specter_lab" / "profiles"))


@dataclass(frozen=True)
class HostCPU:
    """A host CPU and its DRAM, as decode on the host sees them.

    ``dram_peak`` is the datasheet figure (channels x MT/s x 8 bytes); ``dram_delivered`` what one process reads
    (a measurement where one exists, else ``DELIVERED_FRACTION`` of the peak, said so in ``source``);
    ``delivered_range`` the (low, high) that is plausible for it (the spread of the published measurements of
    delivered / peak, or a measurement's repeatability). ``flops`` is dense fp32 FMA throughput over all cores
    (cores x all-core GHz x FLOP/cycle of the SIMD path); ``cores`` 0 when unknown."""

    name: str
    cpu: str
    cores: int
    dram: str
    dram_peak: float  # bytes/s (0 when unknown: a measured figure only)
    dram_delivered: float  # bytes/s
    flops: float  # fp32 FLOP/s
    source: str
    delivered_range: tuple[float, float] | None = None  # bytes/s; None: exactly dram_delivered

    @property
    def delivered_band(self) -> tuple[float, float]:
        return self.delivered_range or (self.dram_delivered, self.dram_delivered)


@dataclass(frozen=True)
class DramMeasurement:
    """One published measurement of what a desktop reads from its DRAM, against its datasheet peak."""

    system: str
    dram: str
    peak: float  # GB/s
    delivered: float  # GB/s
    tool: str
    source: str

    @property
    def fraction(self) -> float:
        return self.delivered / self.peak


# Delivered / peak on desktops with named DRAM, each published (search log: docs/estimate.md). The hand-tuned
# AIDA64 read reaches 0.84-0.91 of peak; the STREAM-like probe on the published rows' box 0.54. A host described
# by its memory gets the geometric mean; its band spans the lowest to the highest.
DRAM_MEASUREMENTS: tuple[DramMeasurement, ...] = (
    DramMeasurement("Intel i5-7600K", "DDR4-3000, 2 channels", 48.0, 26.1, "quantprobe bandwidth probe",
                    "FedericoTs/quantprobe docs/HARDWARE.md (prereg #27)"),
    DramMeasurement("Intel Z370/Z390 desktop (G.Skill TridentZ Royal kit)", "DDR4-3200 XMP, 2 channels", 51.2, 46.0,
                    "AIDA64 memory read",
                    "https://guru3d.com/review/g-skill-tridentz-royal-ddr4-3200-mhz-review/page-10"),
    DramMeasurement("Intel Z370/Z390 desktop (same kit at its SPD default)", "DDR4-2133, 2 channels", 34.1, 31.0,
                    "AIDA64 memory read ('30~32 GB/s')",
                    "https://guru3d.com/review/g-skill-tridentz-royal-ddr4-3200-mhz-review/page-9"),
    DramMeasurement("Intel Skylake, Gigabyte Z170X Gaming G1", "DDR4-3200, 2 channels", 51.2, 43.0,
                    "AIDA64 memory read ('way over 43K')",
                    "https://guru3d.com/review/gigabyte-z170x-gaming-g1-review/page-17"),
)
_FRACTIONS = [m.fraction for m in DRAM_MEASUREMENTS]
DELIVERED_FRACTION = math.exp(sum(math.log(f) for f in _FRACTIONS) / len(_FRACTIONS))
DELIVERED_FRACTION_RANGE = (min(_FRACTIONS), max(_FRACTIONS))
_ASSUMED = (f"delivered = peak x {DELIVERED_FRACTION:.2f}, the geometric mean of {len(DRAM_MEASUREMENTS)} published "
            f"desktop measurements (band {DELIVERED_FRACTION_RANGE[0]:.2f}-{DELIVERED_FRACTION_RANGE[1]:.2f} x peak; "
            "pricing.profiles.DRAM_MEASUREMENTS): not measured on this box")


def _assumed_range(peak: float) -> tuple[float, float]:
    return (peak * DELIVERED_FRACTION_RANGE[0], peak * DELIVERED_FRACTION_RANGE[1])


HOSTS: dict[str, HostCPU] = {
    h.name: h
    for h in [
        HostCPU(name="i5-7600k-ddr4-3000", cpu="Intel Core i5-7600K (4C/4T, Kaby Lake, AVX2)", cores=4,
                dram="DDR4-3000, 2 channels", dram_peak=48.0 * _GB, dram_delivered=26.1 * _GB,
                flops=4 * 4.0e9 * 32, delivered_range=(26.1 * _GB * 0.95, 26.1 * _GB * 1.05),
                source="Intel ARK (4 cores, 4.2 GHz turbo, 2 channels); delivered 26.1 GB/s measured on the box of "
                       "the published rows (FedericoTs/quantprobe docs/HARDWARE.md; band +/-5 %); 32 FLOP/cycle "
                       "(2 AVX2 FMA)"),
        HostCPU(name="i9-10900x-ddr4-2933", cpu="Intel Core i9-10900X (10C/20T, Cascade Lake-X, AVX-512)", cores=10,
                dram="DDR4-2933, 4 channels", dram_peak=93.9 * _GB, dram_delivered=93.9 * _GB * DELIVERED_FRACTION,
                flops=10 * 4.0e9 * 64, delivered_range=_assumed_range(93.9 * _GB),
                source=f"Intel ARK (10 cores, quad-channel DDR4-2933 = 93.9 GB/s); {_ASSUMED}; 64 FLOP/cycle "
                       "(2 AVX-512 FMA)"),
        HostCPU(name="epyc-9355-ddr5-6400", cpu="AMD EPYC 9355 (32C, Zen 5), one socket, AVX2 path", cores=32,
                dram="DDR5-6400, 12 channels", dram_peak=614.4 * _GB, dram_delivered=614.4 * _GB * DELIVERED_FRACTION,
                flops=32 * 3.5e9 * 32, delivered_range=_assumed_range(614.4 * _GB),
                source=f"AMD spec (32 cores, 12 channels DDR5-6400 = 614 GB/s per socket); {_ASSUMED}; "
                       "32 FLOP/cycle on the AVX2 path the published run used"),
    ]
}



__all__ = ["HostCPU", "HOSTS", "DramMeasurement", "DRAM_MEASUREMENTS", "DELIVERED_FRACTION",
           "DELIVERED_FRACTION_RANGE", "parse_host", "memory_host", "measured_host", "calibrated_host", "UNKNOWN_DESKTOP", "DDR_SPEEDS",
           "MEASURED_SPREAD", "host_examples"]

# JEDEC / XMP data rates (MT/s) a desktop DIMM is sold at: a spelling outside these is most likely a typo.
DDR_SPEEDS = {"ddr4": (1600, 1866, 2133, 2400, 2666, 2933, 3000, 3200, 3333, 3466, 3600, 3733, 3800, 4000, 4133,
                       4266, 4400, 4600, 4800, 5000, 5100),
              "ddr5": (4000, 4400, 4800, 5200, 5600, 6000, 6200, 6400, 6600, 6800, 7000, 7200, 7600, 8000, 8200,
                       8400, 8800)}
MEASURED_SPREAD = 0.10  # +/- on one measured figure: run-to-run and tool-to-tool spread
_SPEC = re.compile(r"(ddr[45])-?(\d{4})(?:x(\d{1,2}))?")
_GBS = re.compile(r"(\d+(?:\.\d+)?)\s*gb/?s")


def _desktop() -> HostCPU:
    lo_peak, hi_peak = 2666e6 * 8 * 2, 6400e6 * 8 * 2
    mid = math.sqrt(lo_peak * hi_peak)
    return HostCPU(
        name="unknown-desktop", cpu="not given", cores=0, dram="not given (dual-channel DDR4-2666 to DDR5-6400)",
        dram_peak=mid, dram_delivered=mid * DELIVERED_FRACTION, flops=8 * 4.0e9 * 32,
        delivered_range=(lo_peak * DELIVERED_FRACTION_RANGE[0], hi_peak * DELIVERED_FRACTION_RANGE[1]),
        source=(f"host not given: a desktop between dual-channel DDR4-2666 ({lo_peak / _GB:.1f} GB/s peak) and "
                f"DDR5-6400 ({hi_peak / _GB:.1f} GB/s), priced at their geometric middle x {DELIVERED_FRACTION:.2f}; "
                "give host='ddr5-5600x2' (your memory) or a measured GB/s to narrow the band"))


UNKNOWN_DESKTOP = _desktop()


def host_examples() -> list[str]:
    return ["ddr4-3200x2", "ddr5-5600x2", "ddr4-3200x4", "45GB/s", "calibrated"] + sorted(HOSTS)


def memory_host(kind: str, mts: int, channels: int, given: str) -> HostCPU:
    """A host described by its memory: ``kind`` (ddr4 | ddr5) at ``mts`` MT/s over ``channels`` 64-bit channels."""
    peak = mts * 1e6 * 8 * channels
    return HostCPU(
        name=f"{kind}-{mts}x{channels}", cpu="not given (priced by its memory)", cores=0,
        dram=f"{kind.upper()}-{mts}, {channels} channels", dram_peak=peak, dram_delivered=peak * DELIVERED_FRACTION,
        flops=8 * 4.0e9 * 32,
        delivered_range=(peak * DELIVERED_FRACTION_RANGE[0], peak * DELIVERED_FRACTION_RANGE[1]),
        source=(f"{given!r}: peak {mts} MT/s x 8 bytes x {channels} = {peak / _GB:.1f} GB/s; delivered = peak x "
                f"{DELIVERED_FRACTION:.2f}, the geometric mean of the published desktop measurements "
                f"(band {DELIVERED_FRACTION_RANGE[0]:.2f}-{DELIVERED_FRACTION_RANGE[1]:.2f}); fp32 rate of a generic "
                "8-core AVX2 desktop (decode on the host is bandwidth-bound)"))


def measured_host(gbs: float, given: str, source: str = "") -> HostCPU:
    """A host given by what one process reads from its DRAM, in GB/s."""
    if not (gbs > 0 and math.isfinite(gbs)):
        raise ValueError(f"host={given!r}: a measured DRAM bandwidth must be a positive GB/s, e.g. host=45.0.")
    b = gbs * _GB
    return HostCPU(name=f"measured-{gbs:g}gbs", cpu="not given (priced by its measured bandwidth)", cores=0,
                   dram=f"measured {gbs:g} GB/s", dram_peak=0.0, dram_delivered=b, flops=8 * 4.0e9 * 32,
                   delivered_range=(b * (1 - MEASURED_SPREAD), b * (1 + MEASURED_SPREAD)),
                   source=source or f"{given!r}: measured by the user, band +/-{MEASURED_SPREAD:.0%}")


def calibrated_host(path: "str | Path | None" = None) -> HostCPU:
    """The host ``specter-lab calibrate --host`` measured on this machine (``host.json`` in the profile folder,
    or ``path``): its DRAM read bandwidth on all cores, +/-10 %."""
    path = Path(path) if path else profile_dir() / HOST_FILE
    if not path.is_file():
        raise ValueError(f"host='calibrated': no host file at {path}. Run `specter-lab calibrate --host` on this "
                         "machine first (no GPU needed), or give host='ddr5-5600x2' / a measured GB/s.")
    d = json.loads(path.read_text())
    if "dram_bandwidth" not in d:
        raise ValueError(f"host={str(path)!r}: the host file has no 'dram_bandwidth' field: write it again with "
                         "`specter-lab calibrate --host`.")
    threads = d.get("dram_threads", d.get("threads", 0))
    h = measured_host(d["dram_bandwidth"] / _GB, str(path),
                      source=f"measured by `specter-lab calibrate --host` ({path}: a {d.get('dram_bytes', 0) / 2**20:.0f}"
                             f" MiB read on {threads} threads; band +/-{MEASURED_SPREAD:.0%})")
    return HostCPU(**{**h.__dict__, "name": "calibrated", "cores": int(d.get("cores", 0) or 0),
                      "cpu": d.get("cpu", "this machine")})


def parse_host(host, arg: str = "host") -> HostCPU | None:
    """Resolve ``host=`` (see the module docstring). ``None`` stays None: the caller prices
    :data:`UNKNOWN_DESKTOP` and says the host was not given."""
    if host is None or isinstance(host, HostCPU):
        return host
    if isinstance(host, bool):
        raise ValueError(f"{arg}={host!r}: give a memory description such as 'ddr5-5600x2' or a GB/s number.")
    if isinstance(host, (int, float)):
        return measured_host(float(host), str(host))
    if isinstance(host, Path) or str(host).endswith(".json"):
        return calibrated_host(host)
    key = str(host).strip().lower().replace(" ", "")
    if key in ("calibrated", "host", "this"):
        return calibrated_host()
    if key in HOSTS:
        return HOSTS[key]
    prefix = [n for n in HOSTS if n.startswith(key)]
    if len(prefix) == 1:
        return HOSTS[prefix[0]]
    m = _GBS.fullmatch(key.removeprefix("measured-"))
    if m:
        return measured_host(float(m.group(1)), str(host))
    try:
        return measured_host(float(key), str(host))
    except ValueError:
        pass
    m = _SPEC.fullmatch(key)
    if m:
        kind, mts, ch = m.group(1), int(m.group(2)), int(m.group(3) or 2)
        if mts not in DDR_SPEEDS[kind]:
            near = sorted(DDR_SPEEDS[kind], key=lambda v: abs(v - mts))[:3]
            raise ValueError(f"{arg}={host!r}: {kind.upper()} is not sold at {mts} MT/s; nearest "
                             f"{[f'{kind}-{v}x{ch}' for v in near]}.")
        if not 1 <= ch <= 12:
            raise ValueError(f"{arg}={host!r}: {ch} memory channels; a desktop has 2 (4 on HEDT, up to 12 on "
                             f"servers). E.g. '{kind}-{mts}x2'.")
        h = memory_host(kind, mts, ch, str(host))
        if m.group(3) is None:  # say what was assumed
            h = HostCPU(**{**h.__dict__, "source": h.source + "; channels not given: 2 assumed (a desktop)"})
        return h
    names = host_examples()
    close = difflib.get_close_matches(key, names, n=4, cutoff=0.4)
    raise ValueError(f"{arg}={host!r} is not a host: give its memory as type-MT/s x channels ('ddr4-3200x2', "
                     f"'ddr5-5600x2'), a measured GB/s (45.0 or '45GB/s'), 'calibrated' (after `specter-lab "
                     f"calibrate --host`) or a named host; closest {close or names[:4]}.")
