"""The experts forward that every MoE layer runs through while an Engine is attached.

HF's MoE block computes the router and calls ``experts(hidden_states, top_k_index, top_k_weights)``; the
registered ``specter`` implementation lands here with the layer id. Three modes:

* ``target``  – full precision through the ExpertStore: resident experts first, misses demand-loaded into slots
  (streaming through the slots when a layer has fewer slots than it needs experts), every op on the clock;
* ``draft``   – the draft's experts (quantized copies, resident): the rest of the model is the target's own;
* ``shadow``  – exact, off the clock and off the cache (the oracle's look at the target's true routing).

Contributions are summed in ascending expert order, as HF's eager loop does, so fp results do not depend on
which experts happened to be resident.
"""

from __future__ import annotations

from typing import Sequence, Callable

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["OffloadRuntime", "expert_apply"]


def expert_apply(mod, x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """One expert on tokens ``x [n, H]`` with weights ``w`` (slices of the fused tensors), honouring every layout
    flag of transformers' experts interface: gate or not, transposed, bias, custom ``_apply_gate`` (interleaved
    gate/up), post-expert norm."""
    up_w = w["gate_up_proj"] if mod.has_gate else w["up_proj"]
    up_b = w.get("gate_up_proj_bias" if mod.has_gate else "up_proj_bias")
    h = x @ up_w if mod.is_transposed else F.linear(x, up_w)
    if up_b is not None:
        h = h + up_b
    h = mod._apply_gate(h) if mod.has_gate else mod.act_fn(h)
    out = h @ w["down_proj"] if mod.is_transposed else F.linear(h, w["down_proj"])
    if w.get("down_proj_bias") is not None:
        out = out + w["down_proj_bias"]
    if getattr(mod, "has_post_expert_norm", False):
        out = mod.post_expert_norm(out)
    return out


def _route_groups(idx: torch.Tensor, idx_np: np.ndarray | None = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """expert → (token indices, top-k positions), experts ascending. Grouped on the host copy of the routing
    (which the scheduler needs anyway): at decode sizes this is a few Python ops instead of several kernels."""
    if idx_np is None:
        idx_np = idx.detach().cpu().numpy()
    t, k = idx_np.shape
    flat = idx_np.reshape(-1)
    order = np.argsort(flat, kind="stable")
    groups: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    sorted_e = flat[order]
    cuts = np.flatnonzero(np.diff(sorted_e)) + 1
    dev = idx.device
    for chunk in np.split(order, cuts):
        e = int(flat[chunk[0]])
        if e < 0:
            continue
        groups[e] = (torch.as_tensor(chunk // k, device=dev), torch.as_tensor(chunk % k, device=dev))
    return groups


class OffloadRuntime:
    """State of one attached engine during generation: mode, step, clock, store, trace, draft, predictors."""

    def __init__(self, info, store, clock, cost, trace, draft=None, draft_variant: str = "quantized",
                 gate_lookahead: bool = False, draft_expert_bytes: float = 0.0) -> None:
        self.info = info
        self.store = store
        self.clock = clock
        self.cost = cost
        self.trace = trace
        self.draft = draft
        self.draft_variant = draft_variant
        self.draft_expert_bytes = draft_expert_bytes
        self.hybrid_sets: list[set[int]] = [set() for _ in info.layers]  # hybrid draft: experts with low-bit copies
        self.hybrid_size = 0
        self.gate_lookahead = gate_lookahead
        self.mode = "target"
        self.phase = "decode"
        self.step = 0
        self.context = 0  # tokens already in the KV cache when the current forward started
        self.pos0 = 0
        self.routing: dict[int, np.ndarray] = {}  # layer → top-k ids of the current forward
        self.lookahead_protect: dict[int, set[int]] = {}
        self.layer_hooks: list[Callable] = []  # named observation point "moe.routing": fn(runtime, layer, idx)
        self.forecast = None  # the live window forecast (speculative strategies), read by forecast eviction
        self.keep_cache = True  # False for on_demand: nothing is kept between steps

    def verify_estimate(self, n_tokens: int, distinct: "Sequence[float] | None" = None) -> float:
        """Cost-model time of a verification pass over n tokens with every expert resident (no stalls).

        ``distinct``: expected distinct experts per layer (the K governor's measured curve). Without it every
        token is assumed to bring top_k new experts, which overstates long windows: consecutive tokens share."""
        c = self.cost
        per_layer = []
        for i, l in enumerate(self.info.layers):
            n_exp = min(l.num_experts, l.top_k * n_tokens)
            if distinct is not None and i < len(distinct):
                n_exp = max(1.0, min(float(n_exp), float(distinct[i])))
            per_layer.append(c.dense_layer_time(n_tokens, self.context)
                             + n_exp * c.expert_time(max(1, int(l.top_k * n_tokens / n_exp))))
        return sum(per_layer) + c.head_time(n_tokens)

    # ------------------------------------------------------------------ entry point
    def experts_forward(self, layer: int, mod, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        idx_np = idx.detach().cpu().numpy()  # the host needs the routing to schedule copies (a sync on CUDA)
        self.routing[layer] = idx_np
        self.trace.routed(self.step, self.mode, layer, self.pos0, idx_np)
        for hook in self.layer_hooks:
            hook(self, layer, idx_np)
        groups = _route_groups(idx, idx_np)
        if self.mode == "shadow":
            host = self.store.host[layer]
            outs = {e: expert_apply(mod, x[t], {n: h[e].to(x.device) for n, h in host.items()})
                    for e, (t, _) in groups.items()}
            return self._combine(x, outs, groups, w)
        if self.mode == "draft":
            return self._draft_forward(layer, mod, x, groups, w)
        return self._target_forward(layer, mod, x, groups, w)

    def _combine(self, x, outs, groups, w) -> torch.Tensor:
        # Ascending expert order, weighted, index_add: the same float ops as HF's eager loop.
        final = torch.zeros_like(x)
        for e in sorted(outs):
            tok, kpos = groups[e]
            final.index_add_(0, tok, (outs[e] * w[tok, kpos, None]).to(final.dtype))
        return final

    # ------------------------------------------------------------------ target
    def _compute(self, layer: int, mod, x, e: int, tok, slot: int) -> torch.Tensor:
        weights = self.store.weights(layer, slot)
        span, out = self.clock.compute(self.cost.expert_time(len(tok)), lambda: expert_apply(mod, x[tok], weights),
                                       after=[self.store.ready(layer, slot)])
        self.trace.span(self.step, self.phase, layer, e, span)
        self.store.mark_used(layer, slot, span.end)
        return out

    def _target_forward(self, layer: int, mod, x, groups, w) -> torch.Tensor:
        store, clock = self.store, self.clock
        span, _ = clock.compute(self.cost.dense_layer_time(x.shape[0], self.context))
        self.trace.span(self.step, self.phase, layer, -1, span)
        now = clock.now()
        ids = list(groups)
        needed = set(ids)
        resident = [e for e in ids if store.lookup(layer, e) is not None]
        missing = [e for e in ids if e not in set(resident)]
        store.counters.hits += len(resident)
        store.counters.misses += len(missing)
        for e in resident:
            self.trace.cache(self.step, layer, e, "hit", now)
        for e in missing:
            self.trace.cache(self.step, layer, e, "miss", now)
        store.step = self.step
        # Issue every demand copy that has a slot not needed by this layer, before computing anything, so the
        # copies overlap the resident experts' compute.
        loaded, deferred = [], []
        keep = self.lookahead_protect.get(layer, set())
        for e in missing:
            slot = store.load(layer, e, "demand", protected=needed | keep, issue_at=now)
            if slot is None and keep:
                slot = store.load(layer, e, "demand", protected=needed, issue_at=now)
            (loaded if slot is not None else deferred).append(e)
        if self.gate_lookahead and layer + 1 < self.info.num_layers:
            self._gate_prefetch(layer + 1, x)
        outs = {}
        for e in resident + loaded:
            outs[e] = self._compute(layer, mod, x, e, groups[e][0], store.lookup(layer, e))
        # Fewer slots than experts: stream the rest through slots whose experts are done.
        for e in deferred:
            pending = {d for d in deferred if d not in outs}
            slot = store.load(layer, e, "demand", protected=pending - {e}, issue_at=now)
            if slot is None:
                raise RuntimeError(f"layer {layer}: no slot can be freed for expert {e} (slots={store.slots[layer].size})")
            outs[e] = self._compute(layer, mod, x, e, groups[e][0], slot)
        return self._combine(x, outs, groups, w)

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
            self.trace.forecast.append((self.step, nxt, e, int(c)))
        protect = set(experts)
        self.lookahead_protect[nxt] = protect
        for e in experts:
            self.store.prefetch(nxt, e, protected=protect)

    # ------------------------------------------------------------------ draft
    def choose_hybrid_sets(self) -> None:
        """Hybrid draft: after the prefill, give low-bit copies to the experts the prompt used most that are not
        resident (the fp cache already covers the resident ones), then to the next most used."""
        if not self.hybrid_size:
            return
        for layer, idx in self.routing.items():
            counts = np.bincount(idx.reshape(-1), minlength=self.info.layers[layer].num_experts)
            resident = self.store.resident(layer)
            order = sorted(range(len(counts)), key=lambda e: (e in resident, -counts[e], e))
            self.hybrid_sets[layer] = set(order[: self.hybrid_size])

    def _draft_forward(self, layer: int, mod, x, groups, w) -> torch.Tensor:
        """The draft's MoE layer. Variants (all lossless, the target verifies):

        * ``quantized`` – every expert from its resident low-bit copy (the paper);
        * ``resident``  – fp experts that are resident and ready *now*; absent ones are skipped and each token's
          remaining router weights renormalised (no extra device memory);
        * ``hybrid``    – resident fp where ready, else a low-bit copy if the expert is in the hybrid set, else skip;
        * ``host``      – resident fp where ready, else computed on the host CPU from the host copy (priced by the
          profile's CPU fields).
        """
        span, _ = self.clock.compute(self.cost.dense_layer_time(x.shape[0], self.context))
        self.trace.span(self.step, "draft", layer, -1, span)
        variant = self.draft_variant
        outs = {}
        now = self.clock.now()
        for e, (tok, _) in groups.items():
            if variant == "quantized" or (variant == "hybrid" and e in self.hybrid_sets[layer]
                                          and not self._ready_now(layer, e, now)):
                weights = self.draft.weights(layer, e)
                cost = self.cost.expert_time(len(tok), weight_bytes=self.draft_expert_bytes)
                slot, after = None, []
            elif self._ready_now(layer, e, now):
                slot = self.store.lookup(layer, e)
                weights = self.store.weights(layer, slot)
                cost = self.cost.expert_time(len(tok))
                after = [self.store.ready(layer, slot)]  # a no-op on the sim clock (ready <= now); a wait on CUDA
            elif variant == "host":
                weights = {n: h[e] for n, h in self.store.host[layer].items()}
                cost = self.cost.host_expert_time(len(tok))
                slot, after = None, []
            else:
                continue  # skipped: renormalised below
            if slot is None and variant == "host" and x.device.type != "cpu":
                fn = lambda: expert_apply(mod, x[tok].cpu(), weights).to(x.device)  # really on the host CPU
            else:
                fn = lambda: expert_apply(mod, x[tok], weights)
            span, outs[e] = self.clock.compute(cost, fn, after=after)
            self.trace.span(self.step, "draft", layer, e, span)
            if slot is not None:
                self.store.note_read(layer, slot, span.end)
        if len(outs) < len(groups):
            w = self._renormalised(w, groups, outs)
        return self._combine(x, outs, groups, w)

    def _ready_now(self, layer: int, expert: int, now) -> bool:
        slot = self.store.lookup(layer, expert)
        if slot is None:
            return False
        ready = self.store.ready(layer, slot)
        # On the sim clock a prefetch still in flight is not usable by the draft (it would stall); on CUDA we
        # cannot ask without a sync, so a slot that is assigned counts as ready (the draft then waits on it).
        return ready is None or not isinstance(ready, float) or ready <= now

    @staticmethod
    def _renormalised(w: torch.Tensor, groups, outs) -> torch.Tensor:
        """Scale each token's kept routing weights so they sum to what all its top-k weights summed to."""
        keep = torch.zeros_like(w, dtype=torch.bool)
        for e in outs:
            tok, kpos = groups[e]
            keep[tok, kpos] = True
        kept = (w * keep).sum(-1, keepdim=True)
        scale = torch.where(kept > 0, w.sum(-1, keepdim=True) / kept.clamp(min=1e-12), torch.zeros_like(kept))
        return w * scale
