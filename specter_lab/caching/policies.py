"""Eviction policies, written once: every cache of the package ranks its residents with these classes.

A policy ranks the residents of one pool of slots; it never owns the slots. Its owner tells it what happens
(:meth:`Policy.loaded` when a key enters, :meth:`Policy.touch` when it is used, :meth:`Policy.evicted` when it
leaves) and asks :meth:`Policy.victim` which resident to evict. The owners:

* the runtime's store (:class:`~specter_lab.offload.store.ExpertStore`: slots of tensors; a policy per layer, or
  one for a global pool), whose keys are ``(layer, expert)``;
* the cache simulator over routing ids (:func:`specter_lab.caching.simulate.simulate`: the estimate's and the
  locality tools' caches), same keys;
* the bound's timed pools (:mod:`specter_lab.analysis.bound`), whose keys are ``layer * stride + expert`` ints
  (``layer_of`` says how to find a key's layer).

A key's *layer* matters to two policies only: :class:`DecayLFU` ages scores by a per-layer use clock and
:class:`ARC` keeps its lists per layer, so both behave the same whether one object ranks one layer or a global
pool of every layer.

**Order.** Every policy keeps its residents in recency order (least recently loaded or used first). The victim is
the resident with the smallest :meth:`Policy.rank` among those not protected; equal ranks go to the least recent
(the walk is in recency order and ``min`` keeps the first). LRU has no rank beyond recency: its victim is the
first resident of the walk not protected.

**Adding a policy**: a subclass here (its ``rank``, and what it counts in ``touch`` / ``loaded``) and its name in
:data:`POLICIES`; the store, the simulator, the bound's online variants and the estimate take it by name (a
strategy uses it once its name is in ``run/strategies.py``'s ``Eviction``).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections import OrderedDict, defaultdict
from operator import itemgetter
from typing import Callable, Container, Hashable, Iterable, Mapping, Sequence

from .decay_order import TimelessOrder

__all__ = ["Policy", "LRU", "LFU", "DecayLFU", "ARC", "ArcLists", "ForecastBelady", "Belady", "Static", "NextUse",
           "POLICIES", "ONLINE", "DEFAULT_DECAY", "make_policy", "Key"]

Key = Hashable  # (layer, expert) in the store and the simulator; layer * stride + expert in the bound


class Policy:
    """Least recently used, and the base of every policy: residents in recency order, least recent first.

    ``capacity``: the pool's slots where the policy is the pool (the simulator, the bound); None where its owner
    counts slots (the store). ``next_use``: the routing's request times, for a clairvoyant policy (unused here).
    ``layer_of``: a key's layer (``key[0]`` for ``(layer, expert)`` keys)."""

    name = "lru"
    admits = True  # False: a miss never enters the pool (Static)
    online = True  # False: it reads the future (Belady); a live run cannot use it
    forecasting = False  # True: it ranks by the window's forecast (ForecastBelady); without one it is LRU

    def __init__(self, capacity: int | None = None, next_use: "NextUse | None" = None,
                 layer_of: Callable[[Key], Hashable] = itemgetter(0)) -> None:
        self.capacity = capacity
        self.layer_of = layer_of
        self.recency: OrderedDict[Key, None] = OrderedDict()
        self._by_recency = type(self).rank is Policy.rank  # by_recency, asked per victim

    # ------------------------------------------------------------------ the pool, where the policy is one
    def __contains__(self, key: Key) -> bool:
        return key in self.recency

    def __len__(self) -> int:
        return len(self.recency)

    @property
    def free(self) -> int:
        return (self.capacity or 0) - len(self.recency)

    # ------------------------------------------------------------------ what happens to a key
    def loaded(self, key: Key, now: int = 0) -> None:
        """``key`` entered the pool (a copy was issued into a slot): most recent now; not a use."""
        self.recency[key] = None
        self.recency.move_to_end(key)

    def touch(self, key: Key, now: int = 0) -> None:
        """``key`` (resident) was used: the target computed it, or a prefetch counted as a use."""
        self.recency.move_to_end(key)

    def touch_all(self, keys: Iterable[Key], now: int = 0) -> None:
        """:meth:`touch` of each of ``keys`` in turn (a layer's uses, one call: this runs for every layer)."""
        if type(self).touch is Policy.touch:  # recency alone: the move, without a call per key
            move = self.recency.move_to_end
            for k in keys:
                move(k)
        else:
            for k in keys:
                self.touch(k, now)

    def evicted(self, key: Key) -> None:
        """``key`` left the pool; counts a policy keeps across residencies (LFU) stay."""
        del self.recency[key]

    def follow(self, forecast) -> None:
        """The window's forecast, for a policy that ranks by it (:class:`ForecastBelady`); others ignore it."""

    # ------------------------------------------------------------------ ranking
    def rank(self, key: Key):
        """Smaller = evicted first (ties: the least recent). None for a policy ranked by recency alone."""
        return None

    @property
    def by_recency(self) -> bool:
        """True when the victim is simply the least recent allowed resident (LRU)."""
        return type(self).rank is Policy.rank

    def victim(self, protected: Container[Key] = (), now: int = 0,
               among: "Container[Key] | None" = None) -> Key | None:
        """The resident to evict: the smallest rank among residents not in ``protected`` (and in ``among`` when
        given: a store's per-layer choice in a global pool), the least recent first on ties; None when none may
        be evicted."""
        # plain loops, not a generator into min(): a miss asks for a victim, and this walks every resident
        if self._by_recency:
            for k in self.recency:
                if k not in protected and (among is None or k in among):
                    return k
            return None
        rank, best, best_rank = self.rank, None, None
        for k in self.recency:
            if k in protected or (among is not None and k not in among):
                continue
            r = rank(k)
            if best is None or r < best_rank:  # strictly: the first of equal ranks, the least recent, stays
                best, best_rank = k, r
        return best


