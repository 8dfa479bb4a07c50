"""Placement for offloading: the dense weights on the device, the routed experts on the host: pinned in place
when they fit in a pinned allowance, else left where they lie (mapped from the checkpoint) and copied through a
bounded pinned staging ring (:class:`PinnedStaging`)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .inspect import MoEModelInfo, inspect_model

__all__ = ["place_for_offload", "ensure_offload_layout", "layout_action", "PinnedStaging", "pin_allowance"]


def pin_allowance() -> int:
    """Default bytes of routed experts that may be pinned: half the RAM available now (pinned pages cannot be
    swapped or dropped, so pinning more starves the rest of the machine)."""
    from .memory import available_memory

    return available_memory()[0] // 2


def place_for_offload(model: nn.Module, info: MoEModelInfo | None = None, device="cuda",
                      pin_limit: int | None = None) -> nn.Module:
    """Put everything but the routed experts on ``device`` and keep the routed experts on the host: the layout
    the runtime offloads from (the ExpertStore copies experts into its device slots on demand). The experts are
    pinned (copied once into page-locked memory) when they take at most ``pin_limit`` bytes (default
    :func:`pin_allowance`); otherwise they stay where they lie, unpinned (mapped from the checkpoint when it
    was loaded in its own dtype), and the store copies them through a bounded :class:`PinnedStaging` ring.
    HF's own forward needs the experts on the device, so run such a model through an Engine."""
    info = info or inspect_model(model)
    expert_params = {id(getattr(l.experts, n)) for l in info.layers for n in l.param_names}
    expert_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) in expert_params)
    pin = expert_bytes <= (pin_allowance() if pin_limit is None else pin_limit)
    for p in model.parameters():
        if id(p) in expert_params:
            p.data = p.data.to("cpu").pin_memory() if pin else p.data.to("cpu")
        else:
            p.data = p.data.to(device)
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


class PinnedStaging:
    """A bounded ring of pinned host buffers through which experts that live in unpinned host memory (mapped from
    the checkpoint files) are copied to the device: host → buffer (a CPU memcpy), then buffer → device
    non-blocking. A buffer is reused only after the device copy that last read it has finished (its CUDA event),
    so at most ``buffers`` experts are pinned at once, whatever the model's size (a desktop cannot pin 60 GB).

    ``pin=False`` keeps the same code path on unpinned buffers (the CPU, and tests): the copies are then plain.
    Buffers are allocated on first use, one set per distinct tensor signature (layers of other shapes)."""

    def __init__(self, buffers: int = 4, pin: bool = True) -> None:
        if isinstance(buffers, bool) or not isinstance(buffers, int) or buffers < 1:
            raise ValueError(f"PinnedStaging(buffers={buffers!r}): an integer >= 1.")
        self.pin = pin
        self.size = buffers
        self._bufs: dict[tuple, list[dict[str, torch.Tensor]]] = {}
        self._events: dict[tuple, list] = {}
        self._next: dict[tuple, int] = {}
        self.copies = 0
        self.waits = 0  # how often a buffer was still being read by an earlier device copy

    @property
    def nbytes(self) -> int:
        """Bytes pinned by the ring (all signatures)."""
        return sum(t.numel() * t.element_size() for ring in self._bufs.values() for b in ring for t in b.values())

    def copy_into(self, src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> None:
        """Copy one expert's tensors ``src`` (host) into ``dst`` (device views) through the next free buffer."""
        sig = tuple((n, tuple(t.shape), t.dtype) for n, t in src.items())
        ring = self._bufs.get(sig)
        if ring is None:
            ring = self._bufs[sig] = [{n: torch.empty(s, dtype=d, pin_memory=self.pin) for n, s, d in sig}
                                      for _ in range(self.size)]
            self._events[sig] = [None] * self.size
            self._next[sig] = 0
        i = self._next[sig]
        self._next[sig] = (i + 1) % self.size
        event = self._events[sig][i]
        if event is not None:
            if not event.query():
                self.waits += 1
            event.synchronize()  # the device copy that last read this buffer is done: safe to overwrite
        buf = ring[i]
        for name, t in src.items():
            buf[name].copy_(t)
            dst[name].copy_(buf[name], non_blocking=True)
        device = next(iter(dst.values())).device if dst else None
        if device is not None and device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()  # on the current stream: the clock's copy stream inside its copy()
            self._events[sig][i] = ev
        self.copies += 1
