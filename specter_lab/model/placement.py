"""Placement for offloading: the dense weights on the device, the routed experts in pinned host memory."""

from __future__ import annotations

from torch import nn

from .inspect import MoEModelInfo, inspect_model

__all__ = ["place_for_offload"]

def place_for_offload(model: nn.Module, info: MoEModelInfo | None = None, device="cuda") -> nn.Module:
    """Put everything but the routed experts on ``device`` and keep the routed experts in pinned host memory:
    the layout the runtime offloads from (the ExpertStore copies experts into its device slots on demand).
    HF's own forward needs the experts on the device, so run such a model through an Engine."""
    info = info or inspect_model(model)
    expert_params = {id(getattr(l.experts, n)) for l in info.layers for n in l.param_names}
    for p in model.parameters():
        p.data = p.data.to("cpu").pin_memory() if id(p) in expert_params else p.data.to(device)
    for m in model.modules():
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = b.to(device)
    return model

