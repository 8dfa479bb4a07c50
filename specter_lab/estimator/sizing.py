"""The cache-sizing answer for a global expert pool (llama.cpp ``--moe-cache-mib``): the cliff below which a global
LRU gets no hits at all, and the size past which more cache stops paying.

Why a cliff: decode visits the MoE layers in the same order every token, so a global LRU that holds fewer than
one token's experts of every layer (sum over layers of top_k x expert bytes, the *token cycle*) evicts the expert
the next layer will want (sequential flooding) and hits 0 %: measured on real decode traces by
``Helldez/BigMoeOnEdge`` docs/bench-data/2026-07-15-route-trace/findings.md (field_2026b.md §0.1). Routing that
repeats experts token to token moves the cliff a little below the token cycle (a hit inserts nothing, so fewer
evictions run between two uses), so the cliff printed is the replay's: the smallest swept size with any hits.
Above it the answer also comes from the replay: the smallest size whose modelled tokens/s is within ``ENOUGH``
of the best any size reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..caching.simulate import simulate
from ..model.geometry import ModelGeometry
from ..traces.trace_file import RoutingTrace
from .lanes import Counts, price_token

__all__ = ["CacheSizing", "cache_sizing", "ENOUGH"]

MiB = 2**20
ENOUGH = 0.95  # "more cache stops paying": within 5 % of the fastest size


@dataclass(frozen=True)
class CacheSizing:
    """Cliff and knee of a global expert cache, in MiB, and the sweep behind them (modelled)."""

    cliff_mib: float  # below this a global LRU hits 0 % (the replay's first size with hits)
    token_cycle_mib: float  # one token's experts of every layer: the bound the cliff sits at or just below
    enough_mib: float  # past this, more cache gains < 1 - ENOUGH
    budget_mib: float  # what the VRAM leaves for experts
    sweep: pd.DataFrame  # cache_mib, hit_rate, tokens_per_s

    def command(self) -> str:
        fits = self.enough_mib <= self.budget_mib
        return (f"--moe-cache-mib {int(np.ceil(self.enough_mib))}" if fits else
                f"--moe-cache-mib {int(self.budget_mib)}  # all the VRAM allows; {self.enough_mib:.0f} MiB would "
                "be enough")

    def describe(self) -> str:
        return (f"Expert cache (global LRU, --moe-cache-mib), modelled: below {self.cliff_mib:.0f} MiB it hits 0 % "
                f"(the cliff; one token's experts of every layer is {self.token_cycle_mib:.0f} MiB); past {self.enough_mib:.0f} MiB more cache gains under "
                f"{1 - ENOUGH:.0%}; the VRAM leaves {self.budget_mib:.0f} MiB. Use {self.command()}.")


def cache_sizing(geom: ModelGeometry, budget, trace: RoutingTrace, central, points: int = 8) -> CacheSizing:
    """The cliff and the knee for ``geom`` at ``budget`` (an estimate's :class:`~.vram.VramBudget`), from the cache
    simulator's global LRU (:func:`~specter_lab.caching.simulate.simulate`, the store's own policy) over the
    estimate's routing at sizes between the cliff and every routed expert (all layers' experts in host memory, as
    ``--cpu-moe --moe-cache-mib`` runs), each priced by the estimate's clock in closed form (``central``: its
    :class:`~.bands.Scenario`; :mod:`.lanes`)."""
    routing = np.concatenate([np.concatenate([s.prefill, s.decode]) for s in trace.sequences]).astype(np.int64)
    warmup = len(trace.sequences[0].prefill)
    cost = central.cost(geom)
    cycle = geom.moe_layers * geom.top_k  # experts in one token cycle
    above = np.geomspace(cycle, budget.experts_total / budget.expert_bytes, points)
    sizes = np.unique(np.round(np.concatenate([cycle * np.array([0.5, 0.7, 0.8, 0.9, 0.95]), above])).astype(int))
    rows = []
    for slots in sizes.tolist():
        s = simulate(routing, slots, pool="global", warmup=warmup)
        n = max(1, s.steps)
        counts = Counts(s.hits / n, s.loads / n, s.bypassed / n, s.bypass_steps / n)
        rows.append({"cache_mib": slots * budget.expert_bytes / MiB, "hit_rate": s.hit_rate,
                     "tokens_per_s": price_token(cost, counts, geom.top_k, central.depth).tokens_per_s})
    sweep = pd.DataFrame(rows)
    top = sweep.tokens_per_s.max()
    enough = float(sweep[sweep.tokens_per_s >= ENOUGH * top].cache_mib.min())
    hits = sweep[sweep.hit_rate > 0.01]
    cliff = float(hits.cache_mib.min()) if len(hits) else float(sweep.cache_mib.max())
    return CacheSizing(cliff, cycle * budget.expert_bytes / MiB, enough, budget.experts / MiB, sweep)
