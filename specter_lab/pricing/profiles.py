"""Hardware profiles: a handful of effective numbers per GPU + host link (not datasheet peaks) that the
simulated clock turns into time.

How fast the host→device link really moves pinned memory, what one copy costs to start, how fast kernels stream
weights from device memory, what a kernel launch costs, and what the host CPU can do. Only the CUDA clock
measures time; a profile from :func:`specter_lab.pricing.calibrate.calibrate` holds measured numbers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

GB = 1e9

__all__ = ["HardwareProfile", "PROFILES", "DEFAULT_PROFILE", "get_profile", "profile_dir", "GB", "EXECUTIONS",
           "HOST_OP_COST", "KERNEL_TIME", "HostCPU", "HOSTS", "get_host", "with_host_cpu", "CONSUMER_GPUS",
           "DramMeasurement", "DRAM_MEASUREMENTS", "DELIVERED_FRACTION", "DELIVERED_FRACTION_RANGE"]

EXECUTIONS = ("eager", "compiled")
# Defaults derived from the published batch-1 table (``sl.bench.published()``, ``specter_lab/published.py`` holds
# the rows and the derivation; a test checks these constants still match it):
#  * HOST_OP_COST: host seconds per aten op in eager PyTorch + transformers = the geometric-mean fit of
#    published ms/token ÷ counted aten ops per token over the four host-bound rows (Qwen1.5-MoE eager /
#    grouped_mm / batched_mm on A100, DeepSeek-V2-Lite HF on A100).
#  * KERNEL_TIME: device seconds per kernel beyond its bytes/FLOPs (launch gap + the ramp of a kernel too small to
#    reach bandwidth) = (published compiled ms/token − its bytes floor) ÷ its kernels, from the one compiled
#    transformers row (Qwen1.5-MoE batched_mm + torch.compile on A100).
HOST_OP_COST = 12.5e-6
KERNEL_TIME = 3.6e-6


@dataclass(frozen=True)
class HardwareProfile:
    """Effective speeds of one GPU + host link, used by the simulated clock.

    Bandwidths in bytes/s, times in seconds, FLOP/s for dense fp16/bf16 matmul. ``cpu_*`` fields price work done
    on the host (the ``host`` draft variant). ``measured`` is True only for a profile produced by
    :func:`calibrate` on a real GPU.
    """

    name: str
    pcie_bandwidth: float  # effective pinned host→device bytes/s
    copy_latency: float  # fixed cost of one cudaMemcpyAsync (driver + DMA setup), s
    hbm_bandwidth: float  # effective device-memory read bandwidth for weight streaming, bytes/s
    peak_flops: float  # effective dense half-precision FLOP/s at the small batch sizes of decoding
    launch_overhead: float = 6e-6  # per kernel launch in eager PyTorch, s
    pageable_bandwidth: float | None = None  # host→device from pageable memory, bytes/s
    cpu_mem_bandwidth: float = 40 * GB  # host DRAM bandwidth one process really gets, bytes/s
    cpu_flops: float = 0.6e12  # host fp32 FLOP/s (AVX2/AVX-512 over all cores)
    device_memory: float | None = None  # bytes, informative
    measured: bool = False
    notes: str = ""
    host_op_cost: float = HOST_OP_COST  # host s per dispatched aten op (eager)
    kernel_time: float = KERNEL_TIME  # device s per kernel beyond its bytes / FLOPs
    execution: str = "eager"  # eager | compiled
    host_source: str = "derived from the published table (sl.bench.published())"
    hbm_datasheet: float | None = None  # datasheet VRAM bandwidth, bytes/s (what per-format decode efficiency scales)

    def __post_init__(self) -> None:
        if self.execution not in EXECUTIONS:
            raise ValueError(f"execution={self.execution!r} is unknown: use one of {list(EXECUTIONS)} "
                             "('eager' prices host dispatch per aten op, 'compiled' is the graphs/compile what-if).")
        if self.host_op_cost < 0 or self.kernel_time < 0:
            raise ValueError("HardwareProfile.host_op_cost and kernel_time must be >= 0")
        for f in ("pcie_bandwidth", "hbm_bandwidth", "peak_flops", "cpu_mem_bandwidth", "cpu_flops"):
            if not getattr(self, f) > 0:
                raise ValueError(f"HardwareProfile.{f} must be > 0, got {getattr(self, f)!r}")
        if self.copy_latency < 0 or self.launch_overhead < 0:
            raise ValueError("HardwareProfile latencies must be >= 0")

    @property
    def clock_label(self) -> str:
        # Always "simulated": a profile calibrated on a GPU prices runs; only the CUDA clock measures them.
        return f"simulated:{self.name} ({self.execution}" + (", calibrated)" if self.measured else ")")

    def with_execution(self, execution: str) -> "HardwareProfile":
        """The same profile priced in another execution mode (``"eager"`` or ``"compiled"``)."""
        return replace(self, execution=execution)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "HardwareProfile":
        known = {f.name for f in fields(cls)}  # a profile saved before a field existed keeps its default
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


# Effective numbers: public specs discounted by what pinned cudaMemcpyAsync and decode-size kernels reach.
#  * PCIe 3.0 x16 is 15.75 GB/s raw, ~12 GB/s pinned in practice; PCIe 4.0 x16 32 GB/s raw, ~25 GB/s pinned;
#    PCIe 5.0 x16 64 GB/s raw, ~50 GB/s pinned (nvbandwidth / bandwidthTest figures reported by vendors and users).
#  * hbm_bandwidth ≈ 80–85 % of the datasheet memory bandwidth (what a streaming GEMV reaches).
#  * peak_flops ≈ half of the datasheet dense FP16 tensor throughput: decode GEMMs are skinny.
PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in [
        HardwareProfile("t4-pcie3", 12 * GB, 10e-6, 260 * GB, 30e12, 7e-6, 6 * GB, 25 * GB, 0.3e12, 16 * GB,
                        notes="T4 16GB: 320 GB/s GDDR6, 65 TFLOPS fp16 tensor, PCIe 3.0 x16"),
        HardwareProfile("rtx3090-pcie4", 25 * GB, 9e-6, 780 * GB, 60e12, 6e-6, 10 * GB, 40 * GB, 0.6e12, 24 * GB,
                        notes="RTX 3090 24GB: 936 GB/s GDDR6X, 142 TFLOPS fp16 tensor (sparse), PCIe 4.0 x16"),
        HardwareProfile("rtx4090-pcie4", 25 * GB, 8e-6, 850 * GB, 80e12, 5e-6, 10 * GB, 60 * GB, 1.0e12, 24 * GB,
                        notes="RTX 4090 24GB: 1008 GB/s GDDR6X, 165 TFLOPS fp16 tensor (fp32 acc.), PCIe 4.0 x16",
                        hbm_datasheet=1008 * GB),
        HardwareProfile("a100-40g-pcie4", 25 * GB, 9e-6, 1300 * GB, 150e12, 6e-6, 10 * GB, 80 * GB, 1.2e12, 40 * GB,
                        notes="A100 40GB PCIe: 1555 GB/s HBM2, 312 TFLOPS fp16 tensor, PCIe 4.0 x16"),
        HardwareProfile("h100-pcie5", 50 * GB, 8e-6, 1700 * GB, 350e12, 5e-6, 14 * GB, 100 * GB, 2.0e12, 80 * GB,
                        notes="H100 PCIe 80GB: 2.0 TB/s HBM2e, 756 TFLOPS fp16 tensor, PCIe 5.0 x16"),
        HardwareProfile("h200-pcie5", 50 * GB, 8e-6, 4000 * GB, 400e12, 5e-6, 14 * GB, 100 * GB, 2.0e12, 141 * GB,
                        notes="H200 NVL 141GB: 4.8 TB/s HBM3e, 835 TFLOPS fp16 tensor, PCIe 5.0 x16"),
        # Consumer cards of the published offloaded rows (sl.bench.consumer_anchors()). Datasheet VRAM bandwidth
        # and memory from NVIDIA's spec pages; hbm_bandwidth = 0.8 x datasheet as above; the GTX 1060's link is
        # the 12.2 GB/s quantprobe measured on that box (FedericoTs/quantprobe docs/HARDWARE.md).
        HardwareProfile(name="gtx1060-pcie3", pcie_bandwidth=12.2 * GB, copy_latency=10e-6, hbm_bandwidth=154 * GB,
                        peak_flops=2.2e12, launch_overhead=7e-6, pageable_bandwidth=6 * GB,
                        cpu_mem_bandwidth=26.1 * GB, cpu_flops=0.5e12, device_memory=6 * GB, hbm_datasheet=192 * GB,
                        notes="GTX 1060 6GB (Pascal GP106): 192 GB/s GDDR5, 4.4 TFLOPS fp32 (fp16 at 1/64: llama.cpp "
                              "decodes with fp32 / dp4a), PCIe 3.0 x16 measured 12.2 GB/s"),
        HardwareProfile(name="rtx2080-pcie3", pcie_bandwidth=12 * GB, copy_latency=10e-6, hbm_bandwidth=358 * GB,
                        peak_flops=20e12, launch_overhead=6e-6, pageable_bandwidth=6 * GB,
                        cpu_mem_bandwidth=50 * GB, cpu_flops=2.5e12, device_memory=8 * GB, hbm_datasheet=448 * GB,
                        notes="RTX 2080 8GB (Turing TU104): 448 GB/s GDDR6, 40 TFLOPS fp16 tensor (fp32 acc.), "
                              "PCIe 3.0 x16"),
        HardwareProfile(name="rtx5090-pcie5", pcie_bandwidth=50 * GB, copy_latency=8e-6, hbm_bandwidth=1430 * GB,
                        peak_flops=100e12, launch_overhead=5e-6, pageable_bandwidth=14 * GB,
                        cpu_mem_bandwidth=100 * GB, cpu_flops=2.0e12, device_memory=32 * GB, hbm_datasheet=1792 * GB,
                        notes="RTX 5090 32GB (Blackwell GB202): 1792 GB/s GDDR7, 209 TFLOPS fp16 tensor, PCIe 5.0 x16"),
    ]
}

DEFAULT_PROFILE = "rtx4090-pcie4"

# Short names the estimator accepts for --gpu (the consumer cards of the published offloaded rows, and the rest).
CONSUMER_GPUS = {"gtx1060": "gtx1060-pcie3", "rtx2080": "rtx2080-pcie3", "rtx3090": "rtx3090-pcie4",
                 "rtx4090": "rtx4090-pcie4", "rtx5090": "rtx5090-pcie5", "t4": "t4-pcie3", "a100": "a100-40g-pcie4",
                 "h100": "h100-pcie5", "h200": "h200-pcie5"}


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
                dram="DDR4-3000, 2 channels", dram_peak=48.0 * GB, dram_delivered=26.1 * GB,
                flops=4 * 4.0e9 * 32, delivered_range=(26.1 * GB * 0.95, 26.1 * GB * 1.05),
                source="Intel ARK (4 cores, 4.2 GHz turbo, 2 channels); delivered 26.1 GB/s measured on the box of "
                       "the published rows (FedericoTs/quantprobe docs/HARDWARE.md; band +/-5 %); 32 FLOP/cycle "
                       "(2 AVX2 FMA)"),
        HostCPU(name="i9-10900x-ddr4-2933", cpu="Intel Core i9-10900X (10C/20T, Cascade Lake-X, AVX-512)", cores=10,
                dram="DDR4-2933, 4 channels", dram_peak=93.9 * GB, dram_delivered=93.9 * GB * DELIVERED_FRACTION,
                flops=10 * 4.0e9 * 64, delivered_range=_assumed_range(93.9 * GB),
                source=f"Intel ARK (10 cores, quad-channel DDR4-2933 = 93.9 GB/s); {_ASSUMED}; 64 FLOP/cycle "
                       "(2 AVX-512 FMA)"),
        HostCPU(name="epyc-9355-ddr5-6400", cpu="AMD EPYC 9355 (32C, Zen 5), one socket, AVX2 path", cores=32,
                dram="DDR5-6400, 12 channels", dram_peak=614.4 * GB, dram_delivered=614.4 * GB * DELIVERED_FRACTION,
                flops=32 * 3.5e9 * 32, delivered_range=_assumed_range(614.4 * GB),
                source=f"AMD spec (32 cores, 12 channels DDR5-6400 = 614 GB/s per socket); {_ASSUMED}; "
                       "32 FLOP/cycle on the AVX2 path the published run used"),
    ]
}


def get_host(host: "str | HostCPU | float | None", arg: str = "host") -> HostCPU | None:
    """Resolve ``host=``: None (not given), a HostCPU, a name in HOSTS (a unique prefix such as ``"i9-10900x"`` is
    enough), a memory description (``"ddr5-5600x2"``), a measured GB/s or ``"calibrated"``
    (:func:`specter_lab.pricing.hosts.parse_host`)."""
    from .hosts import parse_host  # hosts builds on this module

    return parse_host(host, arg)


def with_host_cpu(profile: HardwareProfile, host: HostCPU) -> HardwareProfile:
    """``profile`` with ``host``'s DRAM and FLOP/s as its host fields, named ``<profile>+<host>`` so every output
    says which host priced the host lane."""
    return replace(profile, name=f"{profile.name}+{host.name}", cpu_mem_bandwidth=host.dram_delivered,
                   cpu_flops=host.flops, notes=f"{profile.notes}; host {host.cpu}, {host.dram} ({host.source})")


def profile_dir() -> Path:
    return Path(os.environ.get("SPECTER_LAB_PROFILES", Path.home() / ".cache" / "specter_lab" / "profiles"))


HOST_FILE = "host.json"  # written by calibrate_host() (offload/hostcal.py)


def saved_host(path: Path | None = None) -> dict:
    """The saved host calibration as a dict (see :func:`specter_lab.calibrate_host`)."""
    path = path or profile_dir() / HOST_FILE
    if not path.is_file():
        raise ValueError(f"no host calibration at {path}: run sl.calibrate_host() or `specter-lab calibrate --host` "
                         "first (it needs no GPU), or use a profile name without '+host'.")
    return json.loads(path.read_text())


def with_host(profile: HardwareProfile, host: dict | None = None) -> HardwareProfile:
    """``profile`` with this machine's measured host fields, named ``<profile>+host`` so every output says so."""
    host = host if host is not None else saved_host()
    return replace(profile, name=f"{profile.name}+host", cpu_mem_bandwidth=host["cpu_mem_bandwidth"],
                   cpu_flops=host["cpu_flops"],
                   notes=f"{profile.notes}; host measured by calibrate_host ({host['dtype']}, {host['threads']} threads)")


