"""Hardware profiles: a handful of effective numbers per GPU + host link (not datasheet peaks) that the
simulated clock turns into time.

How fast the host→device link really moves pinned memory, what one copy costs to start, how fast kernels stream
weights from device memory, what a kernel launch costs, and what the host CPU can do. Only the CUDA clock
measures time; a profile from :func:`specter_lab.pricing.calibrate.calibrate` holds measured numbers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from .gpus import CARDS, GPU, LINK_EFFICIENCY, find_gpu
from .hosts import (DELIVERED_FRACTION, DELIVERED_FRACTION_RANGE, DRAM_MEASUREMENTS, HOST_FILE, HOSTS, DramMeasurement,
                    HostCPU, parse_host, profile_dir)

GB = 1e9

__all__ = ["HardwareProfile", "PROFILES", "DEFAULT_PROFILE", "get_profile", "profile_dir", "GB", "EXECUTIONS",
           "HOST_OP_COST", "KERNEL_TIME", "HostCPU", "HOSTS", "get_host", "with_host_cpu", "CONSUMER_GPUS",
           "DramMeasurement", "DRAM_MEASUREMENTS", "DELIVERED_FRACTION", "DELIVERED_FRACTION_RANGE",
           "gpu_profile", "resolve_gpu", "catalog_profile", "DISK_BANDWIDTH", "DISK_LATENCY", "HOST_DECODE_EFFICIENCY",
           "HOST_EFFICIENCY_RANGE"]

# How a run's ops are priced (pricing/engines.py builds the cost model): eager PyTorch (host dispatch per aten op)
# and compiled graphs are the cost model's own pieces (None); another engine class names the module of this folder
# that builds its cost model: the llama.cpp-class engine (graphs, one fused MoE kernel a layer, GGUF/MXFP4
# formats). A new engine class is that module and its line here.
EXECUTIONS: dict[str, str | None] = {"eager": None, "compiled": None, "llama.cpp": ".llamacpp"}
# Defaults derived from the published batch-1 table (``sl.bench.published()``; ``specter_lab/pricing/published.py``
# holds the rows and the derivation; a test checks these constants still match it):
#  * HOST_OP_COST: host seconds per aten op in eager PyTorch + transformers = the geometric-mean fit of
#    published ms/token ÷ counted aten ops per token over the four host-bound rows (Qwen1.5-MoE eager /
#    grouped_mm / batched_mm on A100, DeepSeek-V2-Lite HF on A100).
#  * KERNEL_TIME: device seconds per kernel beyond its bytes/FLOPs (launch gap + the ramp of a kernel too small to
#    reach bandwidth) = (published compiled ms/token − its bytes floor) ÷ its kernels, from the one compiled
#    transformers row (Qwen1.5-MoE batched_mm + torch.compile on A100).
HOST_OP_COST = 12.5e-6
KERNEL_TIME = 3.6e-6
# The disk tier's defaults (offload/hostcache.py: experts read from the checkpoint's files when the host expert
# cache misses): a PCIe 4.0 x4 NVMe SSD read by one thread in expert-sized pieces (hundreds of KB to ~10 MB).
#  * DISK_BANDWIDTH 5 GB/s: ~70 % of the 7 GB/s datasheet sequential read of a PCIe 4.0 drive (Samsung 980 PRO,
#    pugetsystems.com parts page; Micron 7450 6.8 GB/s), the share one-expert-granularity random reads keep:
#    0.78-0.83x of sequential at one thread on an Apple NVMe (antirez/ds4#491, ~3-9 MiB pieces), 94 % of fio's
#    2 MiB roofline in a KV-cache loader (NVIDIA/recsys-examples#472).
#  * DISK_LATENCY 80 us per read: a queue-depth-1 4 KB random read. 4 KB / 80 us = 51 MB/s, the 4K random read
#    AS SSD measures on a Samsung 950 PRO NVMe (51.29 MB/s, cdrinfo.com review), so small reads are priced at the
#    low effective bandwidth they get and expert-sized ones near the sequential figure.
# Both are assumptions for a desktop drive, not measurements of this machine; set them per profile
# (dataclasses.replace(profile, disk_bandwidth=..., disk_latency=...)).
DISK_BANDWIDTH = 5e9
DISK_LATENCY = 80e-6
# The share of the host's delivered DRAM bandwidth a batch-1 quantized expert matvec reaches in a llama.cpp-class
# engine (dequantization and thread barriers cost the rest): fitted to the published consumer rows tagged ``fit``
# (consumer.derive_host_efficiency(); tests/test_consumer.py checks it still matches), banded by the lowest and
# highest value a single fit row reproduces. Only the llama.cpp-class engine reads it.
HOST_DECODE_EFFICIENCY = 0.505
HOST_EFFICIENCY_RANGE = (0.416, 0.670)


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
    disk_bandwidth: float = DISK_BANDWIDTH  # the disk tier: checkpoint file → host RAM, bytes/s (one reader)
    disk_latency: float = DISK_LATENCY  # fixed cost of one read from the checkpoint file, s
    host_efficiency: float = HOST_DECODE_EFFICIENCY  # share of delivered DRAM a host expert matvec reaches (llama.cpp)

    def __post_init__(self) -> None:
        if self.execution not in EXECUTIONS:
            raise ValueError(f"execution={self.execution!r} is unknown: use one of {list(EXECUTIONS)} "
                             "('eager' prices host dispatch per aten op, 'compiled' is the graphs/compile what-if).")
        if self.host_op_cost < 0 or self.kernel_time < 0:
            raise ValueError("HardwareProfile.host_op_cost and kernel_time must be >= 0")
        for f in ("pcie_bandwidth", "hbm_bandwidth", "peak_flops", "cpu_mem_bandwidth", "cpu_flops", "disk_bandwidth"):
            if not getattr(self, f) > 0:
                raise ValueError(f"HardwareProfile.{f} must be > 0, got {getattr(self, f)!r}")
        if self.copy_latency < 0 or self.launch_overhead < 0 or self.disk_latency < 0:
            raise ValueError("HardwareProfile latencies must be >= 0")
        if not self.host_efficiency > 0:  # above 1 only while a fit searches (consumer.derive_host_efficiency)
            raise ValueError(f"HardwareProfile.host_efficiency must be > 0, got {self.host_efficiency!r}")

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
        HardwareProfile(name="t4-pcie3", pcie_bandwidth=12 * GB, copy_latency=10e-6, hbm_bandwidth=260 * GB,
                        peak_flops=30e12, launch_overhead=7e-6, pageable_bandwidth=6 * GB,
                        cpu_mem_bandwidth=25 * GB, cpu_flops=0.3e12, device_memory=16 * GB,
                        notes="T4 16GB: 320 GB/s GDDR6, 65 TFLOPS fp16 tensor, PCIe 3.0 x16"),
        HardwareProfile(name="rtx3090-pcie4", pcie_bandwidth=25 * GB, copy_latency=9e-6, hbm_bandwidth=780 * GB,
                        peak_flops=60e12, launch_overhead=6e-6, pageable_bandwidth=10 * GB,
                        cpu_mem_bandwidth=40 * GB, cpu_flops=0.6e12, device_memory=24 * GB,
                        notes="RTX 3090 24GB: 936 GB/s GDDR6X, 142 TFLOPS fp16 tensor (sparse), PCIe 4.0 x16"),
        HardwareProfile(name="rtx4090-pcie4", pcie_bandwidth=25 * GB, copy_latency=8e-6, hbm_bandwidth=850 * GB,
                        peak_flops=80e12, launch_overhead=5e-6, pageable_bandwidth=10 * GB,
                        cpu_mem_bandwidth=60 * GB, cpu_flops=1.0e12, device_memory=24 * GB, hbm_datasheet=1008 * GB,
                        notes="RTX 4090 24GB: 1008 GB/s GDDR6X, 165 TFLOPS fp16 tensor (fp32 acc.), PCIe 4.0 x16"),
        HardwareProfile(name="a100-40g-pcie4", pcie_bandwidth=25 * GB, copy_latency=9e-6, hbm_bandwidth=1300 * GB,
                        peak_flops=150e12, launch_overhead=6e-6, pageable_bandwidth=10 * GB,
                        cpu_mem_bandwidth=80 * GB, cpu_flops=1.2e12, device_memory=40 * GB,
                        notes="A100 40GB PCIe: 1555 GB/s HBM2, 312 TFLOPS fp16 tensor, PCIe 4.0 x16"),
        HardwareProfile(name="h100-pcie5", pcie_bandwidth=50 * GB, copy_latency=8e-6, hbm_bandwidth=1700 * GB,
                        peak_flops=350e12, launch_overhead=5e-6, pageable_bandwidth=14 * GB,
                        cpu_mem_bandwidth=100 * GB, cpu_flops=2.0e12, device_memory=80 * GB,
                        notes="H100 PCIe 80GB: 2.0 TB/s HBM2e, 756 TFLOPS fp16 tensor, PCIe 5.0 x16"),
        HardwareProfile(name="h200-pcie5", pcie_bandwidth=50 * GB, copy_latency=8e-6, hbm_bandwidth=4000 * GB,
                        peak_flops=400e12, launch_overhead=5e-6, pageable_bandwidth=14 * GB,
                        cpu_mem_bandwidth=100 * GB, cpu_flops=2.0e12, device_memory=141 * GB,
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


def get_host(host: "str | HostCPU | float | None", arg: str = "host") -> HostCPU | None:
    """Resolve ``host=``: None (not given), a HostCPU, a name in HOSTS (a unique prefix such as ``"i9-10900x"`` is
    enough), a memory description (``"ddr5-5600x2"``), a measured GB/s or ``"calibrated"``
    (:func:`specter_lab.pricing.hosts.parse_host`)."""
    return parse_host(host, arg)


def with_host_cpu(profile: HardwareProfile, host: HostCPU) -> HardwareProfile:
    """``profile`` with ``host``'s DRAM and FLOP/s as its host fields, named ``<profile>+<host>`` so every output
    says which host priced the host lane."""
    return replace(profile, name=f"{profile.name}+{host.name}", cpu_mem_bandwidth=host.dram_delivered,
                   cpu_flops=host.flops, notes=f"{profile.notes}; host {host.cpu}, {host.dram} ({host.source})")


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
    built = catalog_profile(hardware)  # a catalog card by its profile name ("rtx3060-12gb-pcie4")
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


# ------------------------------------------------------------------ the GPU catalog as profiles
# Unified memory (Apple): one memory for the GPU and the CPU, no link between them. What the GPU can hold is the
# memory less what macOS and the apps keep: max(4 GiB, 15 %) here (Metal's recommendedMaxWorkingSetSize is lower,
# 2/3-3/4, but llama.cpp allocates past it: a 24 GB M4 Pro runs Qwen3-30B-A3B Q4_K_M whole, AlexsJones/llmfit#812;
# the iogpu.wired_limit_mb sysctl raises it). The CPU cores reach about half the chip's bandwidth. Both assumptions,
# said where they are used.
UNIFIED_OS_RESERVE = (4 * 2**30, 0.15)
UNIFIED_HOST_SHARE = 0.5


def unified_gpu_bytes(total: float) -> float:
    """What a unified-memory chip's GPU can hold of ``total`` bytes (module constants: an assumption)."""
    return total - max(UNIFIED_OS_RESERVE[0], UNIFIED_OS_RESERVE[1] * total)


