"""One routed expert's forward on given weights, the grouping of a layer's routing by expert, and the weighted
sum of the experts' outputs.

Written against transformers' experts interface (its layout flags), so they work for every family that uses it:
gate or not, transposed, biases, a custom ``_apply_gate``, a post-expert norm.

The hot path of every MoE layer, kept lean for a GPU where the host dispatches every op: the routing is read
back once (the scheduler needs it anyway); the token indices per expert are slices of one device-side sort, not
host→device copies; a one-token forward (decode, draft steps) needs no indices at all. The sum runs in ascending
expert order with the same float ops as HF's eager loop, so outputs do not depend on which experts were resident.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["expert_apply", "route_groups", "combine", "exact_forward", "Group"]


@dataclass
class Group:
    """One expert's share of a layer's routing: its token ``rows`` (None: the single token of a one-token
    forward) and the top-k positions ``kpos`` those tokens chose it at (an int for one token)."""

    rows: torch.Tensor | None
    kpos: "torch.Tensor | int"
    n: int

    def take(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.rows is None else x[self.rows]


def _matmul(x: torch.Tensor, w: dict, name: str, transposed: bool) -> torch.Tensor:
    m = w[name]
    if not isinstance(m, torch.Tensor):  # a packed low-bit weight with its own kernel (the draft)
        return m.packed_matmul(x)
    if transposed:
        return x @ m
    mt = w.get(name + ".t")  # the slot's cached transposed view: one mm instead of linear's t + mm
    return x @ mt if mt is not None else F.linear(x, m)


def expert_apply(mod, x: torch.Tensor, w: dict, post_norm: bool = True) -> torch.Tensor:
    """One expert on tokens ``x [n, H]`` with weights ``w`` (slices of the fused tensors, or packed weights).
    ``post_norm=False`` leaves out a post-expert norm (the caller applies it where its weights are)."""
    up = "gate_up_proj" if mod.has_gate else "up_proj"
    h = _matmul(x, w, up, mod.is_transposed)
    if w.get(up + "_bias") is not None:
        h = h + w[up + "_bias"]
    h = mod._apply_gate(h) if mod.has_gate else mod.act_fn(h)
    out = _matmul(h, w, "down_proj", mod.is_transposed)
    if w.get("down_proj_bias") is not None:
        out = out + w["down_proj_bias"]
    if post_norm and getattr(mod, "has_post_expert_norm", False):
        out = mod.post_expert_norm(out)
    return out


def route_groups(idx: torch.Tensor, idx_np: np.ndarray) -> dict[int, Group]:
    """expert → its :class:`Group`, experts ascending. ``idx_np`` is the host copy of the routing ``[T, k]``."""
    t, k = idx_np.shape
    if t == 1 and len(set(idx_np[0].tolist())) == k:  # one token, k distinct experts: no index tensors at all
        return {int(e): Group(None, r, 1) for r, e in sorted(enumerate(idx_np[0].tolist()), key=lambda p: p[1])
                if e >= 0}
    flat = idx_np.reshape(-1)
    order = np.argsort(flat, kind="stable")
    cuts = np.flatnonzero(np.diff(flat[order])) + 1
    # The same stable sort on the device gives the same permutation: slicing it per expert needs no copy.
    dev_order = torch.argsort(idx.reshape(-1), stable=True)
    rows_all, kpos_all = dev_order // k, dev_order % k
    groups: dict[int, Group] = {}
    for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [flat.size]])):
        e = int(flat[order[a]])
        if e >= 0:
            groups[e] = Group(rows_all[a:b], kpos_all[a:b], int(b - a))
    return groups


def combine(x: torch.Tensor, outs: dict[int, torch.Tensor], groups: dict[int, Group], w: torch.Tensor) -> torch.Tensor:
    """Σ_e weight · output_e over the experts in ``outs``, ascending, as HF's eager loop sums them."""
    if not outs:
        return torch.zeros_like(x)
    if all(g.rows is None for g in groups.values()):  # one token: a running sum, as HF's loop adds them
        total = None
        for e in sorted(outs):
            p = groups[e].kpos
            c = (outs[e] * w[:, p:p + 1]).to(x.dtype)
            total = c if total is None else total + c
        return total
    final = torch.zeros_like(x)
    for e in sorted(outs):
        g = groups[e]
        final.index_add_(0, g.rows, (outs[e] * w[g.rows, g.kpos, None]).to(final.dtype))
    return final


def exact_forward(mod, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, weights_of,
                  idx_np: np.ndarray | None = None) -> torch.Tensor:
    """A whole layer's experts with no store and no clock: ``weights_of(e)`` gives expert e's weights (a host
    copy, a fused slice, low-bit copies). What the oracle's look, the fidelity probe and op counting run."""
    idx_np = idx.detach().cpu().numpy() if idx_np is None else idx_np
    groups = route_groups(idx, idx_np)
    outs = {e: expert_apply(mod, g.take(x), weights_of(e)) for e, g in groups.items()}
    return combine(x, outs, groups, w)
