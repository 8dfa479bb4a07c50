"""Why a strategy is where it is against the bound: its distance split into what Belady's eviction is worth, what
foresight is worth (across tokens, and within a token), and the rest.

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

The schedule's part is split further by how far ahead copies may start (the bound's ``lead=``, still evicting
online):

* **across tokens**: copies started whenever the link and a slot allow → only once their token's forward has
  begun (``lead=math.inf``); only a forecast of later tokens (a draft) can win it;
* **within the token**: → only when the router asks (``lead=0``); a pre-gating predictor (a layer's router run on
  an earlier layer's state) could win it, as much of it as its depth and recall reach;
* **the initial set**: → starting from the prompt's experts instead of a set chosen knowing the sequence
  (``initial="prompt"``): the schedule is now fully online, no forecast of any kind (it still keeps the fastest of
  its pool kinds and miss rules, as a planner would pick one);
* **the rest**: → the row; what that online schedule (the greedy copy-or-host per expert) does better than the
  row's own rules (negative where the row does better, e.g. by weighing reuse).

A large eviction share says a better cache policy could still help; a large within-token share, a pre-gating
predictor; a large across-token share, only speculation; a large initial-set share, knowing this sequence's most
used experts before it starts (a profile of other prompts did not supply it on the routing measured in
``docs/measured/closer_to_bound.md``); a large rest, the row's own rules. That is how
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
from .bound import EVICTIONS, trace_bound
from .replay import replay, replay_setup
from ..traces.trace_file import RoutingTrace

__all__ = ["BoundGap", "bound_gap", "cell_gaps"]

# A row is read against the bound's online variant that evicts as it does (every online policy is one); a row
# evicting by a forecast (no forecast without a draft: only speculative rows, which the gap does not read) would
# be read against decayed LFU, the best online policy measured on real decode routing
# (docs/measured/closer_to_bound.md)
_FALLBACK = "lfu_decay"


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
    token_ms: float = math.nan  # ``online_ms``'s schedule, each copy started only once its token's forward began
    router_ms: float = math.nan  # the same, each copy started only when its router asks
    start_ms: float = math.nan  # the same, from the prompt's experts: a fully online schedule, no forecast at all

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
        copy or host chosen knowing the future, its initial set); the sum of the four shares below."""
        return 1 - self.eviction_share

    @property
    def across_tokens_share(self) -> float:
        """Of the distance, what starting copies in earlier tokens is worth (only a draft's forecast reaches)."""
        return self._share(self.online_ms, self.token_ms)

    @property
    def within_token_share(self) -> float:
        """Of the distance, what starting copies earlier in the token than the router asks is worth (a pre-gating
        predictor's reach)."""
        return self._share(self.token_ms, self.router_ms)

    @property
    def initial_set_share(self) -> float:
        """Of the distance, what a first set of residents chosen knowing the sequence is worth against the
        prompt's experts, copies started when the router asks."""
        return self._share(self.router_ms, self.start_ms)

    @property
    def rest_share(self) -> float:
        """Of the distance, the step from a fully online schedule (no forecast, the prompt's experts) to the row."""
        return self._share(self.start_ms, self.tpot_ms)

    def _share(self, faster_ms: float, slower_ms: float) -> float:
        gap = 1 - self.bound_ms / self.tpot_ms
        return (self.bound_ms / faster_ms - self.bound_ms / slower_ms) / gap if gap > 1e-9 else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "tpot_ms": self.tpot_ms, "bound_ms": self.bound_ms,
                "online_ms": self.online_ms, "eviction": self.eviction, "x_of_bound": self.x_of_bound,
                "eviction_share": self.eviction_share, "schedule_share": self.schedule_share,
                "token_ms": self.token_ms, "router_ms": self.router_ms, "start_ms": self.start_ms,
                "across_tokens_share": self.across_tokens_share, "within_token_share": self.within_token_share,
                "initial_set_share": self.initial_set_share, "rest_share": self.rest_share,
                "hit_rate": self.hit_rate, "bound_hit_rate": self.bound_hit_rate,
                "bound_schedule": self.bound_schedule}

    def summary(self) -> str:
        """One line a table or a notebook can print."""
        if math.isnan(self.eviction_share):
            split = "at or above the bound: nothing to split"
        else:
            split = (f"of its distance, {self.eviction_share:.0%} is eviction (Belady's against {self.eviction}), "
                     f"{self.schedule_share:.0%} the rest of the schedule: {self.across_tokens_share:.0%} copies "
                     f"started in earlier tokens, {self.within_token_share:.0%} earlier in the token than the router "
                     f"asks, {self.initial_set_share:.0%} the initial set, {self.rest_share:.0%} the rest")
        return (f"{self.strategy}: {self.tpot_ms:.2f} ms, {self.x_of_bound:.2f} of the bound ({self.bound_ms:.2f} ms: "
                f"{self.bound_schedule}; evicting by {self.eviction} instead: {self.online_ms:.2f} ms); {split}; hit "
                f"rate {self.hit_rate:.2f} against the bound's {self.bound_hit_rate:.2f}")


def bound_gap(trace: RoutingTrace, strategy: "str | Strategy" = "split_lfu", *,
              sequences: "Sequence[int] | None" = None, **options) -> BoundGap:
    """Replay ``strategy`` on ``trace`` (or the ``sequences`` listed) with ``options`` (``expert_budget``,
    ``hardware``, ``cost_shape``, … as :func:`~specter_lab.analysis.replay.replay` takes them) and split its
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
    variant (at three leads and two initial sets) once for the cell (``options``: the cell's ``expert_budget``,
    ``hardware``, ``cost_shape``, …)."""
    plain = {_plain(s): v for s, v in rows.items()}
    if not plain:
        return []
    evictions = {st.name: _online(options.get("eviction", st.eviction)) for st in plain}
    bounds = trace_bound(trace, "lru", sequences=sequences, **options)  # plain rows share the cell's pool
    # the split's steps: how far ahead copies may start, then the initial set
    steps = {"online": (None, "clairvoyant"), "token": (math.inf, "clairvoyant"), "router": (0, "clairvoyant"),
             "start": (0, "prompt")}
    online = {(e, k): _mean(b.tpot_ms for b in trace_bound(trace, "lru", sequences=sequences, evict=e, lead=lead,
                                                          initial=initial, **options))
              for e in sorted(set(evictions.values())) for k, (lead, initial) in steps.items()}
    _, info = replay_setup(trace, "lru", check=False, **options)
    lookups = sum(l.top_k for l in info.layers)  # per decode token: one per routed slot of every MoE layer
    bound_ms = _mean(b.tpot_ms for b in bounds)
    bound_hit = 1 - _mean(b.misses / b.tokens for b in bounds) / lookups
    what = f"simulated; {bounds[0].assumptions}" if bounds else ""
    schedule = Counter(b.schedule for b in bounds).most_common(1)[0][0] if bounds else ""
    return [BoundGap(st.name, tpot, bound_ms, online[evictions[st.name], "online"], evictions[st.name], hit,
                     bound_hit, schedule, what, *(online[evictions[st.name], k] for k in ("token", "router", "start")))
            for st, (tpot, hit) in plain.items()]


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


def _online(eviction: str) -> str:
    """The bound's online variant that evicts as ``eviction`` does (:data:`~.bound.EVICTIONS`), else the fallback."""
    return eviction if eviction in EVICTIONS[1:] else _FALLBACK
