"""How a GPU's VRAM splits before any expert is placed: dense weights, KV cache at the stated context, runtime
overhead; what is left is the routed experts' budget. A VRAM too small for the dense part is refused with what
would fit."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.geometry import ModelGeometry
from ..pricing.precision import FORMATS, WeightPrecision, get_precision

__all__ = ["VramBudget", "vram_budget", "RUNTIME_OVERHEAD"]

GiB = 2**30
# CUDA context + the engine's compute buffers at batch 1: llama.cpp reports ~0.3-0.5 GiB of CUDA compute buffers for
# 2-30B models at 4k context, and a CUDA context takes ~0.3 GiB. An assumption, stated in every estimate.
RUNTIME_OVERHEAD = 0.6 * GiB


@dataclass(frozen=True)
class VramBudget:
    """Bytes of one GPU's VRAM by use."""

    vram: float
    dense: float  # attention, router, shared experts, norms, dense layers, LM head (embeddings stay on the host)
    kv: float
    overhead: float
    experts_total: float  # every routed expert at the weights' format
    expert_bytes: float  # one routed expert

    @property
    def experts(self) -> float:
        """What is left for routed experts (never more than all of them)."""
        return max(0.0, min(self.experts_total, self.vram - self.dense - self.kv - self.overhead))

    @property
    def all_fit(self) -> bool:
        return self.vram - self.dense - self.kv - self.overhead >= self.experts_total

    @property
    def slots(self) -> int:
        return int(self.experts / self.expert_bytes + 1e-9)  # all experts when all fit, despite float rounding

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.2f} GiB"
        return (f"VRAM {g(self.vram)} = dense weights {g(self.dense)} + KV cache {g(self.kv)} + runtime overhead "
                f"{g(self.overhead)} + routed experts {g(self.experts)} of {g(self.experts_total)} "
                f"({self.experts / self.experts_total:.0%}, {self.slots} experts)")


def vram_budget(geom: ModelGeometry, prec: WeightPrecision, vram: float, context: int,
                overhead: float = RUNTIME_OVERHEAD) -> VramBudget:
    """The split of ``vram``; raises a ValueError naming ``vram`` (and what fits) when the dense part does not."""
    b = VramBudget(vram=vram, dense=geom.dense_params * prec.dense.bytes_per_weight, kv=geom.kv_bytes(context),
                   overhead=overhead, experts_total=geom.routed_params * prec.experts.bytes_per_weight,
                   expert_bytes=geom.expert_params * prec.experts.bytes_per_weight)
    if b.vram - b.dense - b.kv - b.overhead < b.expert_bytes * geom.top_k:
        raise ValueError(_too_small(geom, prec, b, context))
    return b


def _too_small(geom: ModelGeometry, prec: WeightPrecision, b: VramBudget, context: int) -> str:
    need = b.dense + b.kv + b.overhead + b.expert_bytes * geom.top_k
    fits = [f for f in ("q8_0", "q4_k_m", "q2_k")
            if geom.dense_params * FORMATS[f].bytes_per_weight + b.kv + b.overhead
            + geom.top_k * geom.expert_params * FORMATS[f].bytes_per_weight <= b.vram]
    hint = (f" With weights='{fits[0]}' the dense part would fit." if fits and fits[0] != prec.dense.name
            else " No GGUF width makes it fit: use a GPU with more memory, or a smaller context.")
    return (f"vram={b.vram / GiB:.2f} GiB is smaller than {geom.name}'s dense weights at {prec.dense.name} "
            f"({b.dense / GiB:.2f} GiB) + KV cache at context={context} ({b.kv / GiB:.2f} GiB) + runtime overhead "
            f"({b.overhead / GiB:.2f} GiB) + one token's experts: it needs at least {need / GiB:.2f} GiB.{hint}")


def precision_for(geom: ModelGeometry, weights) -> WeightPrecision:
    """``weights=``, or the checkpoint's own format when the config names one (gpt-oss: mxfp4), else bf16."""
    if weights is None and geom.checkpoint_format in FORMATS:
        return get_precision(geom.checkpoint_format)
    return get_precision(weights)
