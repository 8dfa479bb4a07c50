"""Hardware profiles: a handful of effective numbers per GPU + host link (not datasheet peaks) that the
simulated clock turns into time.

How fast the host→device link really moves pinned memory, what one copy costs to start, how fast kernels stream
weights from device memory, what a kernel launch costs, and what the host CPU can do. Only the CUDA clock
measures time; a profile from :func:`specter_lab.offload.calibrate.calibrate` holds measured numbers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

GB = 1e9

__all__ = ["HardwareProfile", "PROFILES", "DEFAULT_PROFILE", "get_profile", "profile_dir", "GB", "EXECUTIONS",
           "HOST_OP_COST", "KERNEL_TIME"]

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
                        notes="RTX 4090 24GB: 1008 GB/s GDDR6X, 165 TFLOPS fp16 tensor (fp32 acc.), PCIe 4.0 x16"),
        HardwareProfile("a100-40g-pcie4", 25 * GB, 9e-6, 1300 * GB, 150e12, 6e-6, 10 * GB, 80 * GB, 1.2e12, 40 * GB,
                        notes="A100 40GB PCIe: 1555 GB/s HBM2, 312 TFLOPS fp16 tensor, PCIe 4.0 x16"),
        HardwareProfile("h100-pcie5", 50 * GB, 8e-6, 1700 * GB, 350e12, 5e-6, 14 * GB, 100 * GB, 2.0e12, 80 * GB,
                        notes="H100 PCIe 80GB: 2.0 TB/s HBM2e, 756 TFLOPS fp16 tensor, PCIe 5.0 x16"),
        HardwareProfile("h200-pcie5", 50 * GB, 8e-6, 4000 * GB, 400e12, 5e-6, 14 * GB, 100 * GB, 2.0e12, 141 * GB,
                        notes="H200 NVL 141GB: 4.8 TB/s HBM3e, 835 TFLOPS fp16 tensor, PCIe 5.0 x16"),
    ]
}

DEFAULT_PROFILE = "rtx4090-pcie4"


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

    A name may end in ``@eager`` or ``@compiled`` to pick the execution mode (``"a100-40g-pcie4@compiled"``).
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
    for candidate in (Path(hardware), profile_dir() / f"{hardware}.json"):
        if candidate.suffix == ".json" and candidate.is_file():
            return HardwareProfile.from_json(candidate.read_text())
    saved = sorted(p.stem for p in profile_dir().glob("*.json")) if profile_dir().is_dir() else []
    raise ValueError(
        f"hardware={hardware!r} is not a known profile. Use one of {sorted(PROFILES)}, 'cuda'"
        + (f", a calibrated profile {saved}" if saved else "")
        + ", a path to a profile .json, or a HardwareProfile(...)."
    )

