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
import re
from pathlib import Path

from .profiles import (DELIVERED_FRACTION, DELIVERED_FRACTION_RANGE, GB, HOST_FILE, HOSTS, HostCPU, profile_dir)

__all__ = ["parse_host", "memory_host", "measured_host", "calibrated_host", "UNKNOWN_DESKTOP", "DDR_SPEEDS",
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
        source=(f"host not given: a desktop between dual-channel DDR4-2666 ({lo_peak / GB:.1f} GB/s peak) and "
                f"DDR5-6400 ({hi_peak / GB:.1f} GB/s), priced at their geometric middle x {DELIVERED_FRACTION:.2f}; "
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
        source=(f"{given!r}: peak {mts} MT/s x 8 bytes x {channels} = {peak / GB:.1f} GB/s; delivered = peak x "
                f"{DELIVERED_FRACTION:.2f}, the geometric mean of the published desktop measurements "
                f"(band {DELIVERED_FRACTION_RANGE[0]:.2f}-{DELIVERED_FRACTION_RANGE[1]:.2f}); fp32 rate of a generic "
                "8-core AVX2 desktop (decode on the host is bandwidth-bound)"))


def measured_host(gbs: float, given: str, source: str = "") -> HostCPU:
    """A host given by what one process reads from its DRAM, in GB/s."""
    if not (gbs > 0 and math.isfinite(gbs)):
        raise ValueError(f"host={given!r}: a measured DRAM bandwidth must be a positive GB/s, e.g. host=45.0.")
    b = gbs * GB
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
    h = measured_host(d["dram_bandwidth"] / GB, str(path),
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
