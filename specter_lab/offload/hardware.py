"""Hardware profiles, real-model cost shapes, and the cost model that prices every op for the SimClock.

A profile is a handful of effective numbers (not datasheet peaks): how fast the host→device link really moves
pinned memory, what one copy costs to start, how fast kernels stream weights from device memory, and what a
kernel launch costs. The simulated clock turns these into time; only the CUDA clock measures time.

Cost of a compute op = launch_overhead · kernels + max(flops / peak_flops, bytes_read / hbm_bandwidth).
Cost of a copy      = copy_latency + bytes / pcie_bandwidth.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

GB = 1e9

__all__ = [
    "HardwareProfile",
    "PROFILES",
    "CostShape",
    "COST_SHAPES",
    "CostModel",
    "get_profile",
    "calibrate",
]


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

    def __post_init__(self) -> None:
        for f in ("pcie_bandwidth", "hbm_bandwidth", "peak_flops", "cpu_mem_bandwidth", "cpu_flops"):
            if not getattr(self, f) > 0:
                raise ValueError(f"HardwareProfile.{f} must be > 0, got {getattr(self, f)!r}")
        if self.copy_latency < 0 or self.launch_overhead < 0:
            raise ValueError("HardwareProfile latencies must be >= 0")

    @property
    def clock_label(self) -> str:
        return f"cuda:{self.name}" if self.measured else f"simulated:{self.name}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "HardwareProfile":
        return cls(**json.loads(text))


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


def _profile_dir() -> Path:
    return Path(os.environ.get("SPECTER_LAB_PROFILES", Path.home() / ".cache" / "specter_lab" / "profiles"))


def get_profile(hardware: "str | HardwareProfile | None") -> HardwareProfile | None:
    """Resolve ``hardware=``: a profile, a preset name, a saved calibrated profile name or JSON path.

    Returns None for ``"cuda"`` (the caller then uses the CUDA clock).
    """
    if hardware is None:
        return PROFILES[DEFAULT_PROFILE]
    if isinstance(hardware, HardwareProfile):
        return hardware
    if not isinstance(hardware, str):
        raise TypeError(f"hardware= must be a profile name or HardwareProfile, got {type(hardware).__name__}")
    if hardware == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "hardware='cuda' needs a CUDA GPU, and torch.cuda.is_available() is False here. "
                f"Use a simulated profile instead, one of {sorted(PROFILES)}."
            )
        return None
    if hardware in PROFILES:
        return PROFILES[hardware]
    for candidate in (Path(hardware), _profile_dir() / f"{hardware}.json"):
        if candidate.suffix == ".json" and candidate.is_file():
            return HardwareProfile.from_json(candidate.read_text())
    saved = sorted(p.stem for p in _profile_dir().glob("*.json")) if _profile_dir().is_dir() else []
    raise ValueError(
        f"hardware={hardware!r} is not a known profile. Use one of {sorted(PROFILES)}, 'cuda'"
        + (f", a calibrated profile {saved}" if saved else "")
        + ", a path to a profile .json, or a HardwareProfile(...)."
    )


@dataclass(frozen=True)
class CostShape:
    """Per-layer dimensions of a real MoE model, from its public config.json, used to price a tiny model's run
    as if its layers had these sizes (routing still comes from the model actually run: a *projection*)."""

    name: str
    hidden: int
    expert_params: int  # one routed expert: gate+up+down
    dense_params: int  # per MoE layer, excluding routed experts: attention, router, shared experts, norms
    vocab: int
    kv_bytes_per_token_per_layer: int  # KV cache bytes read per context token per layer (fp16)
    num_experts: int
    top_k: int
    num_layers: int


def _shape(name, hidden, moe_inter, n_experts, top_k, layers, attn_params, shared_inter, vocab, kv_dim):
    return CostShape(
        name=name,
        hidden=hidden,
        expert_params=3 * hidden * moe_inter,
        dense_params=attn_params + 3 * hidden * shared_inter + n_experts * hidden + 2 * hidden,
        vocab=vocab,
        kv_bytes_per_token_per_layer=2 * kv_dim * 2,
        num_experts=n_experts,
        top_k=top_k,
        num_layers=layers,
    )


# One table, from each model's public config.json (hidden_size, moe/intermediate size, experts, top-k, layers,
# attention projections, shared-expert width, vocabulary, KV width).
COST_SHAPES: dict[str, CostShape] = {
    s.name: s
    for s in [
        # Mixtral-8x7B: H 4096, I 14336, 8 experts top-2, 32 layers, 32 q / 8 kv heads × 128, vocab 32000
        _shape("mixtral-8x7b", 4096, 14336, 8, 2, 32, 2 * 4096 * 4096 + 2 * 4096 * 1024, 0, 32000, 1024),
        # DeepSeek-V2-Lite: H 2048, moe I 1408, 64 experts top-6, 2 shared (2816), 27 layers, MLA (kv_lora 512 +
        # rope 64 cached), vocab 102400. Attention: q 2048·16·192, kv_a 2048·576, kv_b 512·16·256, o 2048·2048.
        _shape("deepseek-v2-lite", 2048, 1408, 64, 6, 27,
               2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048, 2816, 102400, 288),
        # Qwen1.5-MoE-A2.7B: H 2048, moe I 1408, 60 experts top-4, shared 5632, 24 layers, 16 heads, vocab 151936
        _shape("qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, 24, 4 * 2048 * 2048, 5632, 151936, 2048),
        # Phi-3.5-MoE: H 4096, I 6400, 16 experts top-2, 32 layers, 32 q / 8 kv heads, vocab 32064
        _shape("phi-3.5-moe", 4096, 6400, 16, 2, 32, 2 * 4096 * 4096 + 2 * 4096 * 1024, 0, 32064, 1024),
        # OLMoE-1B-7B: H 2048, I 1024, 64 experts top-8, 16 layers, 16 heads, vocab 50304
        _shape("olmoe-1b-7b", 2048, 1024, 64, 8, 16, 4 * 2048 * 2048, 0, 50304, 2048),
        # Qwen3-30B-A3B: H 2048, moe I 768, 128 experts top-8, 48 layers, 32 q / 4 kv heads × 128, vocab 151936
        _shape("qwen3-30b-a3b", 2048, 768, 128, 8, 48, 2048 * 4096 * 2 + 2 * 2048 * 512, 0, 151936, 512),
    ]
}


def get_cost_shape(cost_shape: "str | CostShape | None") -> CostShape | None:
    if cost_shape is None or isinstance(cost_shape, CostShape):
        return cost_shape
    if cost_shape not in COST_SHAPES:
        raise ValueError(f"cost_shape={cost_shape!r} is unknown. Use None (price the model as it is) or one of "
                         f"{sorted(COST_SHAPES)}.")
    return COST_SHAPES[cost_shape]


@dataclass
class CostModel:
    """Prices the ops of one model on one profile. Bytes are priced at ``weight_bytes`` per parameter (the
    deployment dtype, bf16/fp16 by default) even when the CPU run computes in float32, so budgets and copies
    mean what they would on a GPU."""

    profile: HardwareProfile
    expert_params: int
    dense_params: int  # per MoE layer, everything but routed experts
    head_params: int
    kv_bytes_per_token_per_layer: int
    hidden: int
    weight_bytes: float = 2.0
    shape_name: str | None = None  # set when projected through a CostShape
    extra_dense_params: int = 0  # params of dense (non-MoE) layers, priced once per forward
    # Projection: the run's L MoE layers stand for L layers of the real model, so the per-model parts (LM head,
    # embeddings) are charged pro rata, L / real layers. Without it a 4-layer tiny model would pay a 27-layer
    # model's whole LM head every token and every draft step, overstating the draft's cost ~6x at that scale.
    head_scale: float = 1.0

    @property
    def projected(self) -> bool:
        return self.shape_name is not None

    @property
    def expert_bytes(self) -> int:
        return int(self.expert_params * self.weight_bytes)

    def _op(self, flops: float, nbytes: float, kernels: int) -> float:
        p = self.profile
        return p.launch_overhead * kernels + max(flops / p.peak_flops, nbytes / p.hbm_bandwidth)

    def copy_time(self, nbytes: float) -> float:
        return self.profile.copy_latency + nbytes / self.profile.pcie_bandwidth

    def expert_time(self, n_tokens: int, weight_bytes: float | None = None, kernels: int = 4) -> float:
        """One routed expert over n tokens; ``weight_bytes`` = bytes streamed (packed size for a quantized one)."""
        nbytes = self.expert_bytes if weight_bytes is None else weight_bytes
        return self._op(2.0 * self.expert_params * n_tokens, nbytes + 4 * self.hidden * n_tokens, kernels)

    def host_expert_time(self, n_tokens: int) -> float:
        """One fp expert computed on the host CPU (``host`` draft): weights streamed from DRAM at fp32 width
        (host copies are kept at compute precision there), plus moving the activations both ways."""
        p = self.profile
        nbytes = self.expert_params * 4
        t = max(2.0 * self.expert_params * n_tokens / p.cpu_flops, nbytes / p.cpu_mem_bandwidth)
        return t + 2 * p.copy_latency

    def dense_layer_time(self, n_tokens: int, context: int) -> float:
        """Attention + norms + router + shared experts of one MoE layer over n tokens with ``context`` cached."""
        flops = 2.0 * self.dense_params * n_tokens + 4.0 * n_tokens * context * self.hidden
        nbytes = self.dense_params * self.weight_bytes + context * self.kv_bytes_per_token_per_layer
        return self._op(flops, nbytes, kernels=12)

    def head_time(self, n_tokens: int) -> float:
        """LM head (+ final norm and any dense layers) for n tokens."""
        params = (self.head_params + self.extra_dense_params) * self.head_scale
        return self._op(2.0 * params * n_tokens, params * self.weight_bytes, kernels=3)

    def with_profile(self, profile: HardwareProfile) -> "CostModel":
        return replace(self, profile=profile)


def build_cost_model(info, profile: HardwareProfile, cost_shape: "str | CostShape | None" = None,
                     weight_bytes: float = 2.0) -> CostModel:
    """A CostModel for a loaded model (``info`` is a :class:`specter_lab.model.MoEModelInfo`)."""
    shape = get_cost_shape(cost_shape)
    if shape is None:
        return CostModel(profile, info.expert_params, info.dense_params_per_layer, info.head_params,
                         int(info.kv_dim * 2 * weight_bytes), info.hidden, weight_bytes,
                         extra_dense_params=info.dense_layer_params)
    return CostModel(profile, shape.expert_params, shape.dense_params, shape.vocab * shape.hidden,
                     shape.kv_bytes_per_token_per_layer, shape.hidden, weight_bytes, shape_name=shape.name,
                     head_scale=min(1.0, info.num_layers / shape.num_layers))


def calibrate(name: str = "calibrated", save: bool = True, sizes_mb: tuple[int, ...] = (4, 16, 64),
              repeats: int = 20) -> HardwareProfile:
    """Measure this machine's profile on CUDA: pinned and pageable H2D bandwidth, per-copy latency, weight
    streaming bandwidth and matmul throughput. Saves it so ``hardware=name`` finds it later."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("calibrate() measures a real GPU and needs CUDA; torch.cuda.is_available() is False. "
                           f"Use a simulated profile instead: {sorted(PROFILES)}.")
    dev = torch.device("cuda")

    def timed(fn, n=repeats) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / n

    def h2d(pinned: bool) -> float:
        bws = []
        for mb in sizes_mb:
            src = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=pinned)
            dst = torch.empty(mb << 20, dtype=torch.uint8, device=dev)
            bws.append((mb << 20) / timed(lambda: dst.copy_(src, non_blocking=True)))
        return max(bws)

    pinned_bw, pageable_bw = h2d(True), h2d(False)
    tiny_src = torch.empty(256, dtype=torch.uint8, pin_memory=True)
    tiny_dst = torch.empty(256, dtype=torch.uint8, device=dev)
    latency = timed(lambda: tiny_dst.copy_(tiny_src, non_blocking=True), n=200)
    big = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    big2 = torch.empty_like(big)
    hbm = 2 * big.numel() / timed(lambda: big2.copy_(big), n=10)  # read + write
    a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    flops = 2 * 4096**3 / timed(lambda: a @ b, n=10)
    x = torch.randn(1, 8, device=dev)
    launch = timed(lambda: x.add_(1.0), n=500)
    prof = HardwareProfile(name, pinned_bw, latency, hbm, flops, launch, pageable_bw,
                           device_memory=float(torch.cuda.get_device_properties(dev).total_memory),
                           measured=True, notes=f"calibrated on {torch.cuda.get_device_name(dev)}")
    if save:
        _profile_dir().mkdir(parents=True, exist_ok=True)
        (_profile_dir() / f"{name}.json").write_text(prof.to_json())
    return prof


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n}"


_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 1024, "mib": 1024**2, "gib": 1024**3,
          "tib": 1024**4}


def parse_bytes(text: str) -> int:
    """'2GiB' / '512 MB' / '1.5e9' → bytes. Raises ValueError naming the accepted forms."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS and unit != "":
        raise ValueError(f"expert_budget={text!r} is not a size. Use bytes as a number or a string like '2GiB', "
                         f"'512MiB', '1.5GB', or a fraction in (0, 1] of the routed-expert bytes.")
    value = float(m.group(1)) * (_UNITS[unit] if unit else 1)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"expert_budget={text!r} must be a positive size.")
    return int(value)
