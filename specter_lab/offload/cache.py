"""Eviction policies for the per-layer expert cache.

A policy only ranks; the :class:`~specter_lab.offload.store.ExpertStore` owns the slots. ``victim`` picks among
the slots the store says may be evicted (never one that is protected or about to be computed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

__all__ = ["EvictionPolicy", "LRU", "LFU", "ForecastEviction", "POLICIES", "make_policy"]


class EvictionPolicy:
    """Base: counts accesses on a logical clock so that ties break by recency."""

    name = "base"

    def __init__(self) -> None:
        self.tick = 0
        self.last_use: dict[tuple[int, int], int] = {}

    def follow(self, forecast) -> None:
        """The window forecast the policy may rank by (only :class:`ForecastEviction` uses it)."""

    def touch(self, layer: int, expert: int) -> None:
        """The target (or a prefetch that counts as a use) touched (layer, expert)."""
        self.tick += 1
        # re-inserted, so the dict's order is recency order (a global pool finds its LRU victim by walking it)
        self.last_use.pop((layer, expert), None)
        self.last_use[(layer, expert)] = self.tick

    def forget(self, layer: int, expert: int) -> None:
        """(layer, expert) left the cache: its recency no longer ranks anything (only residents are ranked), and
        dropping it keeps the recency walk of a global pool short. Counts (LFU) are kept."""
        self.last_use.pop((layer, expert), None)

    @property
    def by_recency(self) -> bool:
        """True when the score is recency alone: the least recent entry of ``last_use`` is the victim."""
        return type(self).score is EvictionPolicy.score

    def loaded(self, layer: int, expert: int) -> None:
        self.touch(layer, expert)

    def score(self, layer: int, expert: int) -> tuple:
        """Smaller = evicted first."""
        return (self.last_use.get((layer, expert), -1),)

    def victim(self, layer: int, candidates: Sequence[tuple[int, int]]) -> int:
        """``candidates`` = [(slot, expert)]; returns the slot to evict."""
        if self.by_recency:  # the same order as score()'s 1-tuples, without building them
            last = self.last_use
            return min(candidates, key=lambda se: last.get((layer, se[1]), -1))[0]
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

    The forecast is the current window's (:meth:`follow`, called by the decode loop at every window): anything
    with a ``next_use(layer, expert) -> float`` (smaller = needed sooner, ``math.inf`` = not forecast). Without
    one, this is LRU."""

    name = "forecast"

    def __init__(self) -> None:
        super().__init__()
        self.forecast = None

    def follow(self, forecast) -> None:
        self.forecast = forecast

    def score(self, layer: int, expert: int) -> tuple:
        nxt = self.forecast.next_use(layer, expert) if self.forecast is not None else math.inf
        # Larger next use → evict first → more negative score.
        return (-nxt, self.last_use.get((layer, expert), -1))



POLICIES = {"lru": LRU, "lfu": LFU, "forecast": ForecastEviction}


def make_policy(name: str) -> EvictionPolicy:
    if name not in POLICIES:
        raise ValueError(f"eviction={name!r} is unknown; use one of {sorted(POLICIES)}.")
    return POLICIES[name]()
