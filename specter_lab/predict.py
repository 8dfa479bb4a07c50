"""Routing forecasts and the prefetch planner.

* :class:`WindowForecast` – per-layer counts of the draft's top-k over the tokens drafted so far in a window
  (the paper's counters), with the first draft step that routed to each expert (for furthest-next-use eviction).
* :class:`LookaheadPlanner` – the paper's multi-step lookahead: at chunk boundaries prefetch the top-M experts
  per layer (M = that layer's slots), layer by layer, protecting the predicted ones from each other. The first
  boundary comes after ⌊0.2·K⌋ draft steps; the next after ⌈bytes issued / (bandwidth · draft-step time)⌉ more
  steps, both running averages: just enough drafting to hide the copies just issued.
  ``chunking="budgeted"`` (beyond the paper) replaces it: after every draft step, issue only the copies the copy
  stream can finish in time, most likely first, never evicting a more likely forecast expert.
* :class:`KGovernor` – ``k="auto"``: decides after every draft step whether one more draft token pays.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

__all__ = ["WindowForecast", "LookaheadPlanner", "KGovernor"]


class WindowForecast:
    """What the draft (or the oracle) says each layer will need in this window."""

    def __init__(self, num_layers: int) -> None:
        self.counts = [Counter() for _ in range(num_layers)]
        self.first = [dict() for _ in range(num_layers)]
        self.steps = 0

    def add(self, routing: dict[int, np.ndarray], step: int | None = None) -> None:
        s = self.steps if step is None else step
        for layer, idx in routing.items():
            for e in idx.reshape(-1).tolist():
                self.counts[layer][e] += 1
                self.first[layer].setdefault(e, s)
        self.steps += 1

    def top(self, layer: int, m: int) -> list[int]:
        """Top-m experts by count; ties go to the one the draft needed first."""
        first = self.first[layer]
        ranked = sorted(self.counts[layer].items(), key=lambda kv: (-kv[1], first[kv[0]], kv[0]))
        return [e for e, _ in ranked[:m]]

    def next_use(self, layer: int, expert: int) -> float:
        """For eviction: sooner-needed and more-often-needed experts score lower (kept longer)."""
        c = self.counts[layer].get(expert, 0)
        return math.inf if c == 0 else self.first[layer][expert] - c / 1e3

    def union_size(self) -> int:
        return sum(len(c) for c in self.counts)


@dataclass
class LookaheadPlanner:
    """The paper's prefetch planner over one store. ``chunking`` is ``"adaptive"`` or draft fractions."""

    store: object
    cost: object
    chunking: str | tuple[float, ...] = "adaptive"
    first_fraction: float = 0.2
    protect: bool = True
    step_time_avg: float | None = None  # running average of one draft step (s)
    bandwidth_avg: float | None = None  # running average of effective copy bandwidth (bytes/s)
    next_boundary: int = 0
    _fraction_steps: list[int] = field(default_factory=list)
    bytes_issued: int = 0
    k: int = 8  # draft length of the current window
    shared_slots: bool = False  # rebalance the slot pool across layers by forecast demand at each boundary

    def begin_window(self, k: int) -> None:
        self.bytes_issued = 0
        self.k = k
        if self.chunking == "budgeted":
            self.next_boundary = 1
            self._fraction_steps = []
        elif self.chunking == "adaptive":
            self.next_boundary = max(1, math.floor(self.first_fraction * k))
            self._fraction_steps = []
        else:
            self._fraction_steps = sorted({max(1, math.floor(f * k)) for f in self.chunking})
            self.next_boundary = self._fraction_steps.pop(0)

    def observe_step(self, seconds: float) -> None:
        a = 0.2
        self.step_time_avg = seconds if self.step_time_avg is None else (1 - a) * self.step_time_avg + a * seconds

    def due(self, steps_done: int) -> bool:
        return self.next_boundary > 0 and steps_done >= self.next_boundary

    def rebalance(self, forecast: WindowForecast) -> int:
        """Beyond the paper: share the slot pool across layers by forecast demand. Each layer's target is its
        share of the pool in proportion to the distinct experts the forecast says it will need (at least one);
        slots move from layers above target to layers below, evicting what the forecast does not need. Returns
        the number of slots moved."""
        store = self.store
        sizes = [s.size for s in store.slots]
        total = sum(sizes)
        demand = [max(1, len(c)) for c in forecast.counts]
        raw = [total * d / sum(demand) for d in demand]
        target = [max(1, int(r)) for r in raw]
        # hand out what flooring left, largest remainders first; take back any excess from the largest
        for l in sorted(range(len(raw)), key=lambda l: raw[l] - int(raw[l]), reverse=True)[: max(0, total - sum(target))]:
            target[l] += 1
        while sum(target) > total:
            target[max(range(len(target)), key=lambda l: target[l])] -= 1
        moved = 0
        donors = [l for l in range(len(sizes)) if sizes[l] > target[l]]
        for dst in range(len(sizes)):
            while store.slots[dst].size < target[dst] and donors:
                src = donors[0]
                # the donor keeps its most likely experts, as many as its target: the rest may go
                if not store.move_slot(src, dst, protected=set(forecast.top(src, target[src]))):
                    donors.pop(0)
                    continue
                moved += 1
                if store.slots[src].size <= target[src]:
                    donors.pop(0)
        return moved

    def boundary(self, steps_done: int, forecast: WindowForecast, issue_at=None) -> int:
        """Prefetch top-M per layer, layer by layer. Returns bytes issued and schedules the next boundary."""
        if self.shared_slots:  # at every boundary: the forecast's picture of demand sharpens as drafting goes on
            self.rebalance(forecast)
        if self.chunking == "budgeted":
            return self.budgeted(steps_done, forecast, issue_at)
        issued = 0
        for layer in range(len(forecast.counts)):
            m = self.store.slots[layer].size
            top = forecast.top(layer, m)
            protect = set(top) if self.protect else set()
            for e in top:
                if self.store.prefetch(layer, e, protected=protect, issue_at=issue_at):
                    issued += self.cost.expert_bytes
        self.bytes_issued += issued
        copy_bw = self.cost.expert_bytes / self.cost.copy_time(self.cost.expert_bytes)
        self.bandwidth_avg = copy_bw if self.bandwidth_avg is None else 0.8 * self.bandwidth_avg + 0.2 * copy_bw
        if self.chunking == "adaptive":
            step = self.step_time_avg or 1e-4
            hide = math.ceil(issued / (self.bandwidth_avg * step)) if issued else 1
            self.next_boundary = steps_done + max(1, hide)
        else:
            self.next_boundary = self._fraction_steps.pop(0) if self._fraction_steps else 0
        return issued


    def budgeted(self, steps_done: int, forecast: WindowForecast, issue_at=None) -> int:
        """Beyond the paper: bandwidth-aware prefetch, run after every draft step.

        Issues, most likely first (forecast count, then earlier layer: verification needs it sooner), only the
        copies the copy stream can finish before verification reaches their layer if drafting runs its course,
        and evicts only experts the forecast says are *less* likely than the one coming in (or not forecast)."""
        store, cost = self.store, self.cost
        clock = store.clock
        if clock.kind != "simulated":
            return self._budgeted_unclocked(steps_done, forecast, issue_at)
        now = clock.now() if issue_at is None else issue_at
        step = self.step_time_avg or 1e-4
        draft_end = now + max(0, self.k - steps_done) * step
        n_layers = len(forecast.counts)
        copy_t = max(clock.copy_t, now)
        t_copy = cost.copy_time(cost.expert_bytes)
        per_layer_verify = cost.dense_layer_time(self.k + 1, 0)
        cands = sorted(((c, -l, e) for l in range(n_layers) for e, c in forecast.counts[l].items()
                        if store.lookup(l, e) is None), reverse=True)
        issued = 0
        for c, neg_l, e in cands:
            layer = -neg_l
            deadline = draft_end + layer * per_layer_verify
            if copy_t + t_copy > deadline:
                continue  # would not arrive in time: a demand load later costs the same and evicts nothing early
            more_likely = {x for x, cx in forecast.counts[layer].items() if cx >= c}
            if store.prefetch(layer, e, protected=more_likely, issue_at=issue_at):
                issued += cost.expert_bytes
                copy_t += t_copy
        self.bytes_issued += issued
        self.next_boundary = steps_done + 1
        return issued

    def _budgeted_unclocked(self, steps_done, forecast, issue_at) -> int:
        # On a real clock we cannot read the copy stream's position without a sync: issue at most what one draft
        # step hides (cost-model estimate), most likely first, with the same eviction rule.
        step = self.step_time_avg or 1e-3
        budget = max(1, int(step / self.cost.copy_time(self.cost.expert_bytes)))
        cands = sorted(((c, -l, e) for l in range(len(forecast.counts)) for e, c in forecast.counts[l].items()
                        if self.store.lookup(l, e) is None), reverse=True)[:budget]
        issued = 0
        for c, neg_l, e in cands:
            more_likely = {x for x, cx in forecast.counts[-neg_l].items() if cx >= c}
            if self.store.prefetch(-neg_l, e, protected=more_likely, issue_at=issue_at):
                issued += self.cost.expert_bytes
        self.next_boundary = steps_done + 1
        return issued