LRU = Policy


class LFU(Policy):
    """Fewest uses first, then the least recent; counts survive eviction. A load is not a use."""

    name = "lfu"

    def __init__(self, capacity: int | None = None, next_use: "NextUse | None" = None,
                 layer_of: Callable[[Key], Hashable] = itemgetter(0)) -> None:
        super().__init__(capacity, next_use, layer_of)
        self.count: defaultdict[Key, float] = defaultdict(int)

    def touch(self, key: Key, now: int = 0) -> None:
        super().touch(key, now)
        self.count[key] += 1

    def rank(self, key: Key):
        return self.count.get(key, 0)


DEFAULT_DECAY = 0.98  # per use of the layer: see DecayLFU


class DecayLFU(Policy):
    """Least frequently used with exponential decay ("frequency-aware" per-layer eviction: the field's best online
    policy on real decode traces, ``shared/research/field_2026b.md`` §0.1, §1.3).

    Exact semantics (one parameter, ``decay`` ∈ [0, 1]):

    * each layer has its own use clock ``u[layer]``, advanced by one at every *use* of any expert of that layer
      (:meth:`touch`); a copy landing (:meth:`loaded`) is not a use and advances nothing, as in :class:`LFU`;
    * an expert's score at layer clock ``u`` is ``Σ decay ** (u − u_i)`` over its past uses ``u_i`` (the use
      itself counts 1 at the moment it happens); kept lazily as (value, clock of the last update);
    * the victim is the candidate with the smallest score; a tie (equal floats) goes to the least recent;
    * scores survive eviction (a returning expert keeps its decayed history, which is what lets frequency beat
      recency on routing with a hot set);
    * limits: ``decay=1`` ranks exactly as :class:`LFU`; ``decay=0`` keeps only the expert used at the current
      layer tick, so every other tie breaks by recency: :class:`LRU`.

    The default, 0.98 per use (≈ 0.89 per forward at top-6, a half-life of about six forwards), was the best of
    {0.9, 0.95, 0.98, 0.99, 1} on the less-local routings of ``docs/measured/closer_to_bound.md`` (replayed hit
    rate +2.5 points over LRU; 0.9 is within a point of LRU, 1.0 within a point of 0.98): chosen on the routing it
    is measured on, so read its gain there as an upper estimate.

    Only uses of resident experts are seen (a miss computed on the host never touches the store), so with host
    execution the score counts device uses. Per-layer clocks make the scores of different layers comparable in a
    global pool (every layer sees about top-k uses per forward)."""

    name = "lfu_decay"

    def __init__(self, capacity: int | None = None, next_use: "NextUse | None" = None,
                 layer_of: Callable[[Key], Hashable] = itemgetter(0), decay: float = DEFAULT_DECAY) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise ValueError(f"DecayLFU(decay={decay!r}): use a number in [0, 1] (1 = plain LFU, 0 = LRU).")
        super().__init__(capacity, next_use, layer_of)
        self.decay = float(decay)
        self.uses: defaultdict[Hashable, int] = defaultdict(int)  # layer → its use clock
        self.value: dict[Key, tuple[float, int]] = {}  # key → (score, clock at update)
        self._powers: dict[int, float] = {}  # age → decay ** age
        # the residents in an order that does not age, so a victim ranks a few keys, not all (decay_order.py)
        self.order = TimelessOrder(self.decay, layer_of)

    def loaded(self, key: Key, now: int = 0) -> None:
        super().loaded(key, now)
        self.order.put(key, self.value.get(key), self.layer_of(key))

    def touch(self, key: Key, now: int = 0) -> None:
        self.recency.move_to_end(key)  # Policy.touch
        layer = self.layer_of(key)
        u = self.uses[layer] = self.uses[layer] + 1  # the clock first, then the decayed value plus this use
        v = self.value.get(key)  # rank() inlined (a touch per expert computed): the same floats
        if v is None:
            r = 0.0
        else:
            p = self._powers.get(u - v[1])
            r = v[0] if u == v[1] else v[0] * (p if p is not None else self._power(u - v[1]))
        v = self.value[key] = (r + 1.0, u)
        self.order.put(key, v, layer)

    def evicted(self, key: Key) -> None:
        super().evicted(key)
        self.order.drop(key, self.layer_of(key))

    def _power(self, age: int) -> float:
        """``decay ** age``, each age computed once (the same float every time: a victim ranks every resident)."""
        p = self._powers.get(age)
        if p is None:
            p = self._powers[age] = self.decay ** age
        return p

    def rank(self, key: Key) -> float:
        """The key's decayed use count now."""
        v = self.value.get(key)
        if v is None:
            return 0.0
        age = self.uses[self.layer_of(key)] - v[1]
        return v[0] if age == 0 else v[0] * self._power(age)

    def victim(self, protected: Container[Key] = (), now: int = 0,
               among: "Container[Key] | None" = None) -> Key | None:
        """:meth:`Policy.victim`: ranked on the few residents :class:`TimelessOrder` leaves in question, else (where
        its argument does not hold) by the walk over every resident, :meth:`rank` inlined (the same floats, in the
        same order)."""
        if self.order.usable:
            key = self.order.victim(self.uses, self.rank, protected, among)
            if key is not NotImplemented:
                return key
        return self.walk(protected, among)

    def walk(self, protected: Container[Key] = (), among: "Container[Key] | None" = None) -> Key | None:
        """The victim by ranking every allowed resident (what :meth:`victim` answers, always)."""
        value, uses, layer_of, power = self.value, self.uses, self.layer_of, self._power
        best, best_rank = None, None
        for k in self.recency:
            if k in protected or (among is not None and k not in among):
                continue
            v = value.get(k)
            if v is None:
                r = 0.0
            else:
                age = uses[layer_of(k)] - v[1]
                r = v[0] if age == 0 else v[0] * power(age)
            if best is None or r < best_rank:
                best, best_rank = k, r
        return best


