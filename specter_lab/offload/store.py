"""ExpertStore: one host copy of every routed expert, a fixed pool of device slots per layer, the residency table,
and per-slot ready / last-use handles.

On the CPU the "device" slots are separate tensors and a transfer is a real ``copy_`` into them, so a slot that
holds the wrong expert, or a compute that reads a slot before its copy, changes the output and the lossless
tests catch it. On CUDA the host copies are pinned and copies are non-blocking on the clock's copy stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from .cache import EvictionPolicy
from .clock import Handle

__all__ = ["ExpertStore", "LayerSlots", "CopyFault"]


class CopyFault(RuntimeError):
    """A host→device copy failed; the slot it targeted is left empty (never marked ready)."""


@dataclass
class LayerSlots:
    expert: list[int]  # expert id held by each slot, -1 = empty
    ready: list[Handle | None]  # when the copy into the slot finished
    last_use: list[Handle | None]  # when the last compute reading the slot finished
    prefetched: list[bool]  # loaded by a prefetch and not used by the target since
    where: dict[int, int] = field(default_factory=dict)  # expert → slot
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # name → [S, ...]

    @property
    def size(self) -> int:
        return len(self.expert)


@dataclass
class Counters:
    hits: int = 0
    misses: int = 0
    prefetches: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    evictions: int = 0
    h2d_bytes: int = 0


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """The host copy the link reads from: the parameter itself on CPU runs; pinned (page-locked) on CUDA, which
    is what makes a non-blocking H2D copy really asynchronous."""
    if not pin:
        return t
    t = t.to("cpu")
    return t if t.is_pinned() else t.pin_memory()


class ExpertStore:
    """Residency of routed experts in a fixed number of device slots per layer.

    ``host[layer][name]`` are the fused expert tensors ``[E, ...]`` (the model's own parameters on CPU: no extra
    host memory). ``slots[layer].buffers[name]`` are ``[S, ...]`` device tensors. ``priced_bytes`` is what one
    expert copy costs on the link in the cost model (deployment dtype, maybe projected).
    """

    def __init__(self, info, slots_per_layer: list[int], clock, cost, policy: EvictionPolicy, trace,
                 device: torch.device | str = "cpu", host: list[dict[str, torch.Tensor]] | None = None) -> None:
        self.info = info
        self.clock = clock
        self.cost = cost
        self.policy = policy
        self.trace = trace
        self.device = torch.device(device)
        self.fault_hook: Callable[[int, int], None] | None = None  # test hook: raise to inject a failed copy
        self.counters = Counters()
        self.step = 0
        self.host: list[dict[str, torch.Tensor]] = []
        self.slots: list[LayerSlots] = []
        pin = self.device.type == "cuda"
        for i, (layer, n) in enumerate(zip(info.layers, slots_per_layer)):
            if host is not None:  # pinned copies made by an earlier run of the same engine
                self.host.append(host[i])
            else:
                self.host.append({name: _host_copy(getattr(layer.experts, name).detach(), pin)
                                  for name in layer.param_names})
            host_i = self.host[-1]
            bufs = {name: torch.empty((n, *t.shape[1:]), dtype=t.dtype, device=self.device) for name, t in host_i.items()}
            self.slots.append(LayerSlots([-1] * n, [None] * n, [None] * n, [False] * n, {}, bufs))

    # ------------------------------------------------------------------ queries
    @property
    def slots_per_layer(self) -> list[int]:
        return [s.size for s in self.slots]

    def resident(self, layer: int) -> set[int]:
        return set(self.slots[layer].where)

    def lookup(self, layer: int, expert: int) -> int | None:
        return self.slots[layer].where.get(expert)

    def weights(self, layer: int, slot: int) -> dict[str, torch.Tensor]:
        return {name: buf[slot] for name, buf in self.slots[layer].buffers.items()}

    def ready(self, layer: int, slot: int) -> Handle | None:
        return self.slots[layer].ready[slot]

    def resident_count(self) -> int:
        return sum(len(s.where) for s in self.slots)

    # ------------------------------------------------------------------ loading
    def _choose_slot(self, layer: int, protected: Iterable[int]) -> int | None:
        s = self.slots[layer]
        for i, e in enumerate(s.expert):
            if e < 0:
                return i
        protected = set(protected)
        cands = [(i, e) for i, e in enumerate(s.expert) if e not in protected]
        if not cands:
            return None
        return self.policy.victim(layer, cands)

    def evict(self, layer: int, slot: int) -> None:
        s = self.slots[layer]
        e = s.expert[slot]
        if e < 0:
            return
        if s.prefetched[slot]:
            self.counters.prefetch_wasted += 1
            self.trace.cache(self.step, layer, e, "prefetch_wasted", self.clock.now())
        self.counters.evictions += 1
        self.trace.cache(self.step, layer, e, "evict", self.clock.now())
        del s.where[e]
        s.expert[slot] = -1
        s.ready[slot] = None
        s.prefetched[slot] = False

    def load(self, layer: int, expert: int, reason: str, protected: Iterable[int] = (),
             issue_at: Handle | None = None) -> int | None:
        """Copy ``expert`` into a slot of ``layer`` (evicting by policy, never a protected expert). Returns the
        slot, or None when every slot is protected. Already resident: returns its slot, no copy."""
        s = self.slots[layer]
        if expert in s.where:
            return s.where[expert]
        slot = self._choose_slot(layer, protected)
        if slot is None:
            return None
        after = [s.last_use[slot], s.ready[slot]]  # never overwrite a slot still being read or written
        self.evict(layer, slot)
        host = self.host[layer]
        bufs = s.buffers

        def do_copy() -> None:
            if self.fault_hook is not None:
                self.fault_hook(layer, expert)
            for name, buf in bufs.items():
                buf[slot].copy_(host[name][expert], non_blocking=True)

        nbytes = self.cost.expert_bytes
        try:
            span = self.clock.copy(self.cost.copy_time(nbytes), do_copy, after=after, issue_at=issue_at)
        except Exception as exc:  # the slot stays empty: nothing stale can be marked ready
            raise CopyFault(f"copy of layer {layer} expert {expert} into slot {slot} failed: {exc}") from exc
        s.expert[slot] = expert
        s.where[expert] = slot
        s.ready[slot] = span.end
        s.prefetched[slot] = reason == "prefetch"
        self.counters.h2d_bytes += nbytes
        if reason == "prefetch":
            self.counters.prefetches += 1
            self.trace.cache(self.step, layer, expert, "prefetch", span.start)
        self.policy.loaded(layer, expert)
        self.trace.transfer(self.step, layer, expert, slot, nbytes, span.start, span.end, reason)
        return slot

    def prefetch(self, layer: int, expert: int, protected: Iterable[int] = (), issue_at: Handle | None = None) -> bool:
        """Start an asynchronous copy unless already resident. False when no slot may be evicted."""
        if expert in self.slots[layer].where:
            return False
        return self.load(layer, expert, "prefetch", protected, issue_at) is not None

    def mark_used(self, layer: int, slot: int, end: Handle) -> None:
        s = self.slots[layer]
        s.last_use[slot] = end
        if s.prefetched[slot]:
            s.prefetched[slot] = False
            self.counters.prefetch_used += 1
            self.trace.cache(self.step, layer, s.expert[slot], "prefetch_used", end)
        self.policy.touch(layer, s.expert[slot])

    # ------------------------------------------------------------------ sharing slots across layers
    def can_share(self) -> bool:
        """Slots can move between layers only if every layer's experts have the same tensor shapes."""
        shapes = [tuple((n, tuple(t.shape[1:]), t.dtype) for n, t in h.items()) for h in self.host]
        return all(sh == shapes[0] for sh in shapes)

    def move_slot(self, src: int, dst: int, protected: Iterable[int] = ()) -> bool:
        """Give one slot of layer ``src`` to layer ``dst`` (total device memory unchanged): an empty slot if there
        is one, else the policy's victim among the unprotected. The moved slot arrives empty at ``dst``; a copy
        into it still waits for the last read of its old contents. False if ``src`` has no slot it may give."""
        s, d = self.slots[src], self.slots[dst]
        if s.size <= 1:
            return False
        empty = [i for i, e in enumerate(s.expert) if e < 0]
        if empty:
            i = empty[0]
        else:
            protected = set(protected)
            cands = [(j, e) for j, e in enumerate(s.expert) if e not in protected]
            if not cands:
                return False
            i = self.policy.victim(src, cands)
        carried = [h for h in (s.last_use[i], s.ready[i]) if h is not None]
        self.evict(src, i)
        for lst in (s.expert, s.ready, s.last_use, s.prefetched):
            del lst[i]
        s.where = {e: j for j, e in enumerate(s.expert) if e >= 0}
        for name, buf in s.buffers.items():
            s.buffers[name] = torch.cat([buf[:i], buf[i + 1:]])
            d.buffers[name] = torch.cat([d.buffers[name], torch.empty_like(buf[:1])])
        d.expert.append(-1)
        d.ready.append(None)
        # The new slot's memory was last read by src's compute: its first copy must wait for that.
        d.last_use.append(max(carried) if carried and all(isinstance(h, float) for h in carried)
                          else (carried[0] if carried else None))
        d.prefetched.append(False)
        return True

    def note_read(self, layer: int, slot: int, end: Handle) -> None:
        """The draft read a slot: a later copy into it must wait, but this is not a target use (no LRU touch)."""
        self.slots[layer].last_use[slot] = end

    def flush_unused_prefetches(self) -> None:
        """End of a run: prefetched experts that were never used count as waste."""
        for layer, s in enumerate(self.slots):
            for slot, p in enumerate(s.prefetched):
                if p:
                    self.counters.prefetch_wasted += 1
                    self.trace.cache(self.step, layer, s.expert[slot], "prefetch_wasted", self.clock.now())
                    s.prefetched[slot] = False

    def check_invariants(self, budget_slots: list[int] | None = None) -> None:
        """Raise AssertionError if the residency table disagrees with the slots (used by tests)."""
        for layer, s in enumerate(self.slots):
            assert len(s.where) <= s.size, f"layer {layer}: {len(s.where)} resident > {s.size} slots"
            for e, slot in s.where.items():
                assert s.expert[slot] == e, f"layer {layer}: table says expert {e} in slot {slot}"
            held = [e for e in s.expert if e >= 0]
            assert len(held) == len(set(held)) == len(s.where), f"layer {layer}: duplicate residency"
            if budget_slots is not None:
                assert len(s.where) <= budget_slots[layer]
