"""The experts forward that every MoE layer runs through while an Engine is attached.

HF's MoE block computes the router and calls ``experts(hidden_states, top_k_index, top_k_weights)``; the
registered ``specter`` implementation lands here with the layer id. What the current model forward *is* comes in
one :class:`ForwardInfo`, handed over by the decode loop through :meth:`OffloadRuntime.forward` (its only
writer); the runtime fills in the forward's routing. Three modes:

* ``target``  – full precision through the ExpertStore: resident experts first, misses demand-loaded into slots
  (streaming through the slots when a layer has fewer slots than it needs experts), every op on the clock;
* ``draft``   – the draft's experts (see :mod:`specter_lab.drafts`): the rest of the model is the target's own;
* ``shadow``  – exact, off the clock and off the cache (the oracle's look at the target's true routing).

Contributions are summed in ascending expert order, as HF's eager loop does, so fp results do not depend on
which experts happened to be resident.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from .clock import Span, stamper
from .hostexec import MissPolicy
from .experts import combine, expert_apply, route_groups

__all__ = ["OffloadRuntime", "ForwardInfo", "DraftSource", "HOOK_POINTS"]

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

    @property
    def source(self) -> str:
        return self.mode


@dataclass
class DraftSource:
    """Where the draft's routed experts come from (see :mod:`specter_lab.drafts`): ``variant``, the low-bit
    experts (quantized / hybrid), what one such expert costs to read, and the hybrid set size per layer."""

    variant: str = "quantized"
    experts: object | None = None  # DraftExperts
    expert_bytes: float = 0.0
    hybrid_size: int = 0
    # hybrid: builds the low-bit copies of just the chosen sets (per layer), so the device holds what the budget
    # charges (hybrid_size experts per layer), not a low-bit copy of every expert
    build: Callable[[list[set[int]]], object] | None = None


class OffloadRuntime:
    """State of one attached engine during generation: store, clock, trace, draft, predictors."""

    def __init__(self, info, store, clock, cost, trace, draft: DraftSource | None = None,
                 gate_lookahead: bool = False, miss: str = "copy",
                 host_weights: "list[dict[str, torch.Tensor]] | None" = None) -> None:
        self.info = info
        self.store = store
        self.clock = clock
        self.cost = cost
        self.trace = trace
        self._stamp = stamper(clock, trace.full)
        self.draft = draft or DraftSource()
        self.hybrid_sets: list[set[int]] = [set() for _ in info.layers]  # hybrid draft: experts with low-bit copies
        self.gate_lookahead = gate_lookahead
        # Host execution (:mod:`.hostexec`): what a miss after the prefill does, and the weights the host computes
        # with (the store's host copies, or copies in another precision: Engine(host_dtype=))
        self.miss = miss
        self.host_weights = host_weights if host_weights is not None else store.host
        self.host_weight_bytes = next(iter(host_weights[0].values())).element_size() if host_weights else None
        self.miss_policy = MissPolicy([l.num_experts for l in info.layers], [s.size for s in store.slots],
                                      [l.top_k for l in info.layers]) if miss == "auto" else None
        self.hooks: dict[str, list[Callable]] = {name: [] for name in HOOK_POINTS}
        self.fwd: ForwardInfo | None = None  # the forward in progress (set only by forward())
        self._protect: dict[int, set[int]] = {}  # gate lookahead: next layer's predicted experts, this forward
        self._mark = None  # CUDA, full trace: the event where the model's own work since the last MoE layer began

    @contextmanager
    def forward(self, info: ForwardInfo) -> Iterator[ForwardInfo]:
        """The model forwards run inside this block are ``info``."""
        self.fwd, self._protect = info, {}
        self._mark = self._stamp() if self.clock.kind == "cuda" else None  # where the first dense span starts
        try:
            yield info
        finally:
            self.fwd = None

    def verify_estimate(self, n_tokens: int, context: int, distinct: "Sequence[float] | None" = None) -> float:
        """Cost-model time of a verification pass over n tokens with every expert resident (no stalls).

        ``distinct``: expected distinct experts per layer (the K governor's measured curve). Without it every
        token is assumed to bring top_k new experts, which overstates long windows: consecutive tokens share."""
        c = self.cost
        per_layer = []
        for i, l in enumerate(self.info.layers):
            n_exp = min(l.num_experts, l.top_k * n_tokens)
            if distinct is not None and i < len(distinct):
                n_exp = max(1.0, min(float(n_exp), float(distinct[i])))
            per_layer.append(c.dense_layer_time(n_tokens, context)
                             + n_exp * c.expert_time(max(1, int(l.top_k * n_tokens / n_exp))))
        return sum(per_layer) + c.head_time(n_tokens)

    # ------------------------------------------------------------------ entry point
    def experts_forward(self, layer: int, mod, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        fwd = self.fwd
        idx_np = idx.detach().cpu().numpy()  # the host needs the routing to schedule copies (a sync on CUDA)
        fwd.routing[layer] = idx_np
        if fwd.record:
            self.trace.routed("recompute" if fwd.phase == "recompute" else fwd.mode, layer, fwd.pos0, idx_np)
        for hook in self.hooks["moe.routing"]:
            hook(fwd, layer, idx_np)
        groups = route_groups(idx, idx_np)
        if fwd.mode == "shadow":
            host = self.store.host[layer]  # pinned on CUDA: the copies do not block the host
            outs = {e: expert_apply(mod, g.take(x), {n: h[e].to(x.device, non_blocking=True) for n, h in host.items()})
                    for e, g in groups.items()}
            return combine(x, outs, groups, w)
        if fwd.mode == "draft":
            out = self._draft_forward(layer, mod, x, groups, w)
        else:
            out = self._target_forward(layer, mod, x, groups, w)
        self._mark = self._stamp() if self.clock.kind == "cuda" else None
        return out

    def between_span(self, duration: float):
        """The span of the model's own work since the last mark (attention, norms, router, shared experts, the
        LM head): on the simulated clock priced as ``duration``; on CUDA measured between events, since HF has
        already issued those kernels when the runtime hears of them (a span made now would have no width)."""
        if self.clock.kind == "cuda" and self._mark is not None:
            end = self.clock.now()
            span = Span(self._mark, end, self._mark)
            self._mark = end
            return span
        span, _ = self.clock.compute(duration)
        return span

    def _dense_span(self, layer: int, n_tokens: int, phase: str) -> None:
        self.trace.span(phase, layer, -1, self.between_span(self.cost.dense_layer_time(n_tokens, self.fwd.pos0)))

    # ------------------------------------------------------------------ target
    def _compute(self, layer: int, mod, x, e: int, group, slot: int) -> torch.Tensor:
        store = self.store
        weights = store.weights(layer, slot)
        span, out = self.clock.compute(self.cost.expert_time(group.n),
                                       lambda: expert_apply(mod, group.take(x), weights),
                                       after=[store.ready(layer, slot)])
        self.trace.span(self.fwd.phase, layer, e, span, copy_id=store.copy_id(layer, slot))
        store.mark_used(layer, slot, span.end)
        return out

    def _target_forward(self, layer: int, mod, x, groups, w) -> torch.Tensor:
        store = self.store
        self._dense_span(layer, x.shape[0], self.fwd.phase)
        now = self._stamp()
        ids = list(groups)
        resident = [e for e in ids if store.lookup(layer, e) is not None]
        missing = [e for e in ids if e not in set(resident)]
        for e in resident:
            self.trace.cache(layer, e, "hit", now)
        for e in missing:
            self.trace.cache(layer, e, "miss", now)
        # Host execution: issue the host's experts first, so they run while the device computes its own.
        on_host = self._host_misses(layer, missing, groups)
        jobs = self._issue_host(layer, mod, x, on_host, groups, now)
        missing = [e for e in missing if e not in jobs]
        loaded, deferred = self._issue_demand(layer, set(ids), missing, now)
        if self.gate_lookahead and layer + 1 < self.info.num_layers:
            self._gate_prefetch(layer + 1, x)
        outs = {e: self._compute(layer, mod, x, e, groups[e], store.lookup(layer, e)) for e in resident + loaded}
        # Fewer slots than experts: stream the rest through slots whose experts are done.
        for e in deferred:
            pending = {d for d in deferred if d not in outs}
            slot = store.load(layer, e, "demand", protected=pending - {e}, issue_at=now)
            if slot is None:
                raise RuntimeError(f"layer {layer}: no slot can be freed for expert {e} (slots={store.slots[layer].size})")
            outs[e] = self._compute(layer, mod, x, e, groups[e], slot)
        outs.update(self._join_host(layer, mod, jobs, x))
        return combine(x, outs, groups, w)

    # ------------------------------------------------------------------ host execution
    def _host_misses(self, layer: int, missing: list[int], groups) -> list[int]:
        """The misses this forward computes on the host: none in the prefill (its many tokens make a copy pay)
        or under ``miss='copy'``; all under ``'host'``; under ``'auto'`` those whose copy does not pay."""
        if not missing:
            return []
        if self.store.slots[layer].size == 0:  # a host layer (static split): every expert runs there
            return list(missing)
        if self.miss == "copy" or self.fwd.phase == "prefill":
            return []
        if self.miss == "host":
            return list(missing)
        pol, c, store = self.miss_policy, self.cost, self.store
        pol.observe(layer, self.fwd.routing[layer])
        cands = [(j, e) for j, e in enumerate(store.slots[layer].expert) if e not in groups]
        victim = None if -1 in store.slots[layer].expert or not cands else store.policy.victim(layer, cands)
        victim_e = store.slots[layer].expert[victim] if victim is not None else None
        saving = self._host_time(1) - c.expert_time(1)
        host = []
        for e in missing:
            n = groups[e].n
            extra = c.copy_time(c.expert_bytes) + c.expert_time(n) - self._host_time(n)
            if not pol.copy_pays(layer, e, victim_e, extra, saving):
                host.append(e)
        return host

    def _host_time(self, n: int) -> float:
        # the host reads the expert at the weights' width (its copy is the model's own dtype), and the
        # activations cross the link both ways
        c = self.cost
        # host copies in their own precision (Engine(host_dtype=)) read that many bytes per weight
        wb = self.host_weight_bytes or c.weight_bytes
        return c.host_expert_time(n, weight_bytes=wb) + 2 * 4 * c.hidden * n / c.profile.pcie_bandwidth

    def _issue_host(self, layer: int, mod, x, experts: list[int], groups, now, event: bool = True) -> dict:
        """Submit each host expert to the clock's host lane; returns expert → (span, job). ``event``: record the
        target's miss as served on the host (the draft's host experts are not cache requests)."""
        if not experts:
            return {}
        host = self.host_weights[layer]
        dtype = next(iter(host.values())).dtype
        xh = x.to("cpu", dtype)  # one readback of the layer's input for all its host experts (routing synced)
        jobs = {}
        for e in experts:
            weights = {n: h[e] for n, h in host.items()}
            rows = groups[e].take(xh)
            jobs[e] = self.clock.host(self._host_time(groups[e].n),
                                      lambda rows=rows, weights=weights: expert_apply(mod, rows, weights, post_norm=False))
            if event:
                self.trace.cache(layer, e, "host", now)
        return jobs

    def _join_host(self, layer: int, mod, jobs: dict, x) -> dict:
        """Collect the host results (the device waits for any not done yet: a stall on the device lane) and
        move them to the device, where a post-expert norm runs (its weights live there)."""
        outs = {}
        for e, (span, job) in jobs.items():
            wait, out = self.clock.join_host(span, job)
            self.trace.span(self.fwd.phase, layer, e, span, lane="host")
            self.trace.span(self.fwd.phase, layer, -1, wait)  # the device waiting for it (zero width, a stall)
            out = out.to(x.device, x.dtype, non_blocking=True)
            outs[e] = mod.post_expert_norm(out) if getattr(mod, "has_post_expert_norm", False) else out
        return outs

    def _issue_demand(self, layer: int, needed: set[int], missing: list[int], now) -> tuple[list[int], list[int]]:
        """Issue every demand copy that has a slot not needed by this layer, before computing anything, so the
        copies overlap the resident experts' compute. Returns (loaded, deferred for streaming)."""
        loaded, deferred = [], []
        keep = self._protect.get(layer, set())
        for e in missing:
            slot = self.store.load(layer, e, "demand", protected=needed | keep, issue_at=now)
            if slot is None and keep:
                slot = self.store.load(layer, e, "demand", protected=needed, issue_at=now)
            (loaded if slot is not None else deferred).append(e)
        return loaded, deferred

    def _gate_prefetch(self, nxt: int, x: torch.Tensor) -> None:
        """Pre-gated lookahead: apply layer l+1's router to layer l's hidden state, prefetch what it picks."""
        router = self.info.layers[nxt].router
        if router is None:
            return
        with torch.no_grad():
            out = router(x)
        if isinstance(out, tuple):
            ints = [o for o in out if isinstance(o, torch.Tensor) and not o.is_floating_point()]
            pred = ints[-1] if ints else out[0].topk(self.info.layers[nxt].top_k, dim=-1).indices
        else:
            pred = out.topk(self.info.layers[nxt].top_k, dim=-1).indices
        uniq, counts = torch.unique(pred, return_counts=True)
        order = torch.argsort(counts, descending=True, stable=True)
        experts = [int(e) for e in uniq[order].tolist()][: self.store.slots[nxt].size]
        for e, c in zip(experts, counts[order].tolist()):
            self.trace.forecast_count(nxt, e, int(c))
        protect = set(experts)
        self._protect[nxt] = protect
        for e in experts:
            self.store.prefetch(nxt, e, protected=protect)

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

    def _draft_forward(self, layer: int, mod, x, groups, w) -> torch.Tensor:
        """The draft's MoE layer. Variants (all lossless, the target verifies):

        * ``quantized`` – every expert from its resident low-bit copy (the paper);
        * ``resident``  – fp experts that are resident and ready *now*; absent ones are skipped and each token's
          remaining router weights renormalised (no extra device memory);
        * ``hybrid``    – resident fp where ready, else a low-bit copy if the expert is in the hybrid set, else skip;
        * ``host``      – resident fp where ready, else computed on the host CPU from the host copy (priced by the
          profile's CPU fields).
        """
        self._dense_span(layer, x.shape[0], "draft")
        now = self._stamp()
        plans = {e: self._draft_expert(layer, e, now) for e in groups}
        # the host variant's absent experts go to the host lane first, so they run beside the device's own
        jobs = self._issue_host(layer, mod, x, [e for e, p in plans.items() if p == "host"], groups, now,
                                event=False)
        outs = {}
        for e, plan in plans.items():
            if plan is None or plan == "host":
                continue  # skipped (renormalised below), or on the host
            weights, cost, slot = plan
            after = [self.store.ready(layer, slot)] if slot is not None else []  # a no-op on the sim clock
            span, outs[e] = self.clock.compute(cost(groups[e].n), lambda g=groups[e], wt=weights:
                                               expert_apply(mod, g.take(x), wt), after=after)
            self.trace.span("draft", layer, e, span)
            if slot is not None:
                self.store.note_read(layer, slot, span.end)
        outs.update(self._join_host(layer, mod, jobs, x))
        if len(outs) < len(groups):
            w = self._renormalised(w, groups, outs)
        return combine(x, outs, groups, w)

    def _draft_expert(self, layer: int, e: int, now):
        """(weights, cost of n tokens, slot read or None) for draft expert e on the device, ``"host"`` to compute
        it on the host lane, or None to skip it."""
        variant, store = self.draft.variant, self.store
        if variant == "quantized" or (variant == "hybrid" and e in self.hybrid_sets[layer]
                                      and not self._ready_now(layer, e, now)):
            return (self.draft.experts.weights(layer, e),
                    lambda n: self.cost.expert_time(n, weight_bytes=self.draft.expert_bytes), None)
        if self._ready_now(layer, e, now):
            slot = store.lookup(layer, e)
            return store.weights(layer, slot), self.cost.expert_time, slot
        return "host" if variant == "host" else None

    def _ready_now(self, layer: int, expert: int, now) -> bool:
        slot = self.store.lookup(layer, expert)
        if slot is None:
            return False
        ready = self.store.ready(layer, slot)
        # A prefetch still in flight is not usable by the draft (it would stall): on the sim clock compare times;
        # on CUDA ask the copy's event whether it has completed (cudaEventQuery: no sync).
        if ready is None:
            return True
        return ready <= now if isinstance(ready, float) else bool(ready.query())

    @staticmethod
    def _renormalised(w: torch.Tensor, groups, outs) -> torch.Tensor:
        """Scale each token's kept routing weights so they sum to what all its top-k weights summed to."""
        keep = torch.zeros_like(w, dtype=torch.bool)
        for e in outs:
            g = groups[e]
            keep[0 if g.rows is None else g.rows, g.kpos] = True
        kept = (w * keep).sum(-1, keepdim=True)
        scale = torch.where(kept > 0, w.sum(-1, keepdim=True) / kept.clamp(min=1e-12), torch.zeros_like(kept))
        return w * scale
