"""What the draft is made of, and what it costs on the device.

The draft is always the target model itself (attention, routers, shared experts, norms, embeddings and head are
the target's own tensors); only where its *routed experts* come from differs:

=============  ===================================================================  =========================
variant        routed experts of the draft                                           device bytes
=============  ===================================================================  =========================
``quantized``  low-bit copies of every routed expert, resident (the paper)           all experts × packed size
``resident``   the fp experts that happen to be resident; absent ones skipped        0
``hybrid``     resident fp, else a low-bit copy for ``hybrid_experts`` per layer      hybrid set × packed size
``host``       resident fp, else computed on the host CPU from the host copy          0
=============  ===================================================================  =========================

Every variant is lossless, because the target verifies; they differ in acceptance, routing recall, draft-step
time and how much of the budget is left for full-precision slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import get_args

from ..offload.schedule import DraftVariant
from .quant import QuantSpec

DRAFT_VARIANTS: tuple[str, ...] = get_args(DraftVariant)

__all__ = ["DraftSpec", "DRAFT_VARIANTS", "as_draft_spec", "draft_expert_bytes", "draft_device_experts"]


@dataclass(frozen=True)
class DraftSpec:
    """A draft: ``variant`` (see module doc), the low-bit format, and for ``hybrid`` how many low-bit experts
    per layer it keeps resident."""

    variant: DraftVariant = "quantized"
    quant: QuantSpec = field(default_factory=QuantSpec)
    hybrid_experts: int = 4

    def __post_init__(self) -> None:
        if self.variant not in DRAFT_VARIANTS:
            raise ValueError(f"draft variant {self.variant!r} is unknown; use one of {DRAFT_VARIANTS} "
                             "(or pass a sl.QuantSpec for the paper's quantized draft).")
        if not isinstance(self.quant, QuantSpec):
            raise TypeError(f"DraftSpec(quant={self.quant!r}): pass a sl.QuantSpec")
        if isinstance(self.hybrid_experts, bool) or not isinstance(self.hybrid_experts, int) or self.hybrid_experts < 0:
            raise ValueError(f"DraftSpec(hybrid_experts={self.hybrid_experts!r}) must be an integer >= 0.")

    @property
    def uses_lowbit(self) -> bool:
        return self.variant in ("quantized", "hybrid")

    @property
    def hybrid(self) -> bool:
        """Low-bit copies for a few experts per layer, chosen after the prefill."""
        return self.variant == "hybrid"

    @property
    def recordable(self) -> bool:
        """Its routing does not depend on what the cache holds, so ``sl.record`` can write its chains once and a
        replay of any strategy can play them (only the paper's quantized draft)."""
        return self.variant == "quantized"

    @property
    def label(self) -> str:
        if self.variant == "quantized":
            return self.quant.label
        if self.variant == "hybrid":
            return f"hybrid({self.hybrid_experts}×{self.quant.label})"
        return self.variant


def as_draft_spec(draft) -> DraftSpec:
    """``None`` → the paper's int4 draft; a QuantSpec → quantized with it; a variant name; or a DraftSpec."""
    if draft is None:
        return DraftSpec()
    if isinstance(draft, DraftSpec):
        return draft
    if isinstance(draft, QuantSpec):
        return DraftSpec("quantized", draft)
    if isinstance(draft, str):
        return DraftSpec(draft)
    raise TypeError(f"draft={draft!r}: pass a sl.QuantSpec, a variant name {DRAFT_VARIANTS}, or a sl.DraftSpec.")


def draft_expert_bytes(info, spec: QuantSpec, cost_shape, expert_params: int) -> float:
    """Packed bytes of one draft expert, priced like the fp ones: at the cost shape's dimensions when projected
    (so a tiny model's group padding is not carried over to a real model's experts), else from the model's own
    tensor shapes (``expert_params``: params of one fp expert in the cost model)."""
    if cost_shape is None:
        return _draft_ratio(info, spec) * 2 * expert_params
    inter = cost_shape.expert_params // (3 * cost_shape.hidden)
    # gate/up rows run along hidden, down rows along the expert's intermediate width
    return spec.packed_bytes(2 * inter * cost_shape.hidden, cost_shape.hidden) + spec.packed_bytes(
        cost_shape.hidden * inter, inter)


def draft_device_experts(info, cfg: DraftSpec) -> int:
    """How many low-bit experts the draft keeps on the device (0 for variants without low-bit copies)."""
    if not cfg.uses_lowbit:
        return 0
    if cfg.variant == "hybrid":
        return sum(min(cfg.hybrid_experts, l.num_experts) for l in info.layers)
    return sum(l.num_experts for l in info.layers)


def _draft_ratio(info, spec: QuantSpec) -> float:
    """Packed draft bytes per fp16 byte of routed-expert weights, computed from shapes (no quantization)."""
    packed = numel = 0
    for layer in info.layers:
        for name in layer.param_names:
            t = getattr(layer.experts, name)
            if name.endswith("_bias"):
                packed += t.numel() * 2
            else:
                # groups run along the input axis, which is dim 1 of a transposed [E, in, out] layout
                in_dim = t.shape[1] if getattr(layer.experts, "is_transposed", False) else t.shape[-1]
                packed += spec.packed_bytes(t.numel(), in_dim)
                numel += t.numel()
    return packed / (2 * numel)