class ArcLists:
    """The bookkeeping of adaptive replacement (ARC: Megiddo & Modha, FAST 2003), per group of keys (a layer).

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


class ARC(Policy):
    """Adaptive replacement (ARC, Megiddo & Modha 2003) per layer, the field's other frequency-aware online policy
    beside decayed LFU (``shared/research/field_2026b.md`` §0.1): recency (``t1``) against repeated use
    (``t2``), the balance moved by which ghost list a returning key comes from (:class:`ArcLists`). Victim: the
    least recent allowed resident of the list ARC takes from now, else of the other. No parameter to tune."""

    name = "arc"

    def __init__(self, capacity: int | None = None, next_use: "NextUse | None" = None,
                 layer_of: Callable[[Key], Hashable] = itemgetter(0)) -> None:
        super().__init__(capacity, next_use, layer_of)
        self.lists = ArcLists()

    def loaded(self, key: Key, now: int = 0) -> None:
        super().loaded(key, now)
        self.lists.entered(self.layer_of(key), key)

    def touch(self, key: Key, now: int = 0) -> None:
        super().touch(key, now)
        self.lists.used(self.layer_of(key), key)

    def evicted(self, key: Key) -> None:
        super().evicted(key)
        self.lists.left(self.layer_of(key), key)

    def rank(self, key: Key) -> int:
        return self.lists.rank(self.layer_of(key), key)


class ForecastBelady(Policy):
    """Belady on a forecast: evict the resident whose *forecast* next use is furthest away; residents the forecast
    does not mention come first (never = furthest), then recency decides.

    The forecast is the current window's (:meth:`follow`, called by the decode loop at every window): anything with
    a ``next_use(layer, expert) -> float`` (smaller = needed sooner, ``math.inf`` = not forecast). Without one,
    this is LRU. Keys are ``(layer, expert)``."""

    name = "forecast"
    forecasting = True

    def __init__(self, capacity: int | None = None, next_use: "NextUse | None" = None,
                 layer_of: Callable[[Key], Hashable] = itemgetter(0)) -> None:
        super().__init__(capacity, next_use, layer_of)
        self.forecast = None

    def follow(self, forecast) -> None:
        self.forecast = forecast

    def rank(self, key: Key) -> float:
        # a larger next use is evicted first: the negated forecast
        return -self.forecast.next_use(*key) if self.forecast is not None else -math.inf

    def victim(self, protected: Container[Key] = (), now: int = 0,
               among: "Container[Key] | None" = None) -> Key | None:
        """:meth:`Policy.victim`, ended at the first allowed resident the forecast does not name: its rank (−inf) is
        the smallest there is, and the walk keeps the first of equal ranks, so it is the victim (the same key)."""
        forecast, best, best_rank = self.forecast, None, None
        for k in self.recency:
            if k in protected or (among is not None and k not in among):
                continue
            if forecast is None:
                return k
            r = -forecast.next_use(*k)
            if r == -math.inf:
                return k
            if best is None or r < best_rank:
                best, best_rank = k, r
        return best


class NextUse:
    """When each key is requested: ``uses[key]`` ascending request times (the truth :class:`Belady` reads)."""

    def __init__(self, uses: Mapping[Key, list[int]]) -> None:
        self.uses = uses

    @classmethod
    def of(cls, requests: Sequence[Sequence[Iterable[int]]]) -> "NextUse":
        """From ``requests[t][l]`` (expert ids, -1 none): keys ``(l, e)``, request time ``t * layers + l``."""
        uses: dict[Key, list[int]] = {}
        for t, step in enumerate(requests):
            L = len(step)
            for l, ids in enumerate(step):
                for e in ids:
                    if e >= 0:
                        u = uses.setdefault((l, e), [])
                        if not u or u[-1] != t * L + l:
                            u.append(t * L + l)
        return cls(uses)

    def after(self, key: Key, now: int) -> float:
        """The first request of ``key`` after ``now`` (inf: never again)."""
        u = self.uses.get(key, ())
        j = bisect_right(u, now)
        return u[j] if j < len(u) else math.inf

    def asked(self, key: Key, now: int) -> bool:
        u = self.uses.get(key, ())
        j = bisect_left(u, now)
        return j < len(u) and u[j] == now

    def next_use(self, layer: int, expert: int) -> float:
        """The forecast interface (:class:`ForecastBelady`) over the truth, from request time 0."""
        return self.after((layer, expert), -1)


class Belady(Policy):
    """Belady on the truth (MIN): the resident whose next request is furthest (``next_use``: the sequence's request
    times). A key requested at ``now`` ranks as needed now until it is touched, so it is never the victim while
    its request runs. Ties (``ties``): ``"recency"`` the least recently touched first, as :class:`ForecastBelady`
    ranks with a perfect forecast; ``"key"`` the smallest key (the bound's timed pool). A lazy heap of
    (−next use, tie, key, touch stamp): an entry is current while its stamp is the key's."""

    name = "belady"
    online = False

    def __init__(self, capacity: int | None = None, next_use: "NextUse | None" = None,
                 layer_of: Callable[[Key], Hashable] = itemgetter(0), ties: str = "recency") -> None:
        if next_use is None:
            raise ValueError("policy='belady' needs the routing's request times (a NextUse).")
        if ties not in ("recency", "key"):
            raise ValueError(f"ties={ties!r}: use 'recency' or 'key'.")
        super().__init__(capacity, next_use, layer_of)
        self.next_use = next_use
        self.by_key = ties == "key"
        self.nxt: dict[Key, float] = {}
        self.stamp: dict[Key, int] = {}
        self.clock = 0
        self.heap: list[tuple[float, int, Key, int]] = []

    def _rank(self, key: Key, nxt: float) -> None:
        self.clock += 1
        self.nxt[key], self.stamp[key] = nxt, self.clock
        heapq.heappush(self.heap, (-nxt, 0 if self.by_key else self.clock, key, self.clock))

    def loaded(self, key: Key, now: int = 0) -> None:
        super().loaded(key, now)
        self._rank(key, now if self.next_use.asked(key, now) else self.next_use.after(key, now))

    def touch(self, key: Key, now: int = 0) -> None:
        super().touch(key, now)
        self._rank(key, self.next_use.after(key, now))

    def evicted(self, key: Key) -> None:
        super().evicted(key)
        del self.nxt[key], self.stamp[key]

    def victim(self, protected: Container[Key] = (), now: int = 0,
               among: "Container[Key] | None" = None) -> Key | None:
        """The furthest next use, if it is after ``now`` (else every resident is needed now: None)."""
        heap = self.heap
        while heap:
            neg, _, key, stamp = heap[0]
            if self.stamp.get(key) != stamp:
                heapq.heappop(heap)
                continue
            return key if -neg > now else None
        return None


class Static(Policy):
    """A fixed resident set: nothing is evicted, and a miss is computed elsewhere, not cached."""

    name = "static"
    admits = False

    def victim(self, protected: Container[Key] = (), now: int = 0,
               among: "Container[Key] | None" = None) -> Key | None:
        return None


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (LRU, LFU, DecayLFU, ARC, ForecastBelady, Belady, Static)}
# What a live run can evict with (a strategy's ``eviction``): no future read, and a cache that admits
ONLINE: tuple[str, ...] = tuple(n for n, p in POLICIES.items() if p.online and p.admits)


def make_policy(name: str, capacity: int | None = None, next_use: "NextUse | None" = None, **options) -> Policy:
    """A fresh policy by name; ``options`` go to its constructor (``make_policy("lfu_decay", decay=0.8)``)."""
    if name not in POLICIES:
        raise ValueError(f"eviction={name!r} is unknown; use one of {sorted(POLICIES)}.")
    return POLICIES[name](capacity, next_use, **options)
