"""The lookahead prefetcher: when, during drafting, to copy which forecast experts.

The paper's multi-step lookahead: at chunk boundaries prefetch the top-M experts per layer (M = that layer's
slots), layer by layer, protecting the predicted ones from each other. The first boundary comes after ⌊0.2·K⌋
draft steps; the next after ⌈bytes issued / (bandwidth · draft-step time)⌉ more steps, both running averages:
just enough drafting to hide the copies just issued. ``chunking="budgeted"`` (beyond the paper) replaces it:
after every draft step, issue only the copies the copy stream can finish in time, most likely first, never
evicting a more likely forecast expert. ``chunking="stall"`` (Fate, PreScope) ranks the copies across layers by
the stall each is expected to save at verification instead of by likelihood, and issues none that would still
wait for the link when verification starts, when the link is needed for its demand copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..offload.schedule import host_lane_time
from .forecast import WindowForecast

if TYPE_CHECKING:  # annotations only: the prefetcher is handed a store and a cost model, it builds neither
    from ..pricing.cost import CostModel
    from ..offload.store import ExpertStore

__all__ = ["LookaheadPrefetcher"]


@dataclass
class LookaheadPrefetcher:
    """The paper's prefetch schedule over one store. ``chunking`` is ``"adaptive"``, ``"budgeted"`` or draft fractions."""

    store: "ExpertStore"
    cost: "CostModel"
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
    min_count: int = 1  # prefetch only experts the window's forecast routes at least this often (host execution
    #                     computes the one-offs on the host instead)
    host_misses: bool = False  # a miss at verification may run on the host (prices what a prefetch saves: "stall")

    def begin_window(self, k: int) -> None:
        self.bytes_issued = 0
        self.k = k
        if self.chunking in ("budgeted", "stall"):
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
        if self.chunking == "stall":
            return self.by_stall(steps_done, forecast, issue_at)
        issued = 0
        for layer in range(len(forecast.counts)):
            m = self.store.slots[layer].size
            top = [e for e in forecast.top(layer, m) if forecast.counts[layer].get(e, 0) >= self.min_count]
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


    def _window_times(self, steps_done: int, issue_at=None):
        """(now, draft step, drafting's end, when the copy lane frees, one copy, one layer's verification) in
        seconds, what :meth:`budgeted` and :meth:`by_stall` schedule by; None on a clock whose copy lane cannot
        be read mid-run."""
        clock, cost = self.store.clock, self.cost
        free = clock.copy_free_at()
        if free is None:
            return None
        now = clock.now() if issue_at is None else issue_at
        step = self.step_time_avg or 1e-4
        return (now, step, now + max(0, self.k - steps_done) * step, max(free, now),
                cost.copy_time(cost.expert_bytes), cost.dense_layer_time(self.k + 1, 0))

    def budgeted(self, steps_done: int, forecast: WindowForecast, issue_at=None) -> int:
        """Beyond the paper: bandwidth-aware prefetch, run after every draft step.

        Issues, most likely first (forecast count, then earlier layer: verification needs it sooner), only the
        copies the copy stream can finish before verification reaches their layer if drafting runs its course,
        and evicts only experts the forecast says are *less* likely than the one coming in (or not forecast)."""
        store, cost = self.store, self.cost
        window = self._window_times(steps_done, issue_at)
        if window is None:  # a real clock: the copy lane's position cannot be read mid-run
            return self._budgeted_unclocked(steps_done, forecast, issue_at)
        now, step, draft_end, copy_t, t_copy, per_layer_verify = window
        issued = 0
        last_deadline = draft_end + (len(forecast.counts) - 1) * per_layer_verify
        more_likely: dict[tuple[int, int], set[int]] = {}  # (layer, count) → the layer's experts forecast as often
        # a per-layer pool where every resident is more likely than c holds no slot for c' <= c either (what a
        # prefetch puts in is more likely too): skip the layer's later candidates (a global pool lends across
        # layers, so there it is asked each time)
        full: set[int] = set()
        ranked = self._ranked(forecast) if copy_t + t_copy <= last_deadline else []  # else nothing would fit
        for c, layer, e in ranked:
            if copy_t + t_copy > last_deadline:
                break  # nothing more can arrive in time for any layer (copy_t only grows)
            deadline = draft_end + layer * per_layer_verify
            if copy_t + t_copy > deadline or layer in full:
                continue  # would not arrive in time: a demand load later costs the same and evicts nothing early
            keep = more_likely.get((layer, c))
            if keep is None:
                keep = more_likely[layer, c] = {x for x, cx in forecast.counts[layer].items() if cx >= c}
            if store.prefetch(layer, e, protected=keep, issue_at=issue_at):
                issued += cost.expert_bytes
                copy_t += t_copy
            elif store.pool == "layer":
                full.add(layer)
        self.bytes_issued += issued
        self.next_boundary = steps_done + 1
        return issued

    def stall_saved(self, n: int) -> float:
        """Seconds verification is expected to save when an expert it routes ``n`` tokens to is resident rather
        than missed: a demand copy (``copy_time``) without host execution, else the cheaper of the copy and the host
        lane (the split's two ways to serve a miss), each less the device time the hit costs anyway."""
        c = self.cost
        hit = c.expert_time(n)
        copy = c.copy_time(c.expert_bytes) + hit
        miss = min(copy, host_lane_time(c, n)) if self.host_misses else copy
        return max(0.0, miss - hit)

    def by_stall(self, steps_done: int, forecast: WindowForecast, issue_at=None) -> int:
        """Prefetch across layers by expected stall saved (Fate, PreScope), run after every draft step.

        Candidates are the forecast experts not resident, ranked by :meth:`stall_saved` at their forecast token
        count (ties: earlier layer, then higher expert id); each is issued if it lands before verification reaches
        its layer and evicts only experts expected to save at least as much. "Cancelled when the link is needed":
        a copy that would not have *started* by the time verification begins is not issued (verification's demand
        copies need the link then; a copy already on the link runs to its end, as a DMA does). On a clock whose copy
        lane cannot be read mid-run this is :meth:`budgeted`'s unclocked form."""
        store, cost = self.store, self.cost
        window = self._window_times(steps_done, issue_at)
        if window is None:  # a real clock: the copy lane's position cannot be read mid-run
            return self._budgeted_unclocked(steps_done, forecast, issue_at)
        now, step, draft_end, copy_t, t_copy, per_layer_verify = window
        saved = {}  # token count → seconds saved (a handful of distinct counts per window)
        cands = []
        for layer, counts in enumerate(forecast.counts):
            where = store.slots[layer].where
            for e, c in counts.items():
                if e not in where:
                    if c not in saved:
                        saved[c] = self.stall_saved(c)
                    cands.append((saved[c], -layer, e))
        cands.sort(reverse=True)
        issued = 0
        for value, neg_layer, e in cands:
            if copy_t > draft_end or value <= 0:
                break  # would start after verification begins (the link is needed), or saves nothing
            layer = -neg_layer
            if copy_t + t_copy > draft_end + layer * per_layer_verify:
                continue  # would land after verification reached its layer
            keep = {x for x, cx in forecast.counts[layer].items()
                    if saved.setdefault(cx, self.stall_saved(cx)) >= value}
            if store.prefetch(layer, e, protected=keep, issue_at=issue_at):
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
        issued = 0
        for c, layer, e in self._ranked(forecast)[:budget]:
            more_likely = {x for x, cx in forecast.counts[layer].items() if cx >= c}
            if self.store.prefetch(layer, e, protected=more_likely, issue_at=issue_at):
                issued += self.cost.expert_bytes
        self.next_boundary = steps_done + 1
        return issued

    def _ranked(self, forecast: WindowForecast) -> list[tuple[int, int, int]]:
        """(count, layer, expert) of the forecast experts not resident: most likely first, then earlier layer
        (verification needs it sooner), then higher expert id (a fixed tie-break)."""
        cands = []
        for l, counts in enumerate(forecast.counts):  # runs after every draft step: one comprehension per layer
            where = self.store.slots[l].where
            cands += [(c, -l, e) for e, c in counts.items() if e not in where]
        cands.sort(reverse=True)
        return [(c, -neg_l, e) for c, neg_l, e in cands]


