"""How the device memory for routed experts is spent: the resident draft plus full-precision slots per layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BudgetTooSmall
from ..units import parse_budget

__all__ = ["BudgetSplit", "split_budget", "split_slots", "split_static"]


@dataclass
class BudgetSplit:
    """The resident draft's bytes plus full-precision slots per layer, out of ``budget_bytes``."""

    budget_bytes: int
    draft_bytes: int
    slots_per_layer: list[int]
    expert_bytes: int

    @property
    def slot_bytes(self) -> int:
        return sum(self.slots_per_layer) * self.expert_bytes

    @property
    def device_bytes(self) -> int:
        return self.draft_bytes + self.slot_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "draft_bytes": self.draft_bytes, "slot_bytes": self.slot_bytes,
                "device_bytes": self.device_bytes, "slots_per_layer": int(min(self.slots_per_layer)),
                "expert_bytes": self.expert_bytes}


def split_slots(info, cache_slots, draft_bytes: int, expert_bytes: int, strategy: str) -> BudgetSplit:
    """``cache_slots`` full-precision slots per layer (capped at each layer's experts), the draft on top."""
    if isinstance(cache_slots, bool) or not isinstance(cache_slots, int) or cache_slots < 1:
        raise ValueError(f"cache_slots={cache_slots!r}: strategy {strategy!r} needs at least "
                         f"1 full-precision slot per layer; pass an integer >= 1.")
    slots = [min(cache_slots, l.num_experts) for l in info.layers]
    return BudgetSplit(draft_bytes + sum(slots) * expert_bytes, draft_bytes, slots, expert_bytes)


def split_budget(info, expert_budget, draft_bytes: int, expert_bytes: int, strategy: str) -> BudgetSplit:
    """Slots per layer that ``expert_budget`` leaves after the draft. Raises :class:`BudgetTooSmall` (naming the
    minimum) when not even one slot per layer fits."""
    full = expert_bytes * sum(l.num_experts for l in info.layers)
    budget = parse_budget(0.5 if expert_budget is None else expert_budget).resolve(full)
    n_layers = info.num_layers
    per_layer = (budget - draft_bytes) // (n_layers * expert_bytes) if budget > draft_bytes else 0
    if per_layer < 1:
        need = draft_bytes + n_layers * expert_bytes
        raise BudgetTooSmall(
            f"expert_budget={expert_budget!r} ({budget:,} B) is too small for strategy {strategy!r}: "
            f"it needs the draft ({draft_bytes:,} B) plus 1 full-precision slot per layer "
            f"({n_layers} × {expert_bytes:,} B), i.e. at least {need:,} B = {need / full:.3f} of the routed-expert "
            "bytes.", need, need / full)
    slots = [min(int(per_layer), l.num_experts) for l in info.layers]
    return BudgetSplit(budget, draft_bytes, slots, expert_bytes)


def split_static(info, expert_budget, expert_bytes: int, strategy: str,
                 host_layers: "list[int] | None" = None) -> BudgetSplit:
    """llama.cpp's ``--n-cpu-moe N`` at equal memory: whole layers' experts on the device, from the last layer
    back, as many as the budget holds; the first N layers keep every expert on the host (0 slots). What is left
    of the budget below one whole layer stays unused, as it does there. ``host_layers``: the layers on the host
    given (llama.cpp's ``-ot`` / ``--n-cpu-moe`` as typed), the others on the device; refused with the numbers
    (:class:`BudgetTooSmall`) when those do not fit the budget."""
    full = expert_bytes * sum(l.num_experts for l in info.layers)
    budget = parse_budget(0.5 if expert_budget is None else expert_budget).resolve(full)
    if host_layers is not None:
        on_host = set(host_layers)
        slots = [0 if i in on_host else l.num_experts for i, l in enumerate(info.layers)]
        need = sum(slots) * expert_bytes
        if need > budget:
            raise BudgetTooSmall(
                f"host_layers={sorted(on_host)}: the other {sum(1 for s in slots if s)} layers' experts take "
                f"{need:,} B on the device, more than expert_budget={expert_budget!r} ({budget:,} B) for strategy "
                f"{strategy!r}: keep more layers on the host.", need, need / full)
        return BudgetSplit(budget, 0, slots, expert_bytes)
    slots, left = [0] * info.num_layers, budget
    for i in reversed(range(info.num_layers)):
        need = info.layers[i].num_experts * expert_bytes
        if need > left:
            break
        slots[i], left = info.layers[i].num_experts, left - need
    return BudgetSplit(budget, 0, slots, expert_bytes)
