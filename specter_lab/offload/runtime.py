"""The experts forward that every MoE layer runs through while an Engine is attached: the layer's tensor math.

HF's MoE block computes the router and calls ``experts(hidden_states, top_k_index, top_k_weights)``; the
registered ``specter`` implementation lands here with the layer id. What the current model forward *is* comes in
one :class:`ForwardInfo`, handed over by the decode loop through :meth:`OffloadRuntime.forward` (its only
writer). The runtime reads the routing back once, hands it to the :class:`~specter_lab.offload.schedule.LayerSchedule`
(which decides and prices what happens to every expert), and applies the experts to the hidden states through the
callables it gives the schedule. Three modes:

* ``target``  – full precision through the ExpertStore: resident experts first, misses demand-loaded into slots
  (streaming through the slots when a layer has fewer slots than it needs experts), every op on the clock;
* ``draft``   – the draft's experts (see :mod:`specter_lab.run.drafts`): the rest of the model is the target's own;
* ``shadow``  – exact, off the clock and off the cache (the oracle's look at the target's true routing).

Every expert's matmuls and the weighted sum follow the experts implementation HF runs for the model (eager,
grouped_mm, batched_mm: :mod:`specter_lab.model.experts`), so results are HF's bit for bit in every dtype and do
not depend on which experts happened to be resident; an implementation whose numerics are not reproduced is
refused when the runtime is built (:class:`~specter_lab.errors.NotExact`), before anything is generated.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from ..errors import NotExact
from ..model.experts import (EXACT_IMPLEMENTATIONS, Group, combine, exact_forward, expert_apply,
                             implementation_gap, implementation_of, route_groups)
from .schedule import HOOK_POINTS, DraftSource, ForwardInfo, LayerSchedule, rank_prediction

__all__ = ["OffloadRuntime", "ForwardInfo", "DraftSource", "HOOK_POINTS", "gate_ids"]


def gate_ids(layer, x: torch.Tensor) -> "np.ndarray | None":
    """Pre-gated lookahead: ``layer``'s router applied to the previous layer's input ``x [T, H]``: the top-k ids
    ``[T, k]`` it picks (None: a layer without a router the runtime can call)."""
    if layer.router is None:
        return None
    with torch.no_grad():
        out = layer.router(x)
    if isinstance(out, tuple):
        ints = [o for o in out if isinstance(o, torch.Tensor) and not o.is_floating_point()]
        pred = ints[-1] if ints else out[0].topk(layer.top_k, dim=-1).indices
    else:
        pred = out.topk(layer.top_k, dim=-1).indices
    return pred.detach().cpu().numpy()


@dataclass
class _LayerMath:
    """The tensor side of one layer's forward: what the schedule runs inside its clock ops (:class:`ExpertMath`)."""

    info: object
    mod: torch.nn.Module
    x: torch.Tensor  # [T, H]
    groups: dict[int, Group]
    impl: str = "eager"  # the experts implementation whose numerics to reproduce
    _xh: torch.Tensor | None = None  # the layer's input on the host, read back once for all its host experts

    def device(self, e: int, weights) -> Callable[[], torch.Tensor]:
        g = self.groups[e]
        return lambda: expert_apply(self.mod, g.take(self.x), weights, impl=self.impl, pairs=g.pairs, at=g.at)

    def host(self, e: int, weights) -> Callable[[], torch.Tensor]:
        dtype = next(iter(weights.values())).dtype
        if self._xh is None or self._xh.dtype != dtype:
            self._xh = self.x.to("cpu", dtype)
        g = self.groups[e]
        rows = g.take(self._xh)
        return lambda: expert_apply(self.mod, rows, weights, post_norm=False, impl=self.impl, pairs=g.pairs,
                                    at=g.at)

    def gate_prediction(self, layer: int) -> list[tuple[int, int]]:
        ids = gate_ids(self.info.layers[layer], self.x)
        return [] if ids is None else rank_prediction(ids)

    def finish_host(self, out: torch.Tensor) -> torch.Tensor:
        # back to the device, where a post-expert norm runs (its weights live there)
        out = out.to(self.x.device, self.x.dtype, non_blocking=True)
        return self.mod.post_expert_norm(out) if getattr(self.mod, "has_post_expert_norm", False) else out


