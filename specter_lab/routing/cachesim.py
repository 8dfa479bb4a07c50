"""One expert-cache simulator over a routing array: what a cache of n slots hits on a routing sequence, without
running the engine.

The runtime's cache is :class:`~specter_lab.offload.store.ExpertStore` with a policy of
:mod:`specter_lab.offload.cache`. Every tool that asks "what would a cache hit on this routing" asks here instead
of keeping its own loop: the estimator's placements (:mod:`specter_lab.estimate.replay`), the cache bounds
(:mod:`.cache_bounds`), synthetic routing's fit (:mod:`.synthetic`), the locality curve (:mod:`.locality`) and the
clairvoyant bound's eviction (:mod:`.bound`). ``tests/test_cachesim.py`` holds it to the store on the same routing
(same hits and misses, per layer, every eviction policy, per-layer and global pools).

**Shape** (mixtral-offloading's ``EvictionGroupInfo``): a pool is an ``OrderedDict`` of its resident keys
``(layer, expert)``, least recently touched first; a policy only ranks them. ``pool="layer"``: one pool per MoE
layer; ``pool="global"``: one pool over every layer (llama.cpp's ``--moe-cache-mib``, the store's ``global`` pool).

**Routing**: ``[steps, layers, width]`` expert ids, ``-1`` = no lookup. A step is one forward: a decode token, or a
prefill folded into one row per layer (the union of its experts, padded with -1). A request is one layer's ids
of one step; requests run step by step, layer by layer (the time of request (t, l) is ``t * layers + l``).

**Rules** for one request:

* ``rule="store"`` (default), the runtime's (:meth:`LayerSchedule._target`): the request's experts in ascending
  order; the resident ones are hits. Each miss is loaded into a free slot or over the policy's victim among the
  residents this request does not need; when every resident is needed, the miss is *deferred*. Then the hits
  and the loaded misses are used (touched) in that order, and each deferred miss streams through the slot of
  the victim among all residents (the runtime computes the layer's experts first), then is used.
* ``rule="moe-lrc"`` (moe-lrc's ``calc_lru``, arXiv 2505.16056, which the published locality curves count): the
  hits are the experts resident at the request's start; then each expert, in routed order, is used, a miss
  loaded over the policy's victim among *all* residents. For an LRU with ``width <= slots`` this ends in the
  same resident set as the store's rule; only the recency order among the request's own experts differs.

**Policies** (``policy=``):

* ``"lru"``: least recently used first (a load or a use touches).
* ``"lfu"``: fewest uses first; a use is a touch (a load is not a use, as in the store's ``LFU``), counts are
  kept after eviction. Ties: the least recently touched (load or use) first.
* ``"lfu_decay"``: the store's decayed LFU (:class:`DecayLFU`; ``functools.partial(DecayLFU, decay=...)`` for
  another decay than the store's default).
* ``"arc"``: the store's adaptive replacement (:class:`ARC`, the same lists).
* ``"belady"``: clairvoyant (MIN): the resident whose next request is furthest away (never = infinitely far);
  a resident requested now is never a victim. Ties: the least recently touched first (the store's ``forecast``
  eviction with a perfect forecast ranks so: the test holds them equal).
* ``"static"``: a fixed resident set (``initial=``); a miss is never cached (computed elsewhere: ``bypassed``).

A miss the ``admit`` callback refuses is computed elsewhere (the host) and not cached (``bypassed``).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable, Container, Hashable, Iterable, Mapping, Sequence

import numpy as np

from ..offload.cache import DEFAULT_DECAY, ArcLists

__all__ = ["simulate", "CacheStats", "NextUse", "Policy", "LRU", "LFU", "DecayLFU", "ARC", "Belady", "Static",
           "POLICIES", "lru_stack_positions", "stack_requests", "RULES"]

RULES = ("store", "moe-lrc")
Key = Hashable  # (layer, expert) here; the bound uses one int per (layer, expert)


# --------------------------------------------------------------------------------------------- policies

class Policy:
    """A pool of ``capacity`` slots: its residents in recency order (least recent first), ranked by LRU.
    Subclasses rank otherwise; the simulator calls ``loaded`` when a key enters, ``touch`` when it is used,
    ``evicted`` when it leaves, ``victim`` for the key to evict (None: none may be)."""

    name = "lru"
    admits = True  # False: a miss never enters the pool (static)

    def __init__(self, capacity: int, next_use: "NextUse | None" = None) -> None:
        self.capacity = capacity
        self.recency: OrderedDict[Key, None] = OrderedDict()

    def __contains__(self, key: Key) -> bool:
        return key in self.recency

    def __len__(self) -> int:
        return len(self.recency)

    @property
    def free(self) -> int:
        return self.capacity - len(self.recency)

    def loaded(self, key: Key, now: int) -> None:
        self.recency[key] = None
        self.recency.move_to_end(key)

    def touch(self, key: Key, now: int) -> None:
        self.recency.move_to_end(key)

    def evicted(self, key: Key) -> None:
        del self.recency[key]

    def victim(self, protected: Container[Key], now: int) -> Key | None:
        return next((k for k in self.recency if k not in protected), None)


LRU = Policy


class LFU(Policy):
    """Fewest uses first, then least recently touched (a load or a use); counts survive eviction (the store's
    ``offload.cache.LFU``). ``_bump`` is the one place a use is counted: a decay would be one argument here."""

    name = "lfu"

    def __init__(self, capacity: int, next_use: "NextUse | None" = None) -> None:
        super().__init__(capacity)
        self.count: defaultdict[Key, float] = defaultdict(int)

    def _bump(self, key: Key) -> None:
        self.count[key] += 1

    def touch(self, key: Key, now: int) -> None:
        super().touch(key, now)
        self._bump(key)

    def victim(self, protected: Container[Key], now: int) -> Key | None:
        # min() keeps the first of equal counts, and the walk is least recent first: the tie-break is recency
        return min((k for k in self.recency if k not in protected), key=self.count.__getitem__, default=None)


class DecayLFU(LFU):
    """LFU whose counts decay per use of their layer (the store's ``offload.cache.DecayLFU``, same floats): each
    layer has a use clock advanced at every use of one of its experts; a key's score is Σ ``decay`` ** (age) over
    its uses, kept lazily as (value, clock of the last update). Victim: the smallest score, ties to the least
    recently touched. Keys are ``(layer, expert)`` (the layer owns the clock; ``layer_of`` for other keys)."""

    name = "lfu_decay"

    def __init__(self, capacity: int, next_use: "NextUse | None" = None, decay: float = DEFAULT_DECAY,
                 layer_of: Callable[[Key], Hashable] = itemgetter(0)) -> None:
        super().__init__(capacity)
        self.decay = float(decay)
        self.layer_of = layer_of  # the key's layer, whose clock it ages by (the bound's int keys: key // stride)
        self.uses: defaultdict[Hashable, int] = defaultdict(int)  # layer → its use clock
        self.value: dict[Key, tuple[float, int]] = {}

    def score(self, key: Key) -> float:
        v = self.value.get(key)
        if v is None:
            return 0.0
        age = self.uses[self.layer_of(key)] - v[1]
        return v[0] if age == 0 else v[0] * self.decay ** age

    def _bump(self, key: Key) -> None:
        layer = self.layer_of(key)
        self.uses[layer] += 1  # the clock first, then the decayed value plus this use: the store's order
        self.value[key] = (self.score(key) + 1.0, self.uses[layer])

    def victim(self, protected: Container[Key], now: int) -> Key | None:
        return min((k for k in self.recency if k not in protected), key=self.score, default=None)


class ARC(Policy):
    """Adaptive replacement (the store's ``offload.cache.ARC``: the same :class:`ArcLists`, per layer ``key[0]``).
    Victim: the least recent unprotected resident of the list ARC takes from now, else of the other."""

    name = "arc"

    def __init__(self, capacity: int, next_use: "NextUse | None" = None) -> None:
        super().__init__(capacity)
        self.lists = ArcLists()

    def loaded(self, key: Key, now: int) -> None:
        super().loaded(key, now)
        self.lists.entered(key[0], key[1])

    def touch(self, key: Key, now: int) -> None:
        super().touch(key, now)
        self.lists.used(key[0], key[1])

    def evicted(self, key: Key) -> None:
        super().evicted(key)
        self.lists.left(key[0], key[1])

    def victim(self, protected: Container[Key], now: int) -> Key | None:
        rank = self.lists.rank
        return min((k for k in self.recency if k not in protected), key=lambda k: rank(k[0], k[1]), default=None)


class Belady(Policy):
    """Clairvoyant: the resident whose next request is furthest (``next_use``: the sequence's request times).
    A key requested at ``now`` ranks as needed now until it is touched, so it is never the victim while its
    request runs. Ties (``ties``): ``"recency"`` the least recently touched (a load or a use) first, as the
    store's ``forecast`` eviction ranks; ``"key"`` the smallest key (the bound's timed pool). A lazy heap of
    (−next use, tie, key, touch stamp): an entry is current while its stamp is the key's."""

    name = "belady"

    def __init__(self, capacity: int, next_use: "NextUse | None" = None, ties: str = "recency") -> None:
        if next_use is None:
            raise ValueError("policy='belady' needs the routing's request times (a NextUse).")
        if ties not in ("recency", "key"):
            raise ValueError(f"ties={ties!r}: use 'recency' or 'key'.")
        super().__init__(capacity)
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

    def loaded(self, key: Key, now: int) -> None:
        super().loaded(key, now)
        self._rank(key, now if self.next_use.asked(key, now) else self.next_use.after(key, now))

    def touch(self, key: Key, now: int) -> None:
        super().touch(key, now)
        self._rank(key, self.next_use.after(key, now))

    def evicted(self, key: Key) -> None:
        super().evicted(key)
        del self.nxt[key], self.stamp[key]

    def victim(self, protected: Container[Key], now: int) -> Key | None:
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
    """A fixed resident set (``initial=``): nothing is evicted, and a miss is computed elsewhere, not cached."""

    name = "static"
    admits = False

    def victim(self, protected: Container[Key], now: int) -> Key | None:
        return None


POLICIES: dict[str, type[Policy]] = {"lru": LRU, "lfu": LFU, "lfu_decay": DecayLFU, "arc": ARC,
                                     "belady": Belady, "static": Static}


class NextUse:
    """When each key is requested: ``uses[key]`` ascending request times."""

    def __init__(self, uses: Mapping[Key, list[int]]) -> None:
        self.uses = uses

    @classmethod
    def of(cls, requests: Sequence[Sequence[list[int]]]) -> "NextUse":
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


# --------------------------------------------------------------------------------------------- the simulation

_COUNTS = ("lookups", "hits", "misses", "loads", "bypassed", "bypass_steps", "fills", "roomy")


@dataclass
class CacheStats:
    """Per MoE layer counts over the counted steps (from ``warmup`` on): ``lookups`` = ``hits`` + ``misses``;
    ``loads`` misses copied into the pool (streamed ones included), ``bypassed`` misses computed elsewhere and
    not cached, ``bypass_steps`` steps whose request bypassed any; ``fills`` misses loaded into a free slot (no
    eviction), ``roomy`` misses of a request that began with a free slot (two cold-start conventions: first
    uses that fit "hit"). ``steps`` counted steps."""

    lookups: np.ndarray
    hits: np.ndarray
    misses: np.ndarray
    loads: np.ndarray
    bypassed: np.ndarray
    bypass_steps: np.ndarray
    fills: np.ndarray
    roomy: np.ndarray
    steps: int = 0

    @property
    def hit_rate(self) -> float:
        n = int(self.lookups.sum())
        return int(self.hits.sum()) / n if n else float("nan")


Admit = Callable[[int, int, int, int], bool]  # (layer, expert, step, free slots) → copy it into the pool?


def simulate(routing, slots: "int | Sequence[int]", *, policy: "str | Callable[..., Policy]" = "lru",
             pool: str = "layer", warmup: int = 0, rule: str = "store", admit: Admit | None = None,
             initial: "Mapping[int, Iterable[int]] | None" = None) -> CacheStats:
    """Replay ``routing`` (``[steps, layers, width]`` expert ids, -1 = none) through a cache of ``slots``
    experts (per layer: an int or one per layer; ``pool="global"``: in all) and count, per layer, from step
    ``warmup`` on (earlier steps warm the cache). ``policy``: a name of :data:`POLICIES` or a factory
    ``(capacity, next_use) -> Policy``; ``rule``: ``"store"`` or ``"moe-lrc"`` (module docstring); ``admit``:
    which misses are copied (default all); ``initial``: per layer, experts resident before the first step."""
    arr = np.asarray(routing)
    if arr.ndim != 3 or arr.dtype.kind not in "iu":
        raise ValueError(f"routing: expected a [steps, layers, width] integer array of expert ids, got "
                         f"{arr.dtype} with shape {arr.shape}.")
    if rule not in RULES:
        raise ValueError(f"rule={rule!r} is unknown; use one of {list(RULES)}.")
    if pool not in ("layer", "global"):
        raise ValueError(f"pool={pool!r} is unknown; use 'layer' or 'global'.")
    if isinstance(policy, str) and policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is unknown; use one of {sorted(POLICIES)}.")
    T, L, _ = arr.shape
    rows = arr.tolist()
    make = POLICIES[policy] if isinstance(policy, str) else policy
    base = getattr(make, "func", make)  # a functools.partial of a policy class
    nu = NextUse.of(rows) if isinstance(base, type) and issubclass(base, Belady) else None
    if pool == "global":
        if not isinstance(slots, (int, np.integer)):
            raise ValueError(f"slots={slots!r}: a global pool takes one total number of slots.")
        one = make(int(slots), nu)
        pools = [one] * L
    else:
        per = [int(slots)] * L if isinstance(slots, (int, np.integer)) else [int(s) for s in slots]
        if len(per) != L:
            raise ValueError(f"slots: {len(per)} values for {L} layers.")
        pools = [make(s, nu) for s in per]
    for l, experts in (initial or {}).items():
        for e in experts:
            if pools[l].free > 0:
                pools[l].loaded((l, int(e)), -1)
    step = _store_request if rule == "store" else _moe_lrc_request
    admit_all = admit is None
    acc = [[0] * len(_COUNTS) for _ in range(L)]  # plain ints: numpy element updates cost more than the cache
    for t in range(T):
        for l in range(L):
            ids = [e for e in rows[t][l] if e >= 0]
            if not ids:
                continue
            n, hits, loads, bypassed, fills, roomy = step(pools[l], l, ids, t, t * L + l, admit, admit_all)
            if t >= warmup:
                a = acc[l]
                a[0] += n
                a[1] += hits
                a[2] += n - hits
                a[3] += loads
                a[4] += bypassed
                a[5] += bypassed > 0
                a[6] += fills
                a[7] += (n - hits) if roomy else 0
    cols = np.asarray(acc, dtype=np.int64).reshape(L, len(_COUNTS)).T
    return CacheStats(*cols, steps=max(0, T - warmup))


Outcome = tuple[int, int, int, int, int, bool]  # lookups, hits, loads, bypassed, fills, began with a free slot


def _store_request(p: Policy, l: int, ids: list[int], t: int, now: int, admit, admit_all) -> Outcome:
    """The runtime's rule (module docstring): misses loaded over unneeded residents, hits then loads used,
    deferred misses streamed through the victim of all residents."""
    keys = [(l, e) for e in sorted(set(ids))]
    res, touch = p.recency, p.touch
    roomy = p.free > 0
    hit = [k for k in keys if k in res]
    if len(hit) == len(keys):  # all resident: only the uses
        for k in hit:
            touch(k, now)
        return len(keys), len(hit), 0, 0, 0, roomy
    loaded, deferred = [], []
    bypassed = fills = 0
    needed = None
    for k in keys:
        if k in res:
            continue
        if not p.admits or not (admit_all or admit(l, k[1], t, p.free)):
            bypassed += 1
            continue
        if p.free > 0:
            fills += 1
        else:
            needed = needed if needed is not None else set(keys)
            v = p.victim(needed, now)
            if v is None:
                deferred.append(k)
                continue
            p.evicted(v)
        p.loaded(k, now)
        loaded.append(k)
    for k in hit:
        touch(k, now)
    for k in loaded:
        touch(k, now)
    for k in deferred:  # the layer's other experts are computed: stream through one of their slots
        v = p.victim((), now)
        if v is None:  # no slot at all: the copy passes through, nothing stays
            continue
        p.evicted(v)
        p.loaded(k, now)
        touch(k, now)
    return len(keys), len(hit), len(loaded) + len(deferred), bypassed, fills, roomy


def _moe_lrc_request(p: Policy, l: int, ids: list[int], t: int, now: int, admit, admit_all) -> Outcome:
    """moe-lrc's rule (module docstring): hits looked up at the start, then each expert in routed order used,
    a miss loaded over the victim of all residents."""
    keys = [(l, e) for e in dict.fromkeys(ids)]
    res, touch = p.recency, p.touch
    roomy = p.free > 0
    hits = sum(k in res for k in keys)
    loads = bypassed = fills = 0
    for k in keys:
        if k not in res:
            if not p.admits or not (admit_all or admit(l, k[1], t, p.free)):
                bypassed += 1
                continue
            if p.free > 0:
                fills += 1
            else:
                v = p.victim((), now)
                if v is None:
                    continue
                p.evicted(v)
            p.loaded(k, now)
            loads += 1
        touch(k, now)
    return len(keys), hits, loads, bypassed, fills, roomy


def stack_requests(per_layer: Sequence[Sequence[Iterable[int]]]) -> np.ndarray:
    """A routing array ``[steps, layers, width]`` (-1 padded) from ``per_layer[l][t]``: the experts layer l asks
    for at step t (a set of a recorded forward, say)."""
    lists = [[sorted(int(e) for e in r) for r in reqs] for reqs in per_layer]
    T = max((len(r) for r in lists), default=0)
    width = max((len(r) for reqs in lists for r in reqs), default=0)
    out = np.full((T, len(lists), max(1, width)), -1, dtype=np.int64)
    for l, reqs in enumerate(lists):
        for t, r in enumerate(reqs):
            out[t, l, : len(r)] = r
    return out


# --------------------------------------------------------------------------------------------- LRU of every size

def lru_stack_positions(routing: np.ndarray, num_experts: np.ndarray, cold: str) -> np.ndarray:
    """``[T, L, k]`` LRU stack position of each lookup of ``routing`` (-1 = none) under the ``moe-lrc`` rule: the
    number of the layer's experts used more recently. An LRU of c slots (``simulate(policy="lru",
    rule="moe-lrc")``) hits a lookup iff its position < c (LRU's inclusion property, Mattson et al. 1970): one
    vectorized pass prices every cache size at once (a locality curve, a bisection over it). A first use gets
    the number of distinct experts seen before it (``cold="fit"``: it hits while it fills a free slot, the
    ``fills`` of :func:`simulate`) or an infinite position (``"miss"``). -1 slots: position -1 (no lookup)."""
    T, L, k = routing.shape
    E = int(np.max(num_experts))
    last = np.full((L, E), -1, dtype=np.int64)  # stamp of the last use, -1: never used
    seen = np.zeros(L, dtype=np.int64)
    rows = np.arange(L)[:, None]
    out = np.full((T, L, k), -1, dtype=np.int64)
    far = np.iinfo(np.int64).max
    for t in range(T):
        ids = routing[t]
        valid = ids >= 0
        safe = np.where(valid, ids, 0)
        stamp = last[rows, safe]  # [L, k]
        warm = valid & (stamp >= 0)
        newer = (last[:, None, :] > stamp[:, :, None]).sum(-1)  # experts used after this one
        first = valid & ~warm
        cold_pos = seen[:, None] + np.cumsum(first, axis=1) - 1 if cold == "fit" else np.full((L, k), far)
        out[t] = np.where(warm, newer, np.where(first, cold_pos, -1))
        seen += first.sum(1)
        # later slots of a token are more recent (moe-lrc's order); a duplicate id (invalid routing) stamps twice
        stamps = t * k + np.arange(k)
        ls, ks = np.nonzero(valid)
        last[ls, ids[ls, ks]] = stamps[ks]
    return out
