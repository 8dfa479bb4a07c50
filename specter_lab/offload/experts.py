"""One routed expert's forward on given weights, and the grouping of a layer's routing by expert.

Both are written against transformers' experts interface (its layout flags), so they work for every family that
uses it: gate or not, transposed, biases, a custom ``_apply_gate``, a post-expert norm.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["expert_apply", "route_groups"]


def expert_apply(mod, x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """One expert on tokens ``x [n, H]`` with weights ``w`` (slices of the fused tensors)."""
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


def route_groups(idx: torch.Tensor, idx_np: np.ndarray | None = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """expert → (token indices, top-k positions), experts ascending. Grouped on the host copy of the routing
    (which the scheduler needs anyway): at decode sizes this is a few Python ops instead of several kernels."""
    if idx_np is None:
        idx_np = idx.detach().cpu().numpy()
    t, k = idx_np.shape
    flat = idx_np.reshape(-1)
    order = np.argsort(flat, kind="stable")
    groups: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    cuts = np.flatnonzero(np.diff(flat[order])) + 1
    dev = idx.device
    for chunk in np.split(order, cuts):
        e = int(flat[chunk[0]])
        if e < 0:
            continue
        groups[e] = (torch.as_tensor(chunk // k, device=dev), torch.as_tensor(chunk % k, device=dev))
    return groups
