"""Routing locality as an expert cache sees it: the per-layer LRU hit-rate curve of a routing sequence, and a
less local sequence derived from a real one (to re-measure verdicts on routing like that of larger models).

**The curve** (:func:`lru_hit_curve`) counts the way moe-lrc (the code of arXiv 2505.16056, ``calc_lru`` in
``src/50_chr_calc.py``; ``shared/research/routing_locality.md`` §1) does, applied **per layer** (the variant the
issue's figures and this runtime's per-layer caches use; the moe-lrc plots are model-level: one global LRU):

* a layer's cache holds its ``round(fraction × num_experts)`` most recently used experts; the sequence starts with
  an empty cache (one cold cache per sequence, as moe-lrc resets per 512-token sample);
* all of a token's lookups are checked before the cache is updated with that token's experts (later top-k slots
  count as more recent);
* a first use hits while the cache still has room (``cold="fit"``, moe-lrc's counting: a cache that fills up
  never evicts, so the first uses are a prefetch of a cold start), or always misses (``cold="miss"``);
* the hit rate is hits / lookups per layer, then the mean over layers; -1 ids (not recorded) are no lookup.

The counting runs on :func:`specter_lab.caching.simulate.lru_stack_positions` (the simulator's ``moe-lrc`` LRU,
every cache size in one pass). It is not the runtime's decode hit rate: a run warms its caches with the prompt's prefill, counts only decode
lookups and may split its budget unevenly; the curve is the routing's own property, comparable across models.

**Less local routing** (:func:`less_local`): each routed expert is replaced, with probability ``q``, by an expert
the token does not use in that layer, drawn uniformly at random (no duplicates within a token); ``q`` is found by
bisection so the curve at ``fraction`` lands on the target. The random draws are fixed by the seed and shared by
every ``q`` (a larger ``q`` replaces a superset of the slots), so the hit rate falls with ``q`` and the bisection
converges. Replacement keeps each token's top-k size and each layer's expert range; it removes temporal
correlation uniformly, so per-layer differences in locality are kept in shape, not in size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from ..caching.simulate import lru_stack_positions

__all__ = ["lru_hit_curve", "less_local", "LessLocal", "replace_experts", "TARGET_HIT_AT_HALF"]

# Per-layer LRU hit rate at half of a layer's experts cached, of published real-model routing (moe-lrc's traces,
# teacher-forced corpus text; routing_locality.md §1, issue 25): targets for less_local().
TARGET_HIT_AT_HALF = {"deepseek-v2-lite-chat": 0.72, "mixtral-8x7b": 0.61}

Routing = "np.ndarray | Sequence[np.ndarray]"


def _as_list(routing) -> tuple[list[np.ndarray], bool]:
    """(sequences as [T, L, k] int arrays, whether one array was given)."""
    single = isinstance(routing, np.ndarray)
    seqs = [routing] if single else list(routing)
    if not seqs:
        raise ValueError("routing is empty: give a [tokens, layers, top_k] int array (or a list of them).")
    for i, a in enumerate(seqs):
        a = np.asarray(a)
        if a.dtype.kind not in "iu" or a.ndim != 3:
            raise ValueError(f"routing[{i}]: expected a [tokens, layers, top_k] integer array of expert ids, "
                             f"got {a.dtype} with shape {a.shape}.")
    return [np.asarray(a) for a in seqs], single


def _num_experts(num_experts, n_layers: int) -> np.ndarray:
    ne = np.broadcast_to(np.asarray(num_experts, dtype=np.int64), (n_layers,)).copy()
    if (ne < 1).any():
        raise ValueError(f"num_experts={num_experts!r}: every layer needs at least one expert.")
    return ne


def lru_hit_curve(routing: Routing, fractions: Sequence[float] = (0.25, 0.5), *, num_experts,
                  cold: Literal["fit", "miss"] = "fit", per_layer: bool = False) -> dict[float, "float | np.ndarray"]:
    """Per-layer LRU hit rate of ``routing`` (``[tokens, layers, top_k]`` expert ids, -1 = no lookup; or a list
    of such sequences, each with its own cold cache) with ``round(fraction × num_experts)`` experts cached per
    layer, for each fraction: ``{fraction: mean over layers}`` (``per_layer=True``: ``{fraction: [L] array}``).

    ``num_experts``: experts per layer (an int, or one per layer). The counting is moe-lrc's, per layer (see the
    module docstring), so the values compare with the published curves (e.g. 0.72 at 50 % for
    DeepSeek-V2-Lite-Chat, 0.61 for Mixtral-8x7B)."""
    if cold not in ("fit", "miss"):
        raise ValueError(f"cold={cold!r}: use 'fit' (moe-lrc: first uses hit while the cache has room) or 'miss'.")
    seqs, _ = _as_list(routing)
    ne = _num_experts(num_experts, seqs[0].shape[1])
    for f in fractions:
        if not (isinstance(f, (int, float)) and 0 < f <= 1):
            raise ValueError(f"fractions: {f!r} is not a share of a layer's experts in (0, 1].")
    slots = {f: np.maximum(1, np.rint(np.asarray(f) * ne)).astype(np.int64) for f in fractions}
    hits = {f: np.zeros(len(ne)) for f in fractions}
    lookups = np.zeros(len(ne))
    for a in seqs:
        if a.shape[1] != len(ne):
            raise ValueError(f"routing: sequences have {a.shape[1]} and {len(ne)} layers; give one model's routing.")
        pos = lru_stack_positions(a, ne, cold)
        valid = pos >= 0
        lookups += valid.sum((0, 2))
        for f in fractions:
            hits[f] += (valid & (pos < slots[f][None, :, None])).sum((0, 2))
    if not lookups.any():
        raise ValueError("routing has no lookups (every id is -1): nothing to count.")
    with np.errstate(invalid="ignore"):
        rates = {f: hits[f] / lookups for f in fractions}  # a layer with no lookups: nan, left out of the mean
    return rates if per_layer else {f: float(np.nanmean(r)) for f, r in rates.items()}


def replace_experts(routing: np.ndarray, replace: np.ndarray, num_experts, rng: np.random.Generator,
                    keys: "np.ndarray | None" = None) -> np.ndarray:
    """``routing`` ([..., L, k] ids, -1 = none) with the slots where ``replace`` is True swapped for experts that
    token does not use in that layer, drawn uniformly at random without duplicates (slot j takes the j-th expert
    of a random order of the unused ones; a layer with fewer than 2·k experts keeps the slots it cannot fill).
    ``keys``: the random order's keys (same shape as the ids plus an expert axis), to share draws across calls."""
    shape = routing.shape
    L, k = shape[-2], shape[-1]
    ne = _num_experts(num_experts, L)
    E = int(ne.max())
    flat = routing.reshape(-1, k)  # [rows, k]; row r is layer r % L
    n_rows = flat.shape[0]
    per_row = ne[np.arange(n_rows) % L]
    valid = flat >= 0
    unused = per_row[:, None] - valid.sum(1, keepdims=True)  # experts the row does not use
    can = replace.reshape(n_rows, k) & valid & (np.arange(k)[None, :] < unused)
    out = flat.copy()
    rows = np.nonzero(can.any(1))[0]  # only rows with a slot to replace draw an order
    all_keys = keys.reshape(n_rows, E) if keys is not None else None
    for chunk in np.array_split(rows, max(1, -(-len(rows) * E // 2**22))):  # ~4M keys at a time
        kc = all_keys[chunk] if all_keys is not None else rng.random((len(chunk), E), dtype=np.float32)
        kc[np.arange(E)[None, :] >= per_row[chunk][:, None]] = 2.0  # past a layer's experts: never drawn
        sub = flat[chunk]
        r, j = np.nonzero(sub >= 0)
        kc[r, sub[r, j]] = 2.0  # the token's own experts: never drawn
        order = np.argsort(kc, axis=1)[:, :k]  # a random order of the unused experts first
        out[chunk] = np.where(can[chunk], order.astype(routing.dtype), sub)
    return out.reshape(shape)


@dataclass
class LessLocal:
    """A less local routing sequence (same shape as the source) and how it was made: ``q`` the replacement
    probability found, ``hit_rate`` its curve at ``fraction`` (target ``target``), ``source_hit_rate`` the
    source's, ``seed`` the draws'."""

    routing: "np.ndarray | list[np.ndarray]"
    q: float
    fraction: float
    target: float
    hit_rate: float
    source_hit_rate: float
    seed: int

    def __repr__(self) -> str:
        return (f"LessLocal(q={self.q:.3f}: LRU hit at {self.fraction:.0%} cached {self.source_hit_rate:.3f} -> "
                f"{self.hit_rate:.3f}, target {self.target:.3f}, seed {self.seed})")


def less_local(routing: Routing, target_hit: float, fraction: float = 0.5, *, num_experts, seed: int = 0,
               tol: float = 0.005, cold: Literal["fit", "miss"] = "fit") -> LessLocal:
    """A sequence derived from ``routing`` whose per-layer LRU hit rate (:func:`lru_hit_curve`) at ``fraction``
    of each layer's experts cached is ``target_hit`` (within ``tol`` where the sequence is long enough): each
    routed expert is replaced with probability ``q`` by one the token does not use, ``q`` found by bisection.
    Targets of real models: :data:`TARGET_HIT_AT_HALF`. Import the result with
    :func:`specter_lab.traces.importing.import_routing` to replay strategies on it."""
    seqs, single = _as_list(routing)
    ne = _num_experts(num_experts, seqs[0].shape[1])
    if not (isinstance(target_hit, (int, float)) and 0 < target_hit < 1):
        raise ValueError(f"target_hit={target_hit!r}: a hit rate in (0, 1).")
    rng = np.random.default_rng(seed)
    draws = [(rng.random(a.shape, dtype=np.float32), rng.random(a.shape[:-1] + (int(ne.max()),), dtype=np.float32))
             for a in seqs]

    def derive(q: float) -> list[np.ndarray]:
        return [replace_experts(a, u < q, ne, rng, keys) for a, (u, keys) in zip(seqs, draws)]

    def hit(q: float) -> float:
        return lru_hit_curve(derive(q), (fraction,), num_experts=ne, cold=cold)[fraction]

    h0, h1 = hit(0.0), hit(1.0)
    if target_hit > h0 + tol:
        raise ValueError(f"target_hit={target_hit}: the routing's own hit rate at {fraction:.0%} cached is {h0:.3f}; "
                         "less_local only lowers locality: give a target <= that.")
    if target_hit < h1 - tol:
        raise ValueError(f"target_hit={target_hit}: even replacing every expert gives {h1:.3f} at {fraction:.0%} "
                         "cached; give a target >= that.")
    best = min(((0.0, h0), (1.0, h1)), key=lambda qh: abs(qh[1] - target_hit))
    lo, hi = 0.0, 1.0
    for _ in range(30):
        if abs(best[1] - target_hit) <= tol / 4:
            break
        mid = (lo + hi) / 2
        h = hit(mid)
        if abs(h - target_hit) < abs(best[1] - target_hit):
            best = (mid, h)
        lo, hi = (mid, hi) if h > target_hit else (lo, mid)
    q, h = best
    out = derive(q)
    return LessLocal(out[0] if single else out, q, fraction, float(target_hit), h, h0, seed)
