"""ExpertStore: one host copy of every routed expert, a fixed pool of device slots, the residency table, and
per-slot ready / last-use handles.

Device memory is allocated once per run: for each fused tensor name one pool ``[total slots, ...]``, and every
layer owns a list of rows of it. When all layers' experts have the same shapes the pool is shared, so a slot can
move from one layer to another (``shared_slots``) by handing over its row: no device memory is reallocated
while copies into other rows are in flight, and the row keeps its handles (a copy into it waits for the last
read of its old contents).

``pool="global"`` (llama.cpp's expert cache, ``--moe-cache-mib``): a miss with no free slot in its own layer
evicts the least recently used expert of *any* layer sharing the pool, and that slot's row moves to the missing
layer. ``materialize=False`` keeps the residency table, handles and trace records but no tensors: the schedule of
a run priced from its routing alone (replay).

On the CPU the "device" slots are separate memory and a transfer is a real ``copy_`` into them, so a slot that
holds the wrong expert, or a compute that reads a slot before its copy, changes the output and the lossless tests
catch it. Past :data:`~specter_lab.model.memory.CPU_SLOT_COPY_LIMIT` (a real-size model on the CPU) a slot is a
view of its expert's host copy instead, set when the copy would run: the same floats and the same clock, without
a second host copy of the budget's experts. On CUDA the host copies are pinned and copies are non-blocking on the
clock's copy stream.

With a disk tier (``tier``: :class:`~specter_lab.offload.hostcache.DiskTier`, ``host_budget=``) a copy's source
is the expert's slot in the bounded host cache, read from the checkpoint files first on a host-cache miss (a
``disk`` op the copy waits for); ``host`` then only gives shapes, and its values are never read. Slots are then
always real copies (an alias of a host-cache slot would change when that slot is refilled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from ..errors import CopyFault
from ..model.memory import CPU_SLOT_COPY_LIMIT
from ..model.placement import PinnedStaging
from ..records.trace import AHEAD
from ..caching.policies import Policy
from .clock import Handle, stamper

__all__ = ["ExpertStore", "LayerSlots", "CopyFault"]


@dataclass
class LayerSlots:
    """One layer's slots. ``rows[i]`` is slot i's row in the store's pools."""

    rows: list[int]
    expert: list[int]  # expert id held by each slot, -1 = empty
    ready: list[Handle | None]  # when the copy into the slot finished
    copy_id: list[int | None]  # the trace id of that copy
    last_use: list[Handle | None]  # when the last compute reading the slot finished
    prefetched: list[bool]  # loaded by a prefetch and not used by the target since
    where: dict[int, int] = field(default_factory=dict)  # expert → slot

    @property
    def size(self) -> int:
        return len(self.expert)

    def add(self, row: int, last_use: Handle | None = None) -> None:
        for lst, v in ((self.rows, row), (self.expert, -1), (self.ready, None), (self.copy_id, None),
                       (self.last_use, last_use), (self.prefetched, False)):
            lst.append(v)

    def remove(self, slot: int) -> int:
        """Take slot ``slot`` (empty) out of this layer; returns its row."""
        row = self.rows[slot]
        for lst in (self.rows, self.expert, self.ready, self.copy_id, self.last_use, self.prefetched):
            del lst[slot]
        self.where = {e: i for i, e in enumerate(self.expert) if e >= 0}
        return row


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """The host copy the link reads from: the parameter itself on CPU runs; pinned (page-locked) on CUDA, which
    is what makes a non-blocking H2D copy really asynchronous."""
    if not pin:
        return t
    t = t.to("cpu")
    return t if t.is_pinned() else t.pin_memory()


def _pool_bytes(host: list[dict[str, torch.Tensor]], slots_per_layer: list[int]) -> int:
    """Bytes the slots would take as copies: each layer's slots × one expert's tensors."""
    return sum(n * sum(t[0].numel() * t.element_size() for t in h.values())
               for h, n in zip(host, slots_per_layer) if h)


def _unpinned(ts: list[torch.Tensor]) -> bool:
    """Whether routed experts sit unpinned on the host (placed so on purpose: too big to pin; see
    :func:`~specter_lab.model.placement.place_for_offload`). The store then stages its copies through a bounded
    pinned ring instead of pinning a second copy of every expert."""
    return bool(ts) and all(t.device.type == "cpu" and not t.is_pinned() for t in ts)


