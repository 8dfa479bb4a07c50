"""Cache bounds on a recorded trace: how far is a run's expert cache from the best any policy could do?

Belady's MIN (evict the expert whose next request is furthest in the future) is the optimal demand-paging policy
for a known request sequence; no real cache can beat its hit rate with the same slots. Replaying the target's
recorded routing through MIN and through LRU gives the two ends against which a run's measured hit rate (with
its draft's forecast and prefetches) can be read.
"""

from __future__ import annotations

import pandas as pd

from ..caching.simulate import simulate, stack_requests

__all__ = ["request_sequences", "lru_hits", "belady_hits", "cache_bounds"]


def request_sequences(result, source: str = "target") -> dict[int, list[set[int]]]:
    """Per layer, the experts each target forward asked for (one set per forward, in order, prefill first)."""
    ro = result.trace.frames()["routing"]
    ro = ro[ro.source == source]
    seqs: dict[int, list[set[int]]] = {}
    for (layer, step), g in ro.groupby(["layer", "step"], sort=True):
        seqs.setdefault(int(layer), []).append(set(int(e) for e in g.expert))
    return seqs


def _hits(requests: list[set[int]], slots: int, count_from: int, policy: str) -> tuple[int, int]:
    stats = simulate(stack_requests([requests]), slots, policy=policy, warmup=count_from)
    return int(stats.hits.sum()), int(stats.lookups.sum())


def lru_hits(requests: list[set[int]], slots: int, count_from: int = 1) -> tuple[int, int]:
    """(hits, requests) of a per-layer LRU cache of ``slots`` experts, starting empty, counted from forward
    ``count_from`` on (the prefill warms the cache but is not a decode hit): :func:`~.cachesim.simulate` with the
    runtime's rule (a forward's resident experts are used first; a miss evicts the least recently used expert
    this forward does not need)."""
    return _hits(requests, slots, count_from, "lru")


def belady_hits(requests: list[set[int]], slots: int, count_from: int = 1) -> tuple[int, int]:
    """(hits, requests) of Belady's MIN with ``slots`` experts: on a miss with a full cache, evict the resident
    expert (not needed by the current forward) whose next request is furthest away (never = infinitely far)."""
    return _hits(requests, slots, count_from, "belady")


def cache_bounds(result, slots: int | None = None) -> pd.DataFrame:
    """Per layer: the run's measured demand hit rate, and LRU and Belady hit rates replayed on the same target
    routing with the same number of slots (the run's slots per layer by default)."""
    frames = result.trace.frames()
    slots = slots or int(result.metrics["slots_per_layer"])
    ce = frames["cache"]
    ce = ce[ce.step >= 1]
    rows = []
    for layer, reqs in sorted(request_sequences(result).items()):
        c = ce[ce.layer == layer]
        h, m = int((c.event == "hit").sum()), int((c.event == "miss").sum())
        lh, lt = lru_hits(reqs, slots)
        bh, bt = belady_hits(reqs, slots)
        rows.append({"layer": layer, "slots": slots, "measured_hit_rate": h / (h + m) if h + m else float("nan"),
                     "lru_hit_rate": lh / lt if lt else float("nan"),
                     "belady_hit_rate": bh / bt if bt else float("nan")})
    df = pd.DataFrame(rows)
    if len(df):
        df["layer"] = df["layer"].astype(object)  # the summary row's layer is "all"
        df.loc[len(df)] = {"layer": "all", "slots": slots, "measured_hit_rate": df.measured_hit_rate.mean(),
                           "lru_hit_rate": df.lru_hit_rate.mean(), "belady_hit_rate": df.belady_hit_rate.mean()}
    return df
