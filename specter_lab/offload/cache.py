"""Eviction policies for the per-layer expert cache.

A policy only ranks; the :class:`~specter_lab.offload.store.ExpertStore` owns the slots. ``victim`` picks among
the slots the store says may be evicted (never one that is protected or about to be computed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Sequence

__all__ = ["EvictionPolicy", "LRU", "LFU", "ForecastEviction", "POLICIES", "make_policy"]


class EvictionPolicy:
    """Base: counts accesses on a logical clock so that ties break by recency."""

    name = "base"

    def __init__(self) -> None:
        self.tick = 0
        self.last_use: dict[tuple[int, int], int] = {}

    def touch(self, layer: int, expert: int) -> None:
        """The target (or a prefetch that counts as a use) touched (layer, expert)."""
        self.tick += 1
        self.last_use[(layer, expert)] = self.tick

    def loaded(self, layer: int, expert: int) -> None:
        self.touch(layer, expert)

    def score(self, layer: int, expert: int) -> tuple:
        """Smaller = evicted first."""
        return (self.last_use.get((layer, expert), -1),)

    def victim(self, layer: int, candidates: Sequence[tuple[int, int]]) -> int:
        """``candidates`` = [(slot, expert)]; returns the slot to evict."""
        return min(candidates, key=lambda se: self.score(layer, se[1]))[0]


class LRU(EvictionPolicy):
    """Least recently used (mixtral-offloading's per-layer cache)."""

    name = "lru"


class LFU(EvictionPolicy):
    """Least frequently used, recency as tie-break."""

    name = "lfu"

    def __init__(self) -> None:
        super().__init__()
        self.count: dict[tuple[int, int], int] = defaultdict(int)

    def touch(self, layer: int, expert: int) -> None:
        super().touch(layer, expert)
        self.count[(layer, expert)] += 1

    def loaded(self, layer: int, expert: int) -> None:
        EvictionPolicy.touch(self, layer, expert)  # a load is not a use: keep frequency honest

    def score(self, layer: int, expert: int) -> tuple:
        return (self.count.get((layer, expert), 0), self.last_use.get((layer, expert), -1))


class ForecastEviction(EvictionPolicy):
    """Belady with the draft's lookahead: evict the expert whose *forecast* next use is furthest away; experts
    the forecast does not mention come first (furthest = never), then recency decides.

    ``next_use(layer, expert)`` returns a number, smaller = needed sooner (e.g. the first draft step that routed
    to it, or minus its route count), or ``math.inf`` when the forecast does not mention it.
    """

    name = "forecast"

    def __init__(self, next_use: Callable[[int, int], float] | None = None) -> None:
        super().__init__()
        self.next_use = next_use or (lambda layer, expert: math.inf)

    def score(self, layer: int, expert: int) -> tuple:
        # Larger next use → evict first → more negative score.
        return (-self.next_use(layer, expert), self.last_use.get((layer, expert), -1))


POLICIES = {"lru": LRU, "lfu": LFU, "forecast": ForecastEviction}


def make_policy(name: str) -> EvictionPolicy:
    if name not in POLICIES:
        raise ValueError(f"eviction={name!r} is unknown; use one of {sorted(POLICIES)}.")
    return POLICIES[name]()
