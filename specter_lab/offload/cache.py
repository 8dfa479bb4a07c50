"""Eviction policies for the per-layer expert cache.

A policy only ranks; the :class:`~specter_lab.offload.store.ExpertStore` owns the slots. ``victim`` picks among
the slots the store says may be evicted (never one that is protected or about to be computed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

__all__ = ["EvictionPolicy", "LRU", "LFU", "DecayLFU", "ForecastEviction", "POLICIES", "make_policy"]


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


DEFAULT_DECAY = 0.98  # per use of the layer: see DecayLFU (routing/cachesim.py's DecayLFU reads it too)


class DecayLFU(EvictionPolicy):
    """Least frequently used with exponential decay ("frequency-aware" per-layer eviction: the field's best online
    policy on real decode traces, ``shared/research/field_2026b.md`` §0.1, §1.3).

    Exact semantics (one parameter, ``decay`` ∈ [0, 1]):

    * each layer has its own use clock ``u[layer]``, advanced by one at every *use* of any expert of that layer
      (:meth:`touch`: the target computed a resident expert, or a prefetch counted as a use); a copy landing
      (:meth:`loaded`) is not a use and advances nothing, as in :class:`LFU`;
    * an expert's score at layer clock ``u`` is ``Σ decay ** (u − u_i)`` over its past uses ``u_i`` (the use
      itself counts 1 at the moment it happens); kept lazily as (value, clock of the last update);
    * the victim is the candidate with the smallest score; a tie (equal floats) goes to the least recent use
      (the global use tick of :class:`EvictionPolicy`), and candidates never used (recency −1) tie last by slot
      order (the first candidate the store lists);
    * scores survive eviction (a returning expert keeps its decayed history, which is what lets frequency beat
      recency on routing with a hot set);
    * limits: ``decay=1`` ranks exactly as :class:`LFU` (plain counts, recency tie-break); ``decay=0`` keeps only
      the expert used at the current layer tick, so every other tie breaks by recency: :class:`LRU`.

    The default, 0.98 per use (≈ 0.89 per forward at top-6, a half-life of about six forwards), was the best of
    {0.9, 0.95, 0.98, 0.99, 1} on the less-local routings of ``docs/measured/closer_to_bound.md`` (replayed hit
    rate +2.5 points over LRU; 0.9 is within a point of LRU, 1.0 within a point of 0.98): chosen on the routing it
    is measured on, so read its gain there as an upper estimate.

    Only uses of resident experts are seen (a miss computed on the host never touches the store), so with host
    execution the score counts device uses. Per-layer clocks make the scores of different layers comparable in a
    global pool (every layer sees about top-k uses per forward)."""

    name = "lfu_decay"

    def __init__(self, decay: float = DEFAULT_DECAY) -> None:
        super().__init__()
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise ValueError(f"DecayLFU(decay={decay!r}): use a number in [0, 1] (1 = plain LFU, 0 = LRU).")
        self.decay = float(decay)
        self.uses: dict[int, int] = defaultdict(int)  # layer → its use clock
        self.value: dict[tuple[int, int], tuple[float, int]] = {}  # (layer, expert) → (score, clock at update)

    def touch(self, layer: int, expert: int) -> None:
        super().touch(layer, expert)
        self.uses[layer] += 1
        self.value[(layer, expert)] = (self.current(layer, expert) + 1.0, self.uses[layer])

    def loaded(self, layer: int, expert: int) -> None:
        EvictionPolicy.touch(self, layer, expert)  # recency only: a load is not a use

    def current(self, layer: int, expert: int) -> float:
        """The expert's decayed use count now."""
        v = self.value.get((layer, expert))
        if v is None:
            return 0.0
        age = self.uses[layer] - v[1]
        return v[0] if age == 0 else v[0] * self.decay ** age

    def score(self, layer: int, expert: int) -> tuple:
        return (self.current(layer, expert), self.last_use.get((layer, expert), -1))


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



POLICIES = {"lru": LRU, "lfu": LFU, "lfu_decay": DecayLFU, "forecast": ForecastEviction}


def make_policy(name: str, **options) -> EvictionPolicy:
    """A fresh policy by name; ``options`` go to its constructor (``make_policy("lfu_decay", decay=0.8)``)."""
    if name not in POLICIES:
        raise ValueError(f"eviction={name!r} is unknown; use one of {sorted(POLICIES)}.")
    return POLICIES[name](**options)