def gpu_profile(card: GPU) -> HardwareProfile:
    """The cost model's profile of ``card``: its hand-set profile when one exists (the published rows' GPUs),
    else built from the datasheet (effective link = raw PCIe x LINK_EFFICIENCY; effective VRAM = 0.8 x datasheet;
    peak_flops = the FP32 shader rate, halved without tensor cores: an assumption that only prefill reads). A
    unified-memory chip has no link: a "copy" is a copy inside its one memory, and ``device_memory`` is what its GPU
    can hold (:func:`unified_gpu_bytes`)."""
    if card.unified_memory:
        bw = card.bandwidth_gbs * GB
        return HardwareProfile(
            name=f"{card.key}-unified", pcie_bandwidth=bw / 2, copy_latency=5e-6, hbm_bandwidth=0.8 * bw,
            hbm_datasheet=bw, peak_flops=card.tflops * 1e12, launch_overhead=6e-6, pageable_bandwidth=bw / 2,
            cpu_mem_bandwidth=UNIFIED_HOST_SHARE * bw, cpu_flops=1.0e12,
            device_memory=unified_gpu_bytes(card.vram_gb * 2**30),
            notes=f"{card.name}: {card.memory} unified = {card.bandwidth_gbs:g} GB/s, no PCIe link; the GPU holds "
                  f"all but max(4 GiB, 15 %) of it ({card.source})")
    if card.profile:
        return replace(PROFILES[card.profile], hbm_datasheet=PROFILES[card.profile].hbm_datasheet
                       or card.bandwidth_gbs * GB)
    latency = {3: 10e-6, 4: 9e-6, 5: 8e-6}[card.pcie_gen]
    return HardwareProfile(
        name=f"{card.key}-pcie{card.pcie_gen}", pcie_bandwidth=card.link_raw * LINK_EFFICIENCY, copy_latency=latency,
        hbm_bandwidth=0.8 * card.bandwidth_gbs * GB, hbm_datasheet=card.bandwidth_gbs * GB,
        peak_flops=card.tflops * 1e12 * (1.0 if card.tensor_cores else 0.5), launch_overhead=6e-6,
        pageable_bandwidth=card.link_raw * 0.4, device_memory=card.vram_gb * 2**30,
        notes=f"{card.name}: {card.memory} = {card.bandwidth_gbs:g} GB/s, {card.pcie}, {card.tflops:g} TFLOPS FP32 "
              f"({card.source})")


