"""One expert-cache simulator over a routing array: what a cache of n slots hits on a routing sequence, without
running the engine.

The runtime's cache is :class:`~specter_lab.offload.store.ExpertStore`; both rank their residents with the same
policies (:mod:`.policies`). Every tool that asks "what would a cache hit on this routing" without running the
runtime asks here: the cache bounds (:mod:`specter_lab.analysis.cache_bounds`), synthetic routing's fit
(:mod:`specter_lab.traces.synthetic`), the locality curve (:mod:`specter_lab.traces.locality`) and the estimate's
cache sizing. ``tests/test_cachesim.py`` holds it to the store on the same routing (same hits and misses, per
layer, every eviction policy, per-layer and global pools).

**Shape** (mixtral-offloading's ``EvictionGroupInfo``): a pool is a policy over its resident keys ``(layer,
expert)``, least recently touched first. ``pool="layer"``: one pool per MoE layer; ``pool="global"``: one pool over
every layer (llama.cpp's ``--moe-cache-mib``, the store's ``global`` pool).

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

**Policies** (``policy=``): a name of :data:`~.policies.POLICIES` (``"belady"`` is clairvoyant: it reads the
routing's own request times; ``"static"`` keeps ``initial=`` and computes every miss elsewhere: ``bypassed``), or
a factory ``(capacity, next_use) -> Policy`` (``functools.partial(DecayLFU, decay=...)``). A miss the ``admit``
callback refuses is computed elsewhere (the host) and not cached (``bypassed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .policies import POLICIES, Belady, NextUse, Policy

__all__ = ["simulate", "CacheStats", "lru_stack_positions", "stack_requests", "RULES"]

RULES = ("store", "moe-lrc")


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
