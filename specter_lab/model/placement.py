"""Placement for offloading: the dense weights on the device, the routed experts in pinned host memory."""

from __future__ import annotations

import warnings

from torch import nn

from .inspect import MoEModelInfo, inspect_model

__all__ = ["place_for_offload", "ensure_offload_layout", "layout_action"]

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



def layout_action(dense_device: str, expert_devices: set[str]) -> str:
    """What a CUDA run must do to a model whose non-expert weights sit on ``dense_device`` (a device type) and
    whose routed experts sit on ``expert_devices``: ``"ok"`` (already placed for offloading), ``"place"`` (a
    CPU-loaded model: dense weights to the GPU, experts pinned on the host) or ``"offload"`` (a model moved
    wholesale to the GPU: its experts go back to pinned host memory, which frees that device memory)."""
    if expert_devices == {"cpu"}:
        return "ok" if dense_device == "cuda" else "place"
    if dense_device == "cuda" and expert_devices == {"cuda"}:
        return "offload"
    raise ValueError(f"the model's non-expert weights are on {dense_device} and its routed experts on "
                     f"{sorted(expert_devices)}: load it with load_model(..., device='cuda'), or call "
                     "sl.place_for_offload(model) (dense weights on the GPU, experts in pinned host memory).")


def ensure_offload_layout(model: nn.Module, info: MoEModelInfo, device="cuda") -> str:
    """Bring ``model`` into the layout a CUDA run offloads from, in place, and say what was done
    (:func:`layout_action`). A model that was entirely on the GPU is offloaded on purpose, with a warning: it is
    never silently run with all its experts resident beside the budgeted slots."""
    dense = model.get_input_embeddings().weight.device.type
    experts = {getattr(l.experts, n).device.type for l in info.layers for n in l.param_names}
    action = layout_action(dense, experts)
    if action == "offload":
        warnings.warn("the model is entirely on the GPU; its routed experts are moved to pinned host memory so "
                      "that the expert budget means what it says (load with device='cuda' to place it directly).",
                      stacklevel=3)
    if action != "ok":
        place_for_offload(model, info, device)
    return action
