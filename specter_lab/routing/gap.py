"""Why a strategy is where it is against the bound: its distance split into what Belady's eviction is worth and
what the rest of the clairvoyant schedule is worth.

The bound (:mod:`.bound`) is a clairvoyant schedule that knows the future twice over: it evicts the expert used
furthest ahead (Belady's), and it starts every copy as soon as the link and a slot allow, before the router asks.
:func:`bound_gap` re-runs the bound's own schedule with the row's online eviction policy instead of Belady's
(the bound's analysis variant ``evict=``), everything else kept, and reads the row against both:

* **eviction**: bound → the bound's schedule evicting online; what knowing the furthest next use is worth;
* **the schedule**: the bound's schedule evicting online → the row; what the rest of the bound's clairvoyance is
  worth: starting copies before the router asks, choosing copy or host knowing the future, its initial set
  (``bound_schedule`` names the fastest schedule). Where the link has time to spare (eager profiles: a layer's
  work is long against a copy), the bound hides every copy whichever expert it evicts: its TPOT is the device's
  work alone, eviction is worth nothing, and the whole distance is when the row's copies start.

A large eviction share says a better cache policy could still help. A large schedule share says the row loses on
when and where it moves experts: a forecast of which expert comes next, early enough for its copy to land (on a
compiled profile several layers ahead), would recover it. That is how
``docs/measured/closer_to_bound.md`` reads its cells; this is the same reading for any trace and row.

Simulated on the engine's cost model, like the bound: non-speculative rows only (a speculative row verifies
several tokens a forward and may go below the autoregressive bound, where a split of its distance means nothing).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import OptionError
from ..run.strategies import STRATEGIES, Strategy, get_strategy
from .bound import trace_bound
from .replay import replay, replay_setup
from .trace_file import RoutingTrace

__all__ = ["BoundGap", "bound_gap", "cell_gaps"]

# the row's eviction → the bound's online variant that evicts the same way; the others are read against decayed
# LFU, the best online policy measured on real decode routing (docs/measured/closer_to_bound.md)
_ONLINE = {"lru": "lru", "lfu_decay": "lfu_decay"}


@dataclass(frozen=True)
class BoundGap:
    """One non-speculative row's distance to the bound, split in two (ms per decode token, means over the trace's
    sequences; simulated on ``assumptions``). ``tpot_ms ≥ online_ms ≥ bound_ms`` usually; on short sequences the
    online-eviction schedule can end a little below the bound (:mod:`.bound`'s docstring), which reads as a
    negative eviction share."""

    strategy: str
    tpot_ms: float  # the row, replayed
    bound_ms: float  # the clairvoyant schedule
    online_ms: float  # the bound's schedule evicting with ``eviction`` instead of Belady's
    eviction: str  # the online policy ``online_ms`` evicts with
    hit_rate: float  # the row's decode lookups served from the device
    bound_hit_rate: float  # the bound's (Belady's eviction, its pool)
    bound_schedule: str = ""  # the bound's fastest schedule (pool, initial set, misses), most sequences'
    assumptions: str = ""

    @property
    def x_of_bound(self) -> float:
        return self.bound_ms / self.tpot_ms

    @property
    def eviction_share(self) -> float:
        """Of the distance from the bound down to the row (in × of the bound), the part Belady's eviction is worth
        (NaN when the row is at or above the bound: no distance to split)."""
        gap = 1 - self.bound_ms / self.tpot_ms
        return (1 - self.bound_ms / self.online_ms) / gap if gap > 1e-9 else math.nan

    @property
    def schedule_share(self) -> float:
        """The rest of that distance: the rest of the bound's schedule (copies started before the router asks,
        copy or host chosen knowing the future, its initial set)."""
        return 1 - self.eviction_share

    def as_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "tpot_ms": self.tpot_ms, "bound_ms": self.bound_ms,
                "online_ms": self.online_ms, "eviction": self.eviction, "x_of_bound": self.x_of_bound,
                "eviction_share": self.eviction_share, "schedule_share": self.schedule_share,
                "hit_rate": self.hit_rate, "bound_hit_rate": self.bound_hit_rate,
                "bound_schedule": self.bound_schedule}

    def summary(self) -> str:
        """One line a table or a notebook can print."""
        if math.isnan(self.eviction_share):
            split = "at or above the bound: nothing to split"
        else:
            split = (f"of its distance, {self.eviction_share:.0%} is eviction (Belady's against {self.eviction}), "
                     f"{self.schedule_share:.0%} the rest of the schedule")
        return (f"{self.strategy}: {self.tpot_ms:.2f} ms, {self.x_of_bound:.2f} of the bound ({self.bound_ms:.2f} ms: "
                f"{self.bound_schedule}; evicting by {self.eviction} instead: {self.online_ms:.2f} ms); {split}; hit "
                f"rate {self.hit_rate:.2f} against the bound's {self.bound_hit_rate:.2f}")


def bound_gap(trace: RoutingTrace, strategy: "str | Strategy" = "split_lfu", *,
              sequences: "Sequence[int] | None" = None, **options) -> BoundGap:
    """Replay ``strategy`` on ``trace`` (or the ``sequences`` listed) with ``options`` (``expert_budget``,
    ``hardware``, ``cost_shape``, … as :func:`~specter_lab.routing.replay.replay` takes them) and split its
    distance to the bound into eviction and the schedule (module docstring). Refuses a speculative strategy and
    ``strategy="auto"`` (plan first, then pass the plan's row) with an :class:`~specter_lab.errors.OptionError`
    before any replay."""
    st = _plain(strategy)
    picked = list(range(len(trace.sequences))) if sequences is None else list(sequences)
    runs = replay(trace, st, sequences=picked, **options)
    row = (_mean(r.metrics["tpot_ms"] for r in runs), _mean(r.metrics["hit_rate"] for r in runs))
    return cell_gaps(trace, {st: row}, sequences=picked, **options)[0]


def cell_gaps(trace: RoutingTrace, rows: "dict[str | Strategy, tuple[float, float]]", *,
              sequences: "Sequence[int] | None" = None, **options) -> list[BoundGap]:
    """:class:`BoundGap` of rows already replayed in one cell (``rows``: strategy → its mean TPOT in ms and hit
    rate over the same sequences, e.g. a bench table's means), pricing the bound and each online-eviction
    variant once for the cell (``options``: the cell's ``expert_budget``, ``hardware``, ``cost_shape``, …)."""
    plain = {_plain(s): v for s, v in rows.items()}
    if not plain:
        return []
    evictions = {st.name: _ONLINE.get(options.get("eviction", st.eviction), "lfu_decay") for st in plain}
    bounds = trace_bound(trace, "lru", sequences=sequences, **options)  # plain rows share the cell's pool
    online = {e: _mean(b.tpot_ms for b in trace_bound(trace, "lru", sequences=sequences, evict=e, **options))
              for e in sorted(set(evictions.values()))}
    _, info = replay_setup(trace, "lru", check=False, **options)
    lookups = sum(l.top_k for l in info.layers)  # per decode token: one per routed slot of every MoE layer
    bound_ms = _mean(b.tpot_ms for b in bounds)
    bound_hit = 1 - _mean(b.misses / b.tokens for b in bounds) / lookups
    what = f"simulated; {bounds[0].assumptions}" if bounds else ""
    schedule = Counter(b.schedule for b in bounds).most_common(1)[0][0] if bounds else ""
    return [BoundGap(st.name, tpot, bound_ms, online[evictions[st.name]], evictions[st.name], hit, bound_hit,
                     schedule, what) for st, (tpot, hit) in plain.items()]


def _plain(strategy: "str | Strategy") -> Strategy:
    if strategy == "auto":
        raise OptionError("bound_gap(strategy='auto'): plan first (sl.plan) and pass the plan's strategy, so the "
                          "row read against the bound is the one replayed.", "strategy", strategy, _plain_names())
    st = get_strategy(strategy)
    if st.speculative:
        raise OptionError(f"bound_gap(strategy={st.name!r}): a speculative row verifies several tokens a forward and "
                          "can go below the autoregressive bound, so its distance has no eviction/schedule split; "
                          "pass a non-speculative row (e.g. 'split_lfu').", "strategy", st.name, _plain_names())
    return st


def _plain_names() -> list[str]:
    return [n for n, s in STRATEGIES.items() if not s.speculative]


def _mean(values) -> float:
    return float(np.mean(list(values)))
