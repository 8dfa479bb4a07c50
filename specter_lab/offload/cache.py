"""Eviction policies for the per-layer expert cache.

A policy only ranks; the :class:`~specter_lab.offload.store.ExpertStore` owns the slots. ``victim`` picks among
the slots the store says may be evicted (never one that is protected or about to be computed).
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from typing import Hashable, Sequence

__all__ = ["EvictionPolicy", "LRU", "LFU", "DecayLFU", "ARC", "ArcLists", "ForecastEviction", "POLICIES",
           "make_policy", "victim_of"]


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


class ArcLists:
    """The bookkeeping of adaptive replacement (ARC: Megiddo & Modha, FAST 2003), per group of keys (a layer, or
    a global pool's layer): shared by the store's :class:`ARC` and the cache simulator's twin
    (``routing/cachesim.py``), so both evict alike.

    Per group: ``t1`` the residents used at most once since they entered, ``t2`` those used again (or that came
    back from a ghost list), each least recent first; ``b1`` / ``b2`` the ghosts (keys recently evicted from
    ``t1`` / ``t2``); ``p`` the target size of ``t1``. A key entering from ``b1`` means recency was too short:
    ``p`` grows by max(1, |b2| / |b1|); from ``b2`` frequency was: ``p`` shrinks by max(1, |b1| / |b2|); either
    way it enters ``t2``. The replacement takes the least recent of ``t1`` while |t1| > p, else of ``t2``.

    Adapted to a store whose slots are filled by copies and whose uses come after (:meth:`entered` then
    :meth:`used`): an entering key's first use is the reference that brought it in (it stays where it entered),
    a later use moves it to ``t2``. The cache size ``c`` (ghost lists are cut to it, |t1| + |b1| <= c, all four <=
    2c) is the most residents the group has held, so neither side needs to be told the slot count."""

    def __init__(self) -> None:
        self.t1: dict[Hashable, OrderedDict] = defaultdict(OrderedDict)
        self.t2: dict[Hashable, OrderedDict] = defaultdict(OrderedDict)
        self.b1: dict[Hashable, OrderedDict] = defaultdict(OrderedDict)
        self.b2: dict[Hashable, OrderedDict] = defaultdict(OrderedDict)
        self.p: dict[Hashable, float] = defaultdict(float)
        self.cap: dict[Hashable, int] = defaultdict(int)
        self.fresh: set = set()  # (group, key) entered and not used yet

    def entered(self, g, key) -> None:
        t1, t2, b1, b2 = self.t1[g], self.t2[g], self.b1[g], self.b2[g]
        if key in b1:  # recency would have kept it: give t1 more room
            self.p[g] = min(float(max(1, self.cap[g])), self.p[g] + max(1.0, len(b2) / len(b1)))
            del b1[key]
            t2[key] = None
        elif key in b2:  # frequency would have kept it: give t2 more room
            self.p[g] = max(0.0, self.p[g] - max(1.0, len(b1) / len(b2)))
            del b2[key]
            t2[key] = None
        elif key not in t1 and key not in t2:
            t1[key] = None
        self.cap[g] = max(self.cap[g], len(t1) + len(t2))
        self.fresh.add((g, key))

    def used(self, g, key) -> None:
        t1, t2 = self.t1[g], self.t2[g]
        if (g, key) in self.fresh:  # the use that brought it in: it stays in its list, most recent
            self.fresh.discard((g, key))
            for lst in (t1, t2):
                if key in lst:
                    lst.move_to_end(key)
        elif key in t1:
            del t1[key]
            t2[key] = None
        elif key in t2:
            t2.move_to_end(key)

    def left(self, g, key) -> None:
        self.fresh.discard((g, key))
        t1, t2, b1, b2, c = self.t1[g], self.t2[g], self.b1[g], self.b2[g], max(1, self.cap[g])
        if key in t1:
            del t1[key]
            b1[key] = None
        elif key in t2:
            del t2[key]
            b2[key] = None
        while b1 and len(t1) + len(b1) > c:
            b1.popitem(last=False)
        while b2 and len(b2) > c:
            b2.popitem(last=False)
        while b2 and len(t1) + len(t2) + len(b1) + len(b2) > 2 * c:
            b2.popitem(last=False)

    def rank(self, g, key) -> int:
        """0 if the replacement takes from ``key``'s list now (t1 while |t1| > p, else t2), else 1."""
        t1 = self.t1[g]
        from_t1 = len(t1) > self.p[g]
        return 0 if (key in t1) == from_t1 else 1


class ARC(EvictionPolicy):
    """Adaptive replacement (ARC, Megiddo & Modha 2003) per layer, the field's other frequency-aware online policy
    beside decayed LFU (``shared/research/field_2026b.md`` §0.1): it balances recency (``t1``) against repeated
    use (``t2``) and moves the balance by which ghost list a returning expert comes from (:class:`ArcLists`).
    Victim: the least recent candidate of the list ARC takes from now; if no candidate is in it, the least recent
    of the other. Its only state is the lists: no parameter to tune (decayed LFU's decay was)."""

    name = "arc"

    def __init__(self) -> None:
        super().__init__()
        self.lists = ArcLists()

    def loaded(self, layer: int, expert: int) -> None:
        super().touch(layer, expert)
        self.lists.entered(layer, expert)

    def touch(self, layer: int, expert: int) -> None:
        super().touch(layer, expert)
        self.lists.used(layer, expert)

    def forget(self, layer: int, expert: int) -> None:
        super().forget(layer, expert)
        self.lists.left(layer, expert)

    def score(self, layer: int, expert: int) -> tuple:
        return (self.lists.rank(layer, expert), self.last_use.get((layer, expert), -1))


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



POLICIES = {"lru": LRU, "lfu": LFU, "lfu_decay": DecayLFU, "arc": ARC, "forecast": ForecastEviction}


def victim_of(policy: EvictionPolicy, layer: int, experts: Sequence[int], protected) -> int | None:
    """The expert ``policy`` would evict from one layer's slots now (``experts``: each slot's expert, -1 empty),
    never one in ``protected`` (None: a free slot, or nothing evictable)."""
    cands = [(j, e) for j, e in enumerate(experts) if e not in protected]
    if -1 in experts or not cands:
        return None
    return experts[policy.victim(layer, cands)]


def make_policy(name: str, **options) -> EvictionPolicy:
    """A fresh policy by name; ``options`` go to its constructor (``make_policy("lfu_decay", decay=0.8)``)."""
    if name not in POLICIES:
        raise ValueError(f"eviction={name!r} is unknown; use one of {sorted(POLICIES)}.")
    return POLICIES[name](**options)
