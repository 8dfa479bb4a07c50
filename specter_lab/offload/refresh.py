"""Refresh: when the copy link has nothing to do after a layer, copy in the expert that layer's recent tokens used
most and the device does not hold, in place of the eviction policy's victim, if it is used clearly more often.

Why: a split row (``miss="balance"``) computes most misses on the host, and a host-computed expert never enters the
device cache. So the cache changes only when a copy pays *now*, and it keeps what the prompt left long after the
decode's popular experts have moved on. The bound's analysis (``sl.bound_gap``'s *initial set* share, 5–53 % of
the distance in ``docs/measured/closer_to_bound.md``'s compiled cells) prices what a better-chosen resident set is
worth. An idle link is free: MoE-Infinity's activation-aware prefetch fills it by the sequence's own activation
counts; here the counts are each layer's routings, device and host alike, decayed per forward.

The copy goes on the link only when the link is idle at the layer's end (a copy issued later queues behind it,
so it may delay the next layer's demand copies by one copy at most); it is counted as a prefetch (it serves a later
token or is wasted) and evicts through the store's own policy, never an expert this layer asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from .hostexec import use_rates

__all__ = ["Refresh"]


@dataclass
class Refresh:
    """Per layer, each expert's recent routings per forward (an exponential moving average, every routing counted
    whether the device or the host computed it), and the one copy worth making on an idle link."""

    num_experts: list[int]
    decay: float = 0.9  # weight of the past per forward: about the last ten count
    margin: float = 2.0  # copy only an expert used at least this many times as often as the victim
    rate: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rate = [np.zeros(e) for e in self.num_experts]

    def observe(self, layer: int, experts: Iterable[int]) -> None:
        """One decode forward's experts at ``layer`` (ids; -1: not recorded)."""
        self.rate[layer] = use_rates(self.rate[layer], np.fromiter(experts, dtype=np.int64), self.decay)

    def candidate(self, layer: int, resident: Iterable[int], victim: "int | None", full: bool) -> "int | None":
        """The non-resident expert to copy into ``layer`` now, or None: the most used one, if a slot is free
        (``full`` False) and it was used at all, or if it is used ``margin`` times as often as the policy's
        ``victim`` (None: nothing may be evicted)."""
        rate = self.rate[layer]
        out = np.ones(len(rate), dtype=bool)
        out[list(resident)] = False
        if not out.any():
            return None
        best = int(np.flatnonzero(out)[np.argmax(rate[out])])
        if rate[best] <= 0 or (full and (victim is None or rate[best] < self.margin * rate[victim])):
            return None
        return best
