"""The schedule of one MoE layer: what happens to every routed expert, decided and priced from the routing alone.

For each layer of each forward the :class:`LayerSchedule` decides, from the routing's per-expert token counts,
whether an expert is resident (a hit), demand-copied, streamed through a slot, computed on the host, prefetched
for the next layer, or evicted; it puts every op on the clock and writes every trace record. It never touches
a hidden state: the tensor work is handed to it as callables (:class:`ExpertMath`), which it runs inside the
clock's ops so that on a GPU each kernel is issued between its events. Without them (``math=None``) the same
code prices a layer from a routing array alone, with a tensorless store: what a replay of a recorded routing
runs.

Contributions are computed per expert here and summed by the caller (:mod:`specter_lab.offload.runtime`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Container, Literal, Protocol, Sequence

import numpy as np

from .clock import Span, stamper
from .hostexec import MissRule
from .refresh import Refresh

__all__ = ["ForwardInfo", "LayerSchedule", "ExpertMath", "DraftSource", "HOOK_POINTS", "counts_of", "rank_prediction",
           "host_lane_time"]

HOOK_POINTS = ("moe.routing",)  # fn(info: ForwardInfo, layer: int, top_k_ids: np.ndarray [T, k])


@dataclass
class ForwardInfo:
    """One model forward as the runtime sees it: the decode step it belongs to, its mode and phase, ``pos0``
    (tokens already in the cache when it started) and ``routing`` (layer → top-k ids ``[T, k]`` of this
    forward, filled in by the runtime)."""

    step: int
    mode: str  # target | draft | shadow
    phase: str  # prefill | decode | draft | verify | recompute | shadow
    pos0: int
    routing: dict[int, np.ndarray] = field(default_factory=dict)
    record: bool = True  # False: leave no trace (the lossless guard's reference pass)


# Where a draft's routed experts come from (the table in :mod:`specter_lab.run.drafts`): the schedule is what
# acts on it, so the type lives here, one floor below the draft's spec.
DraftVariant = Literal["quantized", "resident", "hybrid", "host"]


@dataclass
class DraftSource:
    """Where the draft's routed experts come from (see :mod:`specter_lab.run.drafts`): ``variant``, the low-bit
    experts (quantized / hybrid), what one such expert costs to read, and the hybrid set size per layer."""

    variant: DraftVariant = "quantized"
    experts: object | None = None  # DraftExperts
    expert_bytes: float = 0.0
    hybrid_size: int = 0
    # hybrid: builds the low-bit copies of just the chosen sets (per layer), so the device holds what the budget
    # charges (hybrid_size experts per layer), not a low-bit copy of every expert
    build: Callable[[list[set[int]]], object] | None = None

    def weights(self, layer: int, e: int):
        return self.experts.weights(layer, e) if self.experts is not None else None


class ExpertMath(Protocol):
    """The tensor work of one layer, as callables the schedule runs inside its clock ops."""

    def device(self, e: int, weights) -> Callable[[], Any]:
        """Expert ``e`` on its tokens with device ``weights`` (a slot's views or low-bit copies)."""

    def host(self, e: int, weights) -> Callable[[], Any]:
        """Expert ``e`` on its tokens on the host CPU with host ``weights``."""

    def gate_prediction(self, layer: int) -> list[tuple[int, int]]:
        """Layer ``layer``'s router applied to this layer's hidden state: (expert, tokens), most routed first."""


def rank_prediction(ids: np.ndarray) -> list[tuple[int, int]]:
    """(expert, tokens) of a predicted routing ``[T, k]``, most routed first, ties in ascending expert order."""
    if ids.shape[0] == 1:  # one token: k distinct ids, one each (no np.unique: this runs per layer of a replay)
        row = sorted(ids[0].tolist())
        if len(set(row)) == len(row):
            return [(e, 1) for e in row]
    uniq, counts = np.unique(ids, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return [(int(uniq[i]), int(counts[i])) for i in order]


def counts_of(idx: np.ndarray) -> dict[int, int]:
    """Routed tokens per expert of a layer's top-k ids ``[T, k]``, in ascending expert order (-1: not recorded)."""
    if idx.shape[0] == 1:  # one token (decode, a draft step): k distinct ids, no counting needed
        row = sorted(e for e in idx[0].tolist() if e >= 0)
        if len(set(row)) == len(row):
            return dict.fromkeys(row, 1)
    if idx.size > 256:  # a prefill's thousands of ids: counted by numpy
        uniq, n = np.unique(idx[idx >= 0], return_counts=True)
        return dict(zip(uniq.tolist(), n.tolist()))
    c = Counter(e for e in idx.ravel().tolist() if e >= 0)  # a verification's few dozen ids: faster than np.unique
    return {e: c[e] for e in sorted(c)}


class LayerSchedule:
    """Decides and prices every routed expert of every layer: store, clock, cost, trace, miss rule, draft."""

    def __init__(self, info, store, clock, cost, trace, miss: MissRule, draft: DraftSource | None = None,
                 gate_lookahead: bool = False, host_layers: Sequence[int] = (),
                 host_weights: "list[dict[str, Any]] | None" = None, host_weight_bytes: float | None = None,
                 refresh: Refresh | None = None) -> None:
        self.info = info
        self.store = store
        self.clock = clock
        self.cost = cost
        self.trace = trace
        self.miss = miss
        self.draft = draft or DraftSource()
        self.gate_lookahead = gate_lookahead
        self.host_layers = set(host_layers)  # static split: every expert of these layers runs on the host
        self.host_weights = host_weights if host_weights is not None else store.host
        self.host_weight_bytes = host_weight_bytes  # host copies in another precision (Engine(host_dtype=))
        self.refresh = refresh  # popular experts copied on an idle link (offload/refresh.py)
        self.hybrid_sets: list[set[int]] = [set() for _ in info.layers]  # hybrid draft: experts with low-bit copies
        self.hooks: dict[str, list[Callable]] = {name: [] for name in HOOK_POINTS}
        self._stamp = stamper(clock, trace.full)
        self._named: dict[int, set[int]] = {}  # pre-gated: every expert the forecast named for a layer, this forward
        self._routed_memo: dict[tuple, list[float]] = {}  # verify_estimate's routed part by (n, distinct curve)
        self._host_times: dict[int, float] = {}  # host_time(n): asked per miss
        self._expert_time = _Memo(cost.expert_time)  # expert_time(n) by subscript: asked per expert
        # a low-bit draft expert's, likewise; a function of cost and draft, not a bound method: a memo holding
        # self would make the schedule (and the run's trace) a cycle that only the cyclic collector frees
        self._lowbit_times = _Memo(partial(_lowbit_time, cost, self.draft))

    # ------------------------------------------------------------------ entry
    def begin_forward(self) -> None:
        self._named = {}
        self.clock.mark_model_work()  # where the first dense span starts (measured clocks)

    def routed(self, fwd: ForwardInfo, layer: int, idx: np.ndarray) -> None:
        """Record one layer's routing of this forward (and call the ``moe.routing`` hooks)."""
        fwd.routing[layer] = idx
        if fwd.record:
            self.trace.routed("recompute" if fwd.phase == "recompute" else fwd.mode, layer, fwd.pos0, idx)
        for hook in self.hooks["moe.routing"]:
            hook(fwd, layer, idx)

    def layer(self, fwd: ForwardInfo, layer: int, counts: dict[int, int], n_tokens: int,
              math: ExpertMath | None = None) -> tuple[dict[int, Any], dict[int, Any]]:
        """Schedule one layer of a target or draft forward: returns (device outputs, host outputs) per expert
        (None values without ``math``)."""
        if fwd.mode == "draft":
            outs = self._draft(fwd, layer, counts, n_tokens, math)
        else:
            outs = self._target(fwd, layer, counts, n_tokens, math)
        self.clock.mark_model_work()
        return outs

    def model_span(self, duration: float) -> Span:
        """The model's own work since the last mark (attention, norms, router, shared experts, the LM head)."""
        return self.clock.model_span(duration)

    def _dense_span(self, fwd: ForwardInfo, layer: int, n_tokens: int, phase: str) -> None:
        self.trace.span(phase, layer, -1, self.model_span(self.cost.dense_layer_time(n_tokens, fwd.pos0, layer)))

    # ------------------------------------------------------------------ target
    def _target(self, fwd, layer, counts, n_tokens, math):
        store = self.store
        self._dense_span(fwd, layer, n_tokens, fwd.phase)
        now = self._stamp()
        ids = list(counts)
        if layer in self._named:  # the forecast made one layer ago, against what this layer asks for
            self.miss.forecast.observe(layer, self._named.pop(layer), ids)
        where = store.slots[layer].where
        resident = [e for e in ids if e in where]
        missing = [e for e in ids if e not in where]
        self.trace.cache_many(layer, resident, "hit", now)
        self.trace.cache_many(layer, missing, "miss", now)
        # Host execution: issue the host's experts first, so they run while the device computes its own.
        late = self._late(fwd, layer, resident, now)
        host = self._host_misses(fwd, layer, missing, counts, late)
        jobs = self._issue_host(fwd, layer, host, counts, now, math) if host else {}
        if jobs:
            for e in late.keys() & jobs.keys():
                store.host_used(layer, where[e], jobs[e][0].end)
            missing = [e for e in missing if e not in jobs]
            resident = [e for e in resident if e not in jobs]
        loaded, deferred = self._issue_demand(layer, counts, missing, now) if missing else ((), ())
        on_device = self._by_landing(layer, resident + loaded if loaded else resident, now)
        global_pool = store.pool == "global"
        if global_pool:
            store.pinned = {layer: set(on_device)}  # a global pool's prefetch for layer l+1 must not take them
        if self.gate_lookahead and math is not None and layer + 1 < self.info.num_layers:
            predicted = math.gate_prediction(layer + 1)
            if self._pregated(fwd):
                self._named[layer + 1] = {e for e, _ in predicted}
                predicted = self._worth_copying_ahead(fwd, layer, predicted, counts, on_device, jobs, now, n_tokens)
            self._gate_prefetch(layer + 1, predicted)
        outs = self._compute_all(fwd, layer, on_device, counts, math)
        if global_pool:
            store.pinned = {}
        # Fewer slots than experts: stream the rest through slots whose experts are done.
        pending = set(deferred)  # streamed ones leave it as they are computed
        for e in deferred:
            pending.discard(e)
            slot = store.load(layer, e, "demand", protected=pending, issue_at=now)
            if slot is None:
                raise RuntimeError(f"layer {layer}: no slot can be freed for expert {e} "
                                   f"(slots={store.slots[layer].size})")
            outs[e] = self._compute(fwd, layer, e, counts[e], slot, math)
        host_outs = self._join_host(fwd, layer, jobs) if jobs else {}
        if self.refresh is not None:
            self._refresh(fwd, layer, counts)
        return outs, host_outs

    def _compute_all(self, fwd, layer: int, experts: list[int], counts, math) -> dict[int, Any]:
        """:meth:`_compute` of each resident expert in turn, with one trace and one store call for the layer (this
        runs for every layer of a replay)."""
        store, clock, expert_time = self.store, self.clock, self._expert_time
        s = store.slots[layer]
        where, ready = s.where, s.ready
        slots = [where[e] for e in experts]
        if math is None or not store.materialize:  # priced only (a replay, its gate math too): no tensor work
            spans = clock.computes([expert_time[counts[e]] for e in experts], [ready[slot] for slot in slots])
            outs = dict.fromkeys(experts)
        else:
            outs, spans = {}, []
            for e, slot in zip(experts, slots):
                fn = math.device(e, store.weights(layer, slot))
                span, outs[e] = clock.compute(expert_time[counts[e]], fn, after=(ready[slot],))
                spans.append(span)
        self.trace.spans(fwd.phase, layer, experts, spans, [s.copy_id[i] for i in slots] if self.trace.full else None)
        store.used(layer, slots, spans)
        return outs

    def _compute(self, fwd, layer: int, e: int, n: int, slot: int, math):
        store = self.store
        fn = math.device(e, store.weights(layer, slot)) if math is not None else None
        span, out = self.clock.compute(self.cost.expert_time(n), fn, after=(store.ready(layer, slot),))
        self.trace.span(fwd.phase, layer, e, span, copy_id=store.copy_id(layer, slot) if self.trace.full else None)
        store.mark_used(layer, slot, span.end)
        return out

    def _issue_demand(self, layer: int, needed: "Container[int]", missing: list[int],
                      now) -> tuple[list[int], list[int]]:
        """Issue every demand copy that has a slot not needed by this layer, before computing anything, so the
        copies overlap the resident experts' compute. Returns (loaded, deferred for streaming). A forecast of this
        layer made one layer ago protects nothing now: what the layer needs is known, and an expert it named that
        is not needed is the cheapest victim (keeping it cost a pre-gated split up to 0.006 of the bound)."""
        loaded, deferred = [], []
        for i, e in enumerate(missing):
            slot = self.store.load(layer, e, "demand", protected=needed, issue_at=now)
            if slot is None:  # no free slot and every resident is needed: so for the rest too (loads only add
                deferred += missing[i:]  # needed ones), without a walk over every resident each (a prefill's)
                break
            loaded.append(e)
        return loaded, deferred

    def _gate_prefetch(self, nxt: int, predicted: list[tuple[int, int]]) -> None:
        """Pre-gated lookahead: prefetch what layer l+1's router picks on layer l's hidden state."""
        chosen = predicted[: self.store.slots[nxt].size]
        for e, c in chosen:
            self.trace.forecast_count(nxt, e, int(c))
        protect = {e for e, _ in chosen}
        for e, _ in chosen:
            self.store.prefetch(nxt, e, protected=protect)

    def _refresh(self, fwd, layer: int, counts) -> None:
        """After a decode layer: count its routing, and if the link is idle, copy the expert its recent tokens used
        most that is not resident, when :class:`Refresh` says it pays (:mod:`specter_lab.offload.refresh`)."""
        if self.refresh is None or fwd.phase != "decode" or layer in self.host_layers:
            return
        self.refresh.observe(layer, counts)
        if not self.clock.copy_idle(self.clock.now()):
            return
        s = self.store.slots[layer]
        full = -1 not in s.expert
        e = self.refresh.candidate(layer, s.where, self.store.victim(layer, counts) if full else None, full)
        if e is not None:
            self.store.prefetch(layer, e, protected=counts, reason="refresh")

    # ------------------------------------------------------------------ host execution
    def _pregated(self, fwd) -> bool:
        """Does this decode forward place its pre-gated prefetches (a split miss rule with ``pregated``)? Elsewhere
        gate lookahead prefetches every forecast expert."""
        return getattr(self.miss, "pregated", False) and fwd.phase != "prefill"

    def _readable(self, now) -> bool:
        """Can the schedule read copy and host times now, mid-run (the simulated clock; not CUDA's, unsynced)?"""
        return now is not None and self.clock.readable_midrun

    def _worth_copying_ahead(self, fwd, layer: int, predicted: list[tuple[int, int]], counts, on_device, jobs,
                             now, n_tokens: int) -> list[tuple[int, int]]:
        """The forecast of layer ``layer + 1`` cut to its residents and the misses the split would copy if their
        copies started now, ahead of that layer's router by this layer's remaining work (:meth:`_layer_left`) and
        the next dense part."""
        ahead = (self._layer_left(layer, counts, on_device, jobs, now)
                 + self.cost.dense_layer_time(n_tokens, fwd.pos0, layer + 1))
        keep = set(self.miss.copies_ahead(self, layer + 1, dict(predicted), ahead))
        where = self.store.slots[layer + 1].where
        return [(e, c) for e, c in predicted if e in keep or e in where]

    def _layer_left(self, layer: int, counts, on_device: list[int], jobs, now) -> float:
        """Seconds from ``now`` until this layer ends: the device computes ``on_device`` in that order, each after
        its copy lands, and waits for the host's experts. Where the clock cannot say mid-run, the device's own work
        stands for it (no copy waits, no host)."""
        cost, readable = self.cost, self._readable(now)
        s = self.store.slots[layer]
        t = 0.0
        for e in on_device:
            ready = s.ready[s.where[e]] if readable else None
            t = max(t, self.clock.elapsed(now, ready) if ready is not None else 0.0) + cost.expert_time(counts[e])
        if readable:
            t = max([t] + [self.clock.elapsed(now, span.end) for span, _ in jobs.values()])
        return t

    def _by_landing(self, layer: int, experts: list[int], now) -> list[int]:
        """The device's experts in the order their copies land: those landed first (in the given order), then the
        ones in flight in the order their copies were issued, which is the order they land on the one copy lane.
        So a prefetch still in flight does not hold up an expert that is ready; asked the same way on every clock
        (an event query on CUDA, no sync). The outputs are combined by the routing, not in this order."""
        if now is None and self.clock.readable_midrun:
            return experts
        s = self.store.slots[layer]
        is_ready, where, ready, copy_id = self.clock.is_ready, s.where, s.ready, s.copy_id
        readable = self.clock.readable_midrun  # handles compare as times: is_ready without a call per expert
        landed, in_flight = [], []
        for e in experts:
            slot = where[e]
            h = ready[slot]
            if h is None or (h <= now if readable else is_ready(h, now)):
                landed.append(e)
            else:
                in_flight.append((copy_id[slot], e))
        if not in_flight:  # the common case: nothing in flight
            return experts
        in_flight.sort()  # copy ids are unique: the order they were issued in
        return landed + [e for _, e in in_flight]

    def _late(self, fwd, layer: int, resident: list[int], now) -> dict[int, float]:
        """Residents whose copy (a prefetch still in flight) lands after ``now``: expert → seconds until it lands
        (only where pre-gated prefetches are placed, :meth:`_pregated`, on a clock readable mid-run: empty
        elsewhere, and there every resident waits for its copy)."""
        if not self._pregated(fwd) or not self._readable(now) or layer in self.host_layers:
            return {}
        out = {}
        for e in resident:
            h = self.store.ready(layer, self.store.slots[layer].where[e])
            if h is not None:
                wait = self.clock.elapsed(now, h)
                if wait > 0:
                    out[e] = wait
        return out

    def _host_misses(self, fwd, layer: int, missing: list[int], counts: dict[int, int],
                     late: "dict[int, float] | None" = None) -> list[int]:
        """The misses this forward computes on the host: every one on a host layer (static split); none in the
        prefill (its many tokens make a copy pay); else what the strategy's miss rule says. With ``late`` (a
        pre-gated split) the rule may also put a resident whose copy is still landing on the host; its lookup was
        a hit (it is resident) and its compute is a host expert."""
        if not missing and not late:
            return []
        if layer in self.host_layers:
            return list(missing)
        if fwd.phase == "prefill":
            return []
        if late:
            return self.miss.on_host(self, fwd, layer, missing, counts, late=late)
        return self.miss.on_host(self, fwd, layer, missing, counts)

    def host_time(self, n: int) -> float:
        """Host lane seconds for one expert on n tokens (:func:`host_lane_time`)."""
        t = self._host_times.get(n)
        if t is None:
            t = self._host_times[n] = host_lane_time(self.cost, n, self.host_weight_bytes)
        return t

    def _issue_host(self, fwd, layer: int, experts: list[int], counts, now, math, event: bool = True) -> dict:
        """Submit each host expert to the clock's host lane; returns expert → (span, job). ``event``: record the
        target's miss as served on the host (the draft's host experts are not cache requests)."""
        jobs = {}
        tier = self.store.tier if self.host_weights is self.store.host else None
        for e in experts:
            after, hslot = (), None
            if tier is not None:  # the disk tier: the host computes from its cache slot, read from disk on a miss
                weights, ready, hslot = tier.fetch(layer, e, "host", now)
                after = (ready,)
            else:
                weights = {n: h[e] for n, h in self.host_weights[layer].items()}
            fn = math.host(e, weights) if math is not None else None
            # the layer's first host expert also pays the activations' round trip, where the engine prices one
            trip = self.cost.host_trip_time(layer) if not jobs else 0.0
            jobs[e] = self.clock.host(self.host_time(counts[e]) + trip, fn if fn is not None else _nothing,
                                      after=after)
            if hslot is not None:
                tier.used(hslot, jobs[e][0].end)
            if event:
                self.trace.cache(layer, e, "host", now)
        return jobs

    def _join_host(self, fwd, layer: int, jobs: dict) -> dict:
        """Collect the host results (the device waits for any not done yet: a stall on the device lane)."""
        outs = {}
        for e, (span, job) in jobs.items():
            wait, outs[e] = self.clock.join_host(span, job)
            self.trace.span(fwd.phase, layer, e, span, lane="host")
            self.trace.span(fwd.phase, layer, -1, wait)  # the device waiting for it (zero width, a stall)
        return outs

    # ------------------------------------------------------------------ draft
    def choose_hybrid_sets(self, routing: dict[int, np.ndarray]) -> None:
        """Hybrid draft: after the prefill, give low-bit copies to the experts the prompt used most that are not
        resident (the fp cache already covers the resident ones), then to the next most used."""
        if not self.draft.hybrid_size:
            return
        for layer, idx in routing.items():
            counts = np.bincount(idx.reshape(-1), minlength=self.info.layers[layer].num_experts)
            resident = self.store.resident(layer)
            order = sorted(range(len(counts)), key=lambda e: (e in resident, -counts[e], e))
            self.hybrid_sets[layer] = set(order[: self.draft.hybrid_size])
        if self.draft.build is not None:
            self.draft.experts = self.draft.build(self.hybrid_sets)

    def _draft(self, fwd, layer, counts, n_tokens, math):
        """The draft's MoE layer. Variants (all lossless, the target verifies):

        * ``quantized`` – every expert from its resident low-bit copy (the paper);
        * ``resident``  – fp experts that are resident and ready *now*; absent ones are skipped (the caller
          renormalises each token's remaining router weights; no extra device memory);
        * ``hybrid``    – resident fp where ready, else a low-bit copy if the expert is in the hybrid set, else skip;
        * ``host``      – resident fp where ready, else computed on the host CPU from the host copy (priced by the
          profile's CPU fields).
        """
        self._dense_span(fwd, layer, n_tokens, "draft")
        if self.draft.variant == "quantized":  # the paper's draft: every expert from its low-bit copy, nothing else
            return self._lowbit_layer(layer, counts, math), {}
        now = self._stamp()
        plans = {e: self._draft_expert(layer, e, now) for e in counts}
        # the host variant's absent experts go to the host lane first, so they run beside the device's own
        jobs = self._issue_host(fwd, layer, [e for e, p in plans.items() if p == "host"], counts, now, math,
                                event=False)
        outs = {}
        for e, plan in plans.items():
            if plan is None or plan == "host":
                continue  # skipped (renormalised by the caller), or on the host
            weights, cost, slot = plan
            after = (self.store.ready(layer, slot),) if slot is not None else ()  # a no-op on the sim clock
            fn = math.device(e, weights) if math is not None else None
            span, outs[e] = self.clock.compute(cost(counts[e]), fn, after=after)
            self.trace.span("draft", layer, e, span)
            if slot is not None:
                self.store.note_read(layer, slot, span.end)
        return outs, self._join_host(fwd, layer, jobs)

    def _lowbit_layer(self, layer: int, counts: dict[int, int], math) -> dict[int, Any]:
        """Every routed expert of a draft layer from its resident low-bit copy: no slot, no wait, no host."""
        outs, spans, compute, lowbit_time = {}, [], self.clock.compute, self._lowbit_times
        for e, n in counts.items():
            fn = math.device(e, self.draft.weights(layer, e)) if math is not None else None
            span, outs[e] = compute(lowbit_time[n], fn)
            spans.append(span)
        self.trace.spans("draft", layer, list(counts), spans)
        return outs

    def _draft_expert(self, layer: int, e: int, now):
        """(weights, cost of n tokens, slot read or None) for draft expert e on the device, ``"host"`` to compute
        it on the host lane, or None to skip it (the resident, hybrid and host variants; the quantized draft takes
        :meth:`_lowbit_layer`)."""
        variant, store = self.draft.variant, self.store
        if variant == "hybrid" and e in self.hybrid_sets[layer] and not self.ready_now(layer, e, now):
            return self.draft.weights(layer, e), self._lowbit_times.__getitem__, None
        if self.ready_now(layer, e, now):
            slot = store.lookup(layer, e)
            return store.weights(layer, slot), self.cost.expert_time, slot
        return "host" if variant == "host" else None

    def ready_now(self, layer: int, expert: int, now) -> bool:
        """Is ``expert`` on the device and its copy landed by ``now``? A prefetch still in flight is not usable
        without a stall, and it is link time the window is still paying for: the clock says whether it landed."""
        slot = self.store.lookup(layer, expert)
        return slot is not None and self.clock.is_ready(self.store.ready(layer, slot), now)

    # ------------------------------------------------------------------ estimates
    def verify_estimate(self, n_tokens: int, context: int, distinct: "Sequence[float] | None" = None) -> float:
        """Cost-model time of a verification pass over n tokens with every expert resident (no stalls).

        ``distinct``: expected distinct experts per layer (the K governor's measured curve). Without it every
        token is assumed to bring top_k new experts, which overstates long windows: consecutive tokens share."""
        c = self.cost
        return sum([c.dense_layer_time(n_tokens, context, i) + x
                    for i, x in enumerate(self._routed_estimate(n_tokens, distinct))]) + c.head_time(n_tokens, context)

    def _routed_estimate(self, n_tokens: int, distinct) -> list[float]:
        """Per layer, the routed experts' part of :meth:`verify_estimate` (no context in it: the K governor asks
        for the same few (n, curve) at every draft step, with a context one longer each time)."""
        key = (n_tokens, None if distinct is None else np.asarray(distinct, dtype=float).tobytes())
        out = self._routed_memo.get(key)
        if out is None:
            if len(self._routed_memo) > 4096:
                self._routed_memo.clear()
            d = [] if distinct is None else [float(x) for x in distinct]
            out = []
            for i, l in enumerate(self.info.layers):
                n_exp = min(l.num_experts, l.top_k * n_tokens)
                if i < len(d):
                    n_exp = max(1.0, min(float(n_exp), d[i]))
                out.append(n_exp * self.cost.expert_time(max(1, int(l.top_k * n_tokens / n_exp))))
            self._routed_memo[key] = out
        return out


def host_lane_time(cost, n: int, host_weight_bytes: float | None = None) -> float:
    """Host lane seconds for one expert on n tokens: the host reads the expert at its copy's width
    (``host_weight_bytes``; None: the deployment dtype's), and the activations cross the link both ways."""
    wb = host_weight_bytes or cost.weight_bytes
    return cost.host_expert_time(n, weight_bytes=wb) + cost.host_transfer_time(n)


def _lowbit_time(cost, draft: DraftSource, n: int) -> float:
    """A low-bit draft expert's compute time over ``n`` tokens."""
    return cost.expert_time(n, weight_bytes=draft.expert_bytes)


def _nothing() -> None:
    return None


class _Memo(dict):
    """``fn(n)`` by subscript, each ``n`` computed once (a subscript is no Python call: this is read per expert)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, n):
        v = self[n] = self.fn(n)
        return v