def resolve_gpu(gpu: "str | HardwareProfile", vram: float | None = None) -> tuple[HardwareProfile, GPU | None]:
    """``gpu=`` as the estimator takes it: a HardwareProfile (as given), a profile name in PROFILES, or a catalog
    name; returns the profile and the catalog card (None for a profile given directly)."""
    if isinstance(gpu, HardwareProfile):
        return gpu, None
    if str(gpu) in PROFILES:
        return PROFILES[str(gpu)], next((c for c in CARDS.values() if c.profile == str(gpu)), None)
    built = catalog_profile(str(gpu))
    if built is not None:
        return built, CARDS[str(gpu).rsplit("-pcie", 1)[0].removesuffix("-unified")]
    card = find_gpu(gpu, vram)
    return gpu_profile(card), card


def catalog_profile(name: str) -> HardwareProfile | None:
    """The profile of a catalog card by its profile name (``"rtx3060-12gb-pcie4"``), so an emitted
    ``hardware=`` resolves; None when ``name`` is not one."""
    key, sep, gen = name.rpartition("-pcie")
    if sep and key in CARDS and gen == str(CARDS[key].pcie_gen):
        return gpu_profile(CARDS[key])
    key, sep, _ = name.rpartition("-unified")
    if sep and key in CARDS and CARDS[key].unified_memory:
        return gpu_profile(CARDS[key])
    return None