@dataclass
class KGovernor:
    """``k="auto"``: keep drafting while a longer window is expected to lower the time per committed token.

    Model of a window of K drafted tokens, every term measured on this run rather than assumed:

        E[tokens](K) = 1 + Σ_{i≤K} Π_{m≤i} α_m                  committed tokens; α_m = acceptance at depth m
        T(K)         = K · t_draft + t_verify(K+1, D(K+1)) + x · t_copy · U(K)
        U(K)         = U(j) + m · Σ_layers [D_l(K+1) − D_l(j+1)] experts the window will copy

    * ``α_m`` is the acceptance of the m-th draft token given the ones before it were accepted, counted per
      depth (decayed counts, shrunk towards the pooled rate). Acceptance is bursty — in a run of easy or
      repeated text the draft is right many times in a row — so deep tokens are accepted more often than a
      single i.i.d. rate predicts, and a geometric model undervalues long windows.
    * ``D_l(n)``: mean number of distinct experts that n consecutive tokens route to in layer l, measured on
      the target's routing of the prompt and the recent committed tokens (a sliding window over a continuous
      history, so it does not depend on the K drafted so far). It prices both the copies (``U``) and the
      verification pass (``t_verify``).
    * ``U(j)`` is what the forecast says is still missing after j draft steps; ``m`` the fraction of the
      forecast not resident (how likely a newly needed expert is a copy); ``x`` the exposed fraction of copy
      time, measured per window as stall / (copies · t_copy) on the simulated clock (prefetches during
      drafting and copy/compute overlap hide part of it).
    * Every ``explore_every``-th window drafts to ``k_max`` regardless, so depths the model would never
      choose still get measured: an estimate learnt only from short windows would keep the governor short.
      ``optimism`` (off by default) is the textbook alternative, an upper-confidence bonus
      ``optimism / sqrt(reach_m + prior)`` on acceptance at rarely reached depths. At 0.2 it was better on most
      settings tried but failed badly on a T4 link at budget 1.0 (6.35 ms against 3.97): one early rejection at
      depth 4 left it drafting 3 tokens for the rest of the run, never looking deeper again. The fixed exploring
      window has no such trap.

    The first version (one i.i.d. α, a fitted power-law union growth, top_k new experts per verified token)
    settled at K≈3–6 on the bundled model where a fixed K=16 was fastest. After every draft step j we minimise
    T(K)/E(K) over K ∈ [j, k_max] and draft on iff the minimum lies beyond j.
    """

    k_max: int = 16
    k_min: int = 1
    alpha: float = 0.8  # pooled per-token acceptance (EMA); the prior for depths with few observations
    ema: float = 0.3
    history: int = 64  # committed tokens of routing kept for the distinct-experts curve
    refresh_every: int = 4  # windows between curve recomputations (numpy, but not free on deep models)
    explore_every: int = 4  # every n-th window drafts to k_max (0: never)
    decay: float = 0.97  # per-window decay of the depth counts (routing and text drift)
    prior: float = 2.0  # pseudo-observations of the pooled rate at each depth
    exposure: float = 1.0  # exposed fraction of copy time (EMA over windows)
    optimism: float = 0.0  # upper-confidence bonus on acceptance at rarely-reached depths (off: see above)
    _hist: list = field(default_factory=list, repr=False)  # per committed token: [layers] arrays of expert ids
    _curve: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 2, layers]: D_l(n), n = 0..k_max+1
    _reach: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 1]: depth i drafted, all before accepted
    _acc: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 1]: depth i accepted
    _windows: int = 0
    exploring: bool = False

    def __post_init__(self) -> None:
        self._reach = np.zeros(self.k_max + 1)
        self._acc = np.zeros(self.k_max + 1)

    # ------------------------------------------------------------------ observations
    def new_sequence(self) -> None:
        """A new generate(): its prompt's routing replaces the token history (the curve is about consecutive
        tokens of one text); acceptance-by-depth and exposure carry over."""
        self._hist.clear()
        self._curve = None

    def begin_window(self) -> None:
        self._windows += 1
        self.exploring = bool(self.explore_every) and self._windows % self.explore_every == 0

    def update_acceptance(self, accepted: int, drafted: int) -> None:
        if drafted:
            # Per-token acceptance of a chain: `accepted` successes then at most one failure (the first
            # rejection ends the window), so the estimate is accepted / (accepted + failures), not / drafted.
            failures = 1 if accepted < drafted else 0
            rate = accepted / (accepted + failures) if accepted + failures else self.alpha
            self.alpha = (1 - self.ema) * self.alpha + self.ema * min(rate, 0.98)
            self._reach *= self.decay
            self._acc *= self.decay
            reached = min(drafted, accepted + 1, self.k_max)
            self._reach[1: reached + 1] += 1
            self._acc[1: min(accepted, self.k_max) + 1] += 1

    def observe_routing(self, per_layer: list, committed: int) -> None:
        """Feed the verification pass's routing (per layer, an int array [T, top_k] over the window's inputs);
        its first ``committed`` rows are tokens that stay in the sequence."""
        if not per_layer or committed <= 0:
            return
        for t in range(committed):
            self._hist.append([np.asarray(r[t]).reshape(-1) for r in per_layer])
        del self._hist[: max(0, len(self._hist) - self.history)]
        if self._curve is None or self._windows % self.refresh_every == 0:
            self._curve = distinct_experts_curve(self._hist, self.k_max + 1)

    def observe_window(self, copies: int, stall: float, t_copy: float) -> None:
        """One finished window's copies and total stall (seconds): how much of the copy time was exposed."""
        if copies > 0 and t_copy > 0:
            x = min(max(stall / (copies * t_copy), 0.0), 1.5)
            self.exposure = (1 - self.ema) * self.exposure + self.ema * x

    # ------------------------------------------------------------------ model
    def depth_acceptance(self) -> np.ndarray:
        """α_m for m = 1..k_max (index 0 unused): per-depth counts shrunk towards the pooled rate."""
        a = (self._acc + self.prior * self.alpha) / (self._reach + self.prior)
        if self.optimism:
            a = a + self.optimism / np.sqrt(self._reach + self.prior)
        return np.clip(a, 0.0, 0.995)

    def _expected(self) -> np.ndarray:
        """E[tokens](K) for K = 0..k_max: 1 + Σ_{i≤K} Π_{m≤i} α_m."""
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.depth_acceptance()[1:]))])

    def expected_tokens(self, k: int) -> float:
        return float(self._expected()[k])

    def _distinct(self, n: int) -> "np.ndarray | None":
        c = self._curve
        if c is None or len(c) <= 1:
            return None
        return c[min(n, len(c) - 1)]

    def _growth(self, j: int, k: int) -> float:
        """Σ_layers D_l(k+1) − D_l(j+1): expected new distinct experts from drafting k instead of j tokens."""
        hi, lo = self._distinct(k + 1), self._distinct(j + 1)
        return 0.0 if hi is None else float(hi.sum() - lo.sum())

    def costs(self, j: int, t_draft: float, t_verify, t_copy: float, uncovered_now: int,
              miss_fraction: float = 1.0) -> dict[int, float]:
        """Predicted time per committed token for each K in [j, k_max]. ``t_verify``: seconds, or a function
        ``(n_tokens, distinct_per_layer or None) -> seconds``."""
        out, expected = {}, self._expected()
        for k in range(j, self.k_max + 1):
            tv = t_verify(k + 1, self._distinct(k + 1)) if callable(t_verify) else t_verify
            grown = uncovered_now + miss_fraction * self._growth(j, k)
            out[k] = (k * t_draft + tv + self.exposure * t_copy * grown) / expected[k]
        return out

    def best_k(self, j: int, t_draft: float, t_verify, t_copy: float, uncovered_now: int,
               miss_fraction: float = 1.0) -> int:
        c = self.costs(j, t_draft, t_verify, t_copy, uncovered_now, miss_fraction)
        return min(c, key=c.get)

    def keep_drafting(self, j: int, t_draft: float, t_verify, t_copy: float, uncovered_now: int,
                      miss_fraction: float = 1.0) -> bool:
        if j < self.k_min:
            return True
        if j >= self.k_max:
            return False
        if self.exploring:
            return True
        if self._curve is None:  # no routing seen yet (no prompt routing either): the paper's K=8
            return j < min(8, self.k_max)
        return self.best_k(j, t_draft, t_verify, t_copy, uncovered_now, miss_fraction) > j


def distinct_experts_curve(history: list, n_max: int) -> np.ndarray:
    """``D[n, l]``: mean number of distinct experts that n consecutive tokens of ``history`` route to in layer l
    (n = 0..n_max; windows longer than the history reuse the longest measured value). ``history`` is a list of
    tokens, each a list over layers of expert-id arrays."""
    H = len(history)
    if H == 0:
        return np.zeros((1, 0))
    L = len(history[0])
    E = 1 + max(int(a.max()) for tok in history for a in tok if a.size)
    onehot = np.zeros((H, L, E), dtype=bool)
    for t, tok in enumerate(history):
        for layer, ids in enumerate(tok):
            onehot[t, layer, ids] = True
    curve = np.zeros((n_max + 1, L))
    cur = onehot.copy()  # cur[s] = union of tokens s .. s+n-1
    for n in range(1, n_max + 1):
        if n > H:
            curve[n] = curve[n - 1]
            continue
        if n > 1:
            cur = cur[:-1] | onehot[n - 1:]
        curve[n] = cur.sum(-1).mean(0)
    return curve