def get_profile(hardware: "str | HardwareProfile | None") -> HardwareProfile:
    """Resolve ``hardware=``: a profile, a preset name, a saved calibrated profile name or JSON path.

    A name may end in ``@eager`` or ``@compiled`` to pick the execution mode (``"a100-40g-pcie4@compiled"``), and
    ``+<host>`` names the host CPU beside the GPU (``"rtx2080-pcie3+i9-10900x-ddr4-2933"``, a name in ``HOSTS``).
    ``"cuda"`` is the GPU's own clock, not a profile: :func:`specter_lab.offload.clock.make_clock` resolves it.
    """
    if isinstance(hardware, str) and "@" in hardware and not hardware.endswith(".json"):
        base, execution = hardware.rsplit("@", 1)
        if execution not in EXECUTIONS:
            raise ValueError(f"hardware={hardware!r}: execution={execution!r} is unknown: use one of "
                             f"{list(EXECUTIONS)} after the '@'.")
        if base == "cuda":
            raise ValueError("hardware='cuda' runs what it runs: an execution mode applies to simulated profiles.")
        return get_profile(base).with_execution(execution)
    if hardware is None:
        return PROFILES[DEFAULT_PROFILE]
    if isinstance(hardware, HardwareProfile):
        return hardware
    if not isinstance(hardware, str):
        raise TypeError(f"hardware= must be a profile name or HardwareProfile, got {type(hardware).__name__}")
    if hardware == "cuda":
        raise ValueError("hardware='cuda' is the GPU's own clock, not a profile: resolve it with "
                         "specter_lab.offload.clock.make_clock (Engine(hardware='cuda') does).")
    if hardware in PROFILES:
        return PROFILES[hardware]
    if hardware.endswith("+host") and hardware != "cuda+host":
        return with_host(get_profile(hardware[: -len("+host")]))
    base, plus, host = hardware.partition("+")
    if plus and host in HOSTS and base != "cuda":  # a GPU profile beside a named host CPU (sl.estimate's machines)
        return with_host_cpu(get_profile(base), HOSTS[host])
    if plus and base != "cuda":  # ... or beside a host described by its memory ("rtx3060-12gb-pcie4+ddr4-3200x2")
        try:
            return with_host_cpu(get_profile(base), get_host(host))
        except ValueError:
            pass
    from .gpus import catalog_profile  # a catalog card by its profile name ("rtx3060-12gb-pcie4")

    built = catalog_profile(hardware)
    if built is not None:
        return built
    for candidate in (Path(hardware), profile_dir() / f"{hardware}.json"):
        if candidate.suffix == ".json" and candidate.is_file():
            return HardwareProfile.from_json(candidate.read_text())
    saved = sorted(p.stem for p in profile_dir().glob("*.json")) if profile_dir().is_dir() else []
    raise ValueError(
        f"hardware={hardware!r} is not a known profile. Use one of {sorted(PROFILES)}, 'cuda'"
        + (f", a calibrated profile {saved}" if saved else "")
        + ", a path to a profile .json, or a HardwareProfile(...)."
    )