class OffloadRuntime:
    """The tensor side of one attached engine during generation; the decisions are its :attr:`schedule`'s."""

    def __init__(self, info, schedule: LayerSchedule) -> None:
        self.info = info
        self.schedule = schedule
        self.store = schedule.store
        self.clock = schedule.clock
        self.cost = schedule.cost
        self.trace = schedule.trace
        self.draft = schedule.draft
        self.hooks = schedule.hooks  # named hook points (HOOK_POINTS)
        self.fwd: ForwardInfo | None = None  # the forward in progress (set only by forward())
        if self.store.materialize:  # a replay computes nothing: any implementation can be priced
            check_implementations(info, self.store.device)

    @contextmanager
    def forward(self, info: ForwardInfo) -> Iterator[ForwardInfo]:
        """The model forwards run inside this block are ``info``."""
        self.fwd = info
        self.schedule.begin_forward()
        try:
            yield info
        finally:
            self.fwd = None

    def between_span(self, duration: float):
        """The span of the model's own work since the last MoE layer (see :meth:`LayerSchedule.model_span`)."""
        return self.schedule.model_span(duration)

    def verify_estimate(self, n_tokens: int, context: int, distinct: "Sequence[float] | None" = None) -> float:
        return self.schedule.verify_estimate(n_tokens, context, distinct)

    def choose_hybrid_sets(self, routing) -> None:
        self.schedule.choose_hybrid_sets(routing)

    # ------------------------------------------------------------------ entry point
    def experts_forward(self, layer: int, mod, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        fwd = self.fwd
        idx_np = idx.detach().cpu().numpy()  # the host needs the routing to schedule copies (a sync on CUDA)
        self.schedule.routed(fwd, layer, idx_np)
        if fwd.mode == "shadow":
            store = self.store  # host copies pinned on CUDA: the copies do not block the host
            return exact_forward(mod, x, idx, w, lambda e: {n: t.to(x.device, non_blocking=True)
                                                            for n, t in store.source_expert(layer, e).items()},
                                 idx_np)
        impl = implementation_of(mod)
        groups = route_groups(idx, idx_np, impl)
        math = _LayerMath(self.info, mod, x, groups, impl)
        outs, host_outs = self.schedule.layer(fwd, layer, {e: g.n for e, g in groups.items()}, x.shape[0], math)
        outs.update({e: math.finish_host(o) for e, o in host_outs.items()})
        if len(outs) < len(groups):  # the draft skipped absent experts
            w = _renormalised(w, groups, outs)
        return combine(x, outs, groups, w, impl)


def check_implementations(info, device="cpu") -> None:
    """Refuse (before any generation) a model whose experts run an implementation the runtime does not
    reproduce, or whose reproduction differs from it on ``device`` (checked on random weights of the layer's
    shapes, once per shape, device and dtype): its outputs would differ from HF's by rounding, token by token."""
    for layer in info.layers:
        impl = implementation_of(layer.experts)
        if impl not in EXACT_IMPLEMENTATIONS:
            raise NotExact(
                f"{info.model_type or 'this model'}: its experts run transformers' {impl!r} implementation "
                f"(config._experts_implementation, layer {layer.index}), whose numerics specter_lab does not "
                f"reproduce, so offloaded results would not be HF generate's bit for bit. Load the model with "
                f"experts_implementation= one of {', '.join(EXACT_IMPLEMENTATIONS)} (or call "
                "model.set_experts_implementation(...)) before building the Engine.")
        dtype = getattr(layer.experts, layer.param_names[0]).dtype
        gap = implementation_gap(layer.experts, impl, layer.param_names, layer.top_k, device, dtype)
        if gap != 0.0:
            raise NotExact(
                f"{info.model_type or 'this model'}: on {device} in {dtype}, transformers' {impl!r} experts "
                f"implementation and specter_lab's per-expert reproduction of it differ (by {gap:.3g} on random "
                f"weights of layer {layer.index}'s shapes), so offloaded results would not be HF generate's bit "
                f"for bit. Another implementation may match here: load the model with experts_implementation= "
                f"one of {', '.join(i for i in EXACT_IMPLEMENTATIONS if i != impl)}.")


def _renormalised(w: torch.Tensor, groups: dict[int, Group], outs) -> torch.Tensor:
    """Scale each token's kept routing weights so they sum to what all its top-k weights summed to."""
    keep = torch.zeros_like(w, dtype=torch.bool)  # [T, k]
    for e in outs:
        g = groups[e]
        keep[0 if g.rows is None else g.rows, g.kpos] = True  # the (token, top-k position) pairs computed
    kept = (w * keep).sum(-1, keepdim=True)
    scale = torch.where(kept > 0, w.sum(-1, keepdim=True) / kept.clamp(min=1e-12), torch.zeros_like(kept))
    return w * scale