def _signature(host: dict[str, torch.Tensor]) -> tuple:
    return tuple((n, tuple(t.shape[1:]), t.dtype) for n, t in host.items())


def _layer_signature(layer) -> tuple:
    """A layer's expert shapes without host copies (a tensorless store); layers of unknown shape share a pool."""
    experts = getattr(layer, "experts", None)
    if experts is None:
        return ()
    return tuple((n, tuple(getattr(experts, n).shape[1:]), getattr(experts, n).dtype) for n in layer.param_names)


class ExpertStore:
    """Residency of routed experts in a fixed number of device slots per layer.

    ``host[layer][name]`` are the fused expert tensors ``[E, ...]`` (the model's own parameters on CPU: no extra
    host memory). ``pools[group][name]`` are ``[rows, ...]`` device tensors, one group per distinct expert shape
    (one group when every layer is alike). ``cost.expert_bytes`` is what one expert copy costs on the link in the
    cost model (deployment dtype, maybe projected).
    """

    def __init__(self, info, slots_per_layer: list[int], clock, cost, policy: "Callable[[], Policy]", trace,
                 device: torch.device | str = "cpu", host: list[dict[str, torch.Tensor]] | None = None,
                 pool: str = "layer", materialize: bool = True, writeback: bool = False, tier=None) -> None:
        self.info = info
        self.tier = tier  # the disk tier (a bounded host cache over the files; tensorless in a replay), or None
        # Mixtral-Offloading's swap: an evicted expert is copied back to the host before its slot is reused
        # (upstream keeps only as many host copies as experts offloaded); here into a scratch buffer, since the
        # host copies stay immutable, so the bytes cross the link as they would there
        self.writeback = writeback
        self._wb_buffers: dict[int, dict[str, torch.Tensor]] = {}
        self.clock = clock
        self.cost = cost
        self._copy_bytes = cost.expert_bytes  # what every expert copy moves, and how long it takes on the link
        self._copy_s = cost.copy_time(self._copy_bytes)
        # one policy per pool: a layer's own slots, or one over every layer (global); ``policy`` makes a fresh one
        shared = policy() if pool == "global" else None
        self.policies: list[Policy] = [shared if shared is not None else policy() for _ in info.layers]
        self.trace = trace
        self._stamp = stamper(clock, trace.full)
        self.device = torch.device(device)
        self.fault_hook: Callable[[int, int], None] | None = None  # test hook: raise to inject a failed copy
        self.pool = pool
        # layer → experts placed on the device and not yet computed: a global pool's take for another layer (a
        # pre-gated prefetch of layer l+1 issued during layer l) must not move their slots away
        self.pinned: dict[int, set[int]] = {}
        self.materialize = materialize
        pin = self.device.type == "cuda"
        # experts left unpinned where they lie (too big to pin): copied through a bounded pinned ring
        stage = pin and materialize and self.tier is None and _unpinned(
            [t for h in host for t in h.values()] if host is not None else
            [getattr(l.experts, n) for l in info.layers for n in l.param_names])
        self.staging = PinnedStaging() if stage else None
        if materialize:
            self.host: list[dict[str, torch.Tensor]] = host if host is not None else [
                {name: _host_copy(getattr(layer.experts, name).detach(), pin and self.staging is None)
                 for name in layer.param_names} for layer in info.layers]
            sigs = [_signature(h) for h in self.host]
        else:
            self.host = [{} for _ in info.layers]
            sigs = [_layer_signature(layer) for layer in info.layers]
        self.group = [sigs.index(s) for s in sigs]  # layer → pool group (same shapes share a pool)
        # a large CPU store points its slots at the host copies instead of copying into them (module docstring)
        self.aliases = (materialize and self.tier is None and self.device.type == "cpu"
                        and _pool_bytes(self.host, slots_per_layer) > CPU_SLOT_COPY_LIMIT)
        self.pools: list[dict[str, torch.Tensor]] = []
        self.slots: list[LayerSlots] = [LayerSlots([], [], [], [], [], []) for _ in info.layers]
        for g in sorted(set(self.group)):
            members = [l for l in range(len(self.host)) if self.group[l] == g]
            rows = sum(slots_per_layer[l] for l in members)
            self.pools.append({} if self.aliases else  # {} without tensors, or with aliased slots
                              {name: torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=self.device)
                               for name, t in self.host[members[0]].items()})
            row = 0
            for l in members:
                for _ in range(slots_per_layer[l]):
                    self.slots[l].add(row)
                    row += 1
        self.group = [sorted(set(self.group)).index(g) for g in self.group]
        # per pool group: its rows, and how many hold an expert (a global pool's take looks for an empty slot
        # across the layers only while one exists)
        self._rows = [sum(slots_per_layer[l] for l in range(len(self.slots)) if self.group[l] == g)
                      for g in range(len(self.pools))]
        self._filled = [0] * len(self.pools)
        self._views: dict[tuple[int, int], dict[str, torch.Tensor]] = {}  # (group, row) → weight views
        self._host_views: dict[tuple[int, int], dict[str, torch.Tensor]] = {}  # (layer, expert) → host views

    # ------------------------------------------------------------------ queries
    @property
    def slots_per_layer(self) -> list[int]:
        return [s.size for s in self.slots]

    @property
    def policy(self) -> Policy:
        """The first layer's policy (every pool's is of the same kind): its ``name`` says how this store evicts."""
        return self.policies[0]

    def follow(self, forecast) -> None:
        """The window's forecast, for a policy that ranks by it (``forecast`` eviction); None at the run's end."""
        for p in dict.fromkeys(self.policies):
            p.follow(forecast)

    def victim(self, layer: int, protected) -> int | None:
        """The expert a copy into ``layer`` would evict from its own slots now, never one in ``protected`` (None: a
        free slot, or nothing evictable)."""
        s = self.slots[layer]
        if -1 in s.expert:
            return None
        key = self._layer_victim(layer, protected)
        return None if key is None else key[1]

    def _layer_victim(self, layer: int, protected) -> "tuple[int, int] | None":
        """The policy's victim among ``layer``'s residents not in ``protected`` (expert ids): a (layer, expert)."""
        pol = self.policies[layer]
        if self.pool == "global":  # the shared policy ranks every layer: keep to this layer's residents
            return pol.victim(_Protected(layer, protected), among=_OfLayer(layer, self.slots[layer].where))
        # a layer's own policy: its keys are all this layer's (asked of the few residents a victim's walk looks
        # at, rather than building every protected key)
        return pol.victim(_Protected(layer, protected))

    def resident(self, layer: int) -> set[int]:
        return set(self.slots[layer].where)

    def lookup(self, layer: int, expert: int) -> int | None:
        return self.slots[layer].where.get(expert)

    def weights(self, layer: int, slot: int) -> dict[str, torch.Tensor]:
        """Views of the slot's row in the pools (made once per row: building views is host work on every
        expert call otherwise), with the transposed view a plain ``x @ W.t()`` reads for untransposed layouts."""
        if not self.materialize:
            return {}  # a tensorless store (a replay): no weights to view
        key = (self.group[layer], self.slots[layer].rows[slot])
        views = self._views.get(key)
        if views is None:
            if self.aliases:
                raise RuntimeError(f"layer {layer} slot {slot}: read before any expert was copied into it")
            views = {name: pool[key[1]] for name, pool in self.pools[key[0]].items()}
            if not self.info.layers[layer].experts.is_transposed:
                views.update({f"{n}.t": t.t() for n, t in list(views.items()) if not n.endswith("_bias")})
            self._views[key] = views
        return views

    def _with_transposed(self, layer: int, views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``views`` plus the transposed view a plain ``x @ W.t()`` reads for untransposed layouts."""
        views = dict(views)
        if not self.info.layers[layer].experts.is_transposed:
            views.update({f"{n}.t": t.t() for n, t in list(views.items()) if not n.endswith("_bias")})
        return views

    def host_expert(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """Views of one expert's host copy (made once: the copy a miss issues then dispatches only its copies)."""
        key = (layer, expert)
        views = self._host_views.get(key)
        if views is None:
            views = self._host_views[key] = {name: t[expert] for name, t in self.host[layer].items()}
        return views

    def ready(self, layer: int, slot: int) -> Handle | None:
        return self.slots[layer].ready[slot]

    def copy_id(self, layer: int, slot: int) -> int | None:
        return self.slots[layer].copy_id[slot]

    def resident_count(self) -> int:
        return sum(len(s.where) for s in self.slots)

    def device_bytes(self) -> int:
        """Bytes the slot pools really hold on the device."""
        return sum(t.numel() * t.element_size() for pool in self.pools for t in pool.values())

    # ------------------------------------------------------------------ loading
    def _choose_slot(self, layer: int, protected: Iterable[int]) -> int | None:
        s = self.slots[layer]
        if len(s.where) < len(s.expert):  # an empty slot (experts are >= 0, empty is -1)
            return s.expert.index(-1)
        if not isinstance(protected, (set, frozenset, dict)):
            protected = set(protected)
        if self.pool == "global":
            return self._take_global(layer, protected)
        key = self._layer_victim(layer, protected)
        return None if key is None else s.where[key[1]]

    def _take_global(self, layer: int, protected: set[int]) -> int | None:
        """A slot for ``layer`` from the whole pool: an empty one anywhere, else the policy's victim over every
        layer sharing the pool (the policy's recency clock is global, so scores compare across layers). A slot
        of another layer moves here, with its row."""
        group = self.group[layer]
        empty = None
        if self._filled[group] < self._rows[group]:  # else no layer of the group has an empty slot: skip the look
            empty = next(((m, s.expert.index(-1)) for m, s in enumerate(self.slots)
                          if self.group[m] == group and -1 in s.expert), None)
        if empty is not None:
            m, j = empty
        else:
            key = self.policies[layer].victim(_Taken(layer, protected, self.pinned),
                                              among=None if len(self.pools) == 1 else _OfGroup(self.group, group))
            if key is None:
                return None
            m, j = key[0], self.slots[key[0]].where[key[1]]
        if m == layer:
            return j
        self.move_slot(m, layer, slot=j, min_keep=0)
        return self.slots[layer].size - 1

    def evict(self, layer: int, slot: int) -> None:
        s = self.slots[layer]
        e = s.expert[slot]
        if e < 0:
            return
        if s.prefetched[slot]:
            self.trace.cache(layer, e, "prefetch_wasted", self._stamp())
        self.trace.cache(layer, e, "evict", self._stamp())
        self.policies[layer].evicted((layer, e))
        self._filled[self.group[layer]] -= 1
        del s.where[e]
        s.expert[slot] = -1
        s.ready[slot] = s.copy_id[slot] = None
        s.prefetched[slot] = False

    def evict_all(self) -> None:
        """Drop every resident expert (``on_demand``: nothing is kept between steps)."""
        for layer, s in enumerate(self.slots):
            for slot in sorted(s.where.values()):  # the occupied slots, in slot order (an empty one has nothing)
                self.evict(layer, slot)

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
        after = (s.last_use[slot], s.ready[slot])  # never overwrite a slot still being read or written
        if self.writeback and s.expert[slot] >= 0:
            after = [self._write_back(layer, slot, after, issue_at)]
        self.evict(layer, slot)
        span = self._copy(layer, expert, slot, after, issue_at, reason)
        s.expert[slot] = expert
        s.where[expert] = slot
        self._filled[self.group[layer]] += 1
        s.ready[slot] = span.end
        s.prefetched[slot] = reason in AHEAD
        if reason in AHEAD:  # one accounting for both: a cache "prefetch", later used or wasted
            self.trace.cache(layer, expert, "prefetch", span.start)
        self.policies[layer].loaded((layer, expert))
        s.copy_id[slot] = self.trace.transfer(layer, expert, slot, self._copy_bytes, span.start, span.end, reason)
        return slot

    def _copy(self, layer: int, expert: int, slot: int, after, issue_at, reason: str = "demand"):
        hslot = None
        if self.tier is not None:  # from the host cache, read from the files first on its miss
            src, disk_end, hslot = self.tier.fetch(layer, expert, reason, issue_at)
            after = (*after, disk_end)
            src, dst = (src, self.weights(layer, slot)) if self.materialize else (None, None)
        elif self.materialize:
            src = self.host_expert(layer, expert)
            dst = None if self.aliases else self.weights(layer, slot)
        else:
            src = dst = None  # a tensorless store (a replay): only the fault hook, if any, runs
            if self.fault_hook is None:
                return self._clock_copy(layer, expert, slot, _no_copy, after, issue_at)

        def do_copy() -> None:
            if self.fault_hook is not None:
                self.fault_hook(layer, expert)
            if src is not None and self.aliases:  # the slot becomes a view of the host copy (same floats)
                self._views[(self.group[layer], self.slots[layer].rows[slot])] = self._with_transposed(layer, src)
            elif src is not None and self.staging is not None:
                self.staging.copy_into(src, dst)
            elif src is not None:
                for name, t in src.items():
                    dst[name].copy_(t, non_blocking=True)

        span = self._clock_copy(layer, expert, slot, do_copy, after, issue_at)
        if hslot is not None:
            self.tier.used(hslot, span.end)  # the host slot is not refilled before this copy ended
        return span

    def _clock_copy(self, layer: int, expert: int, slot: int, do_copy: Callable[[], None], after, issue_at):
        try:
            return self.clock.copy(self._copy_s, do_copy, after=after, issue_at=issue_at)
        except Exception as exc:  # the slot stays empty: nothing stale can be marked ready
            raise CopyFault(f"copy of layer {layer} expert {expert} into slot {slot} failed: {exc}") from exc

    def source_expert(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert's full-precision weights on the host, off the clock and outside the cache (the oracle's
        look at the target): the host copy's views, or with a disk tier a fresh read from the files."""
        if self.tier is not None and self.tier.files is not None:
            return self.tier.files.read(layer, expert)
        return self.host_expert(layer, expert)

    def _write_back(self, layer: int, slot: int, after, issue_at) -> Handle:
        """Copy the expert in ``slot`` device→host (a real copy into a scratch buffer; nothing without tensors),
        on the copy lane before the load that replaces it; recorded as a ``writeback`` transfer. Returns when it
        ends."""
        buf = self._wb_buffers.get(layer)
        if buf is None:
            pin = self.device.type == "cuda"
            buf = self._wb_buffers[layer] = {n: _host_copy(torch.empty_like(t[0], device="cpu"), pin)
                                             for n, t in self.host[layer].items()}
        src = self.weights(layer, slot)

        def do_copy() -> None:
            for name, t in buf.items():
                t.copy_(src[name], non_blocking=True)

        span = self.clock.copy(self._copy_s, do_copy, after=after, issue_at=issue_at)
        self.trace.transfer(layer, self.slots[layer].expert[slot], slot, self._copy_bytes, span.start, span.end,
                            "writeback")
        return span.end

    def prefetch(self, layer: int, expert: int, protected: Iterable[int] = (), issue_at: Handle | None = None,
                 reason: str = "prefetch") -> bool:
        """Start an asynchronous copy unless already resident. False when no slot may be evicted. ``reason``: one of
        :data:`AHEAD` (a forecast's ``prefetch``, or a ``refresh`` of a popular expert on an idle link)."""
        if expert in self.slots[layer].where:
            return False
        return self.load(layer, expert, reason, protected, issue_at) is not None

    def mark_used(self, layer: int, slot: int, end: Handle) -> None:
        s = self.slots[layer]
        s.last_use[slot] = end
        if s.prefetched[slot]:
            s.prefetched[slot] = False
            self.trace.cache(layer, s.expert[slot], "prefetch_used", end)
        self.policies[layer].touch((layer, s.expert[slot]))

    def used(self, layer: int, slots: list[int], spans: list) -> None:
        """:meth:`mark_used` of each slot in turn, read by the compute op whose span is given: one call per layer."""
        s = self.slots[layer]
        last_use, prefetched, expert = s.last_use, s.prefetched, s.expert
        for slot, span in zip(slots, spans):
            end = last_use[slot] = span.end
            if prefetched[slot]:
                prefetched[slot] = False
                self.trace.cache(layer, expert[slot], "prefetch_used", end)
        self.policies[layer].touch_all([(layer, expert[slot]) for slot in slots])  # in the same order

    def host_used(self, layer: int, slot: int, end: Handle) -> None:
        """A resident expert the host computed (a pre-gated split sends a copy still landing there): its lookup was
        a use, so the policy counts it as :meth:`mark_used` does (else a late prefetch is the next victim), and the
        prefetch that brought it served a lookup. The device did not read the slot: its last use stays."""
        s = self.slots[layer]
        if s.prefetched[slot]:
            s.prefetched[slot] = False
            self.trace.cache(layer, s.expert[slot], "prefetch_used", end)
        self.policies[layer].touch((layer, s.expert[slot]))

    def note_read(self, layer: int, slot: int, end: Handle) -> None:
        """The draft read a slot: a later copy into it must wait, but this is not a target use (no LRU touch)."""
        self.slots[layer].last_use[slot] = end

    # ------------------------------------------------------------------ sharing slots across layers
    def can_share(self) -> bool:
        """Slots can move between layers only if every layer's experts have the same tensor shapes."""
        return len(self.pools) == 1

    def move_slot(self, src: int, dst: int, protected: Iterable[int] = (), slot: int | None = None,
                  min_keep: int = 1) -> bool:
        """Give one slot of layer ``src`` to layer ``dst`` (total device memory unchanged): ``slot`` if given,
        else an empty slot if there is one, else the policy's victim among the unprotected. The moved slot
        arrives empty at ``dst`` with its row of the shared pool; a copy into it still waits for the last read of
        its old contents. False if ``src`` has no slot it may give (it keeps at least ``min_keep``)."""
        s, d = self.slots[src], self.slots[dst]
        if s.size <= min_keep or self.group[src] != self.group[dst]:
            return False
        empty = [i for i, e in enumerate(s.expert) if e < 0] if slot is None else None
        if slot is not None:
            i = slot
        elif empty:
            i = empty[0]
        else:
            key = self._layer_victim(src, set(protected))
            if key is None:
                return False
            i = s.where[key[1]]
        carried = [h for h in (s.last_use[i], s.ready[i]) if h is not None]
        self.evict(src, i)
        # The row's memory was last read or written by these ops: its next copy must wait for the later one.
        d.add(s.remove(i), last_use=self.clock.latest(carried))
        return True

    def flush_unused_prefetches(self) -> None:
        """End of a run: prefetched experts that were never used count as waste."""
        for layer, s in enumerate(self.slots):
            for slot, p in enumerate(s.prefetched):
                if p:
                    self.trace.cache(layer, s.expert[slot], "prefetch_wasted", self._stamp())
                    s.prefetched[slot] = False

    def release(self) -> None:
        """Free the device pools (the end of ``generate``): no slot memory outlives its run on the device, even
        while something still holds the store (a result, a notebook variable, a reference cycle)."""
        self.pools = [{name: t[:0] for name, t in pool.items()} for pool in self.pools]
        self._views.clear()

    def check_invariants(self, budget_slots: list[int] | None = None) -> None:
        """Raise AssertionError if the residency table disagrees with the slots (used by tests)."""
        rows = [r for s in self.slots for r in s.rows]
        assert len(rows) == len(set((self.group[l], r) for l, s in enumerate(self.slots) for r in s.rows)), \
            "a pool row belongs to two slots"
        for layer, s in enumerate(self.slots):
            assert len(s.where) <= s.size, f"layer {layer}: {len(s.where)} resident > {s.size} slots"
            for e, slot in s.where.items():
                assert s.expert[slot] == e, f"layer {layer}: table says expert {e} in slot {slot}"
            held = [e for e in s.expert if e >= 0]
            assert len(held) == len(set(held)) == len(s.where), f"layer {layer}: duplicate residency"
            if budget_slots is not None:
                assert len(s.where) <= budget_slots[layer]
        for g in range(len(self.pools)):
            members = [s for l, s in enumerate(self.slots) if self.group[l] == g]
            assert self._rows[g] == sum(s.size for s in members), f"group {g}: rows miscounted"
            assert self._filled[g] == sum(len(s.where) for s in members), f"group {g}: filled slots miscounted"


def _no_copy() -> None:
    """A tensorless store's copy (a replay): nothing to move."""


class _Protected:
    """``(layer, expert)`` keys a copy into ``layer`` may not evict: that layer's ``experts``."""

    __slots__ = ("layer", "experts")

    def __init__(self, layer: int, experts) -> None:
        self.layer, self.experts = layer, experts

    def __contains__(self, key) -> bool:
        return key[0] == self.layer and key[1] in self.experts


class _Taken(_Protected):
    """What a global pool's take for ``layer`` may not evict: that layer's protected experts, and every layer's
    experts placed on the device and not yet computed (``pinned``)."""

    __slots__ = ("pinned",)

    def __init__(self, layer: int, experts, pinned: dict[int, set[int]]) -> None:
        super().__init__(layer, experts)
        self.pinned = pinned

    def __contains__(self, key) -> bool:
        return (key[0] == self.layer and key[1] in self.experts) or key[1] in self.pinned.get(key[0], ())


class _OfLayer:
    """``(layer, expert)`` keys resident in one layer's slots (``where``: its expert → slot table)."""

    __slots__ = ("layer", "where")

    def __init__(self, layer: int, where: dict[int, int]) -> None:
        self.layer, self.where = layer, where

    def __contains__(self, key) -> bool:
        return key[0] == self.layer and key[1] in self.where


class _OfGroup:
    """Keys of the layers that share one pool group (same expert shapes)."""

    __slots__ = ("group", "g")

    def __init__(self, group: list[int], g: int) -> None:
        self.group, self.g = group, g

    def __contains__(self, key) -> bool:
        return self.group[key[0]] == self.g
