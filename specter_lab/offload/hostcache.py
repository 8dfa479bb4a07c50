"""The disk tier: a bounded host-RAM expert cache between the device slots and the checkpoint's files.

Three tiers: device slots (:class:`~specter_lab.offload.store.ExpertStore`) ← host expert cache (this module) ←
the safetensors files (:class:`~specter_lab.model.expert_files.ExpertFiles`). Without it the store reads every
expert from a host copy of all of them (the model's parameters: in RAM, or mapped from the files and paged by the
OS, invisibly). With it (``host_budget=``) the host keeps at most ``host_budget`` bytes of expert weights: a fixed
pool of host slots allocated once (pinned on CUDA), an LRU over (layer, expert), and every miss read from the files
with ``os.preadv`` into the slot it evicts, the file's pages released after the read
(``posix_fadvise(DONTNEED)``), so what the run holds of the experts is the pool, whatever the checkpoint's size.

On the clock a host-cache miss is a read on the ``disk`` lane (priced by the profile's ``disk_bandwidth`` and
``disk_latency`` on the simulated clock), and the copy to the device (or the host compute) waits for it. A slot is
refilled only after the last copy that read it ended (``busy``): on CUDA the pinned slot is then free to
overwrite. Reads are recorded as ``trace.disk_reads`` (the ``disk`` frame) and counted in the metrics
(``disk_reads``, ``disk_bytes_per_token``, ``disk_ms_per_token``).

The cache's contents persist across the runs of one engine (a warm host cache, like a real one); its clock handles
do not (:meth:`HostExpertCache.new_run`). Its own counters (``reads``, ``hits``, ``peak_bytes``) are cumulative.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import HostBudgetTooSmall
from ..model.expert_files import ExpertFiles
from ..units import Handle, format_bytes

__all__ = ["HostExpertCache", "DiskTier"]


class HostExpertCache:
    """At most ``budget_bytes`` of routed-expert weights in host RAM: ``capacity`` slots of one expert each, in
    one preallocated pool per tensor name, and an LRU over which (layer, expert) each slot holds.

    Raises :class:`~specter_lab.errors.HostBudgetTooSmall` when the budget cannot hold one expert, and ValueError
    when the layers' experts differ in shape (one pool serves every layer)."""

    def __init__(self, files: ExpertFiles, budget_bytes: int, pin: bool = False) -> None:
        info = files.info
        sig = _one_signature(info)
        self.files = files
        self.pieces = sum(len(ps[0]) for ps in files.pieces[0].values())  # reads per expert
        self._setup(info, files.expert_bytes[0], budget_bytes)
        self.pool: dict[str, torch.Tensor] = {}
        for name, shape, dtype in sig:  # pinned where allocated (no transient second copy of the pool)
            self.pool[name] = torch.empty((self.capacity, *shape), dtype=dtype, pin_memory=pin)
        self._views = [{n: p[i] for n, p in self.pool.items()} for i in range(self.capacity)]

    @classmethod
    def tensorless(cls, info, budget_bytes: int) -> "HostExpertCache":
        """The same cache without memory or files: its LRU, slots and accounting only (a replay prices the disk
        tier from recorded routing). Each expert is priced as one read per fused tensor (a fused checkpoint)."""
        _one_signature(info)
        self = cls.__new__(cls)
        self.files = None
        first = info.layers[0]
        self.pieces = len(first.param_names)
        per = sum(math.prod(getattr(first.experts, n).shape[1:]) * getattr(first.experts, n).element_size()
                  for n in first.param_names)
        self._setup(info, per, budget_bytes)
        self.pool = {}
        self._views = [{} for _ in range(self.capacity)]
        return self

    def _setup(self, info, expert_bytes: int, budget_bytes: int) -> None:
        self.expert_bytes = int(expert_bytes)
        self.budget_bytes = int(budget_bytes)
        total = sum(l.num_experts for l in info.layers)
        if self.budget_bytes < self.expert_bytes:
            raise HostBudgetTooSmall(
                f"host_budget={format_bytes(self.budget_bytes)} cannot hold one expert "
                f"({format_bytes(self.expert_bytes)}); give at least that (the experts total "
                f"{format_bytes(total * self.expert_bytes)}).", self.budget_bytes, self.expert_bytes)
        self.capacity = min(total, self.budget_bytes // self.expert_bytes)
        self.slot_of: OrderedDict[tuple[int, int], int] = OrderedDict()  # LRU order: oldest first
        self.key: list[tuple[int, int] | None] = [None] * self.capacity
        self.ready: list[Handle | None] = [None] * self.capacity  # when the read that filled the slot ended
        self.busy: list[Handle | None] = [None] * self.capacity  # when the last copy / compute reading it ends
        self.reads = self.hits = self.evictions = 0
        self.bytes_read = 0
        self.peak_bytes = 0

    # ------------------------------------------------------------------ accounting
    @property
    def held_bytes(self) -> int:
        """Bytes of expert weights the cache holds now (occupied slots)."""
        return len(self.slot_of) * self.expert_bytes

    @property
    def pool_bytes(self) -> int:
        """Bytes the pool allocated (every slot, occupied or not; a tensorless cache's as if it had): never more
        than ``budget_bytes``."""
        return self.capacity * self.expert_bytes

    def new_run(self) -> None:
        """A new run on a new clock: the contents stay, the previous clock's handles go."""
        self.ready = [None] * self.capacity
        self.busy = [None] * self.capacity

    # ------------------------------------------------------------------ slots
    def views(self, slot: int) -> dict[str, torch.Tensor]:
        return self._views[slot]

    def lookup(self, layer: int, expert: int) -> int | None:
        """The slot holding (layer, expert), touched as most recently used; None on a miss."""
        slot = self.slot_of.get((layer, expert))
        if slot is not None:
            self.slot_of.move_to_end((layer, expert))
            self.hits += 1
        return slot

    def take(self, layer: int, expert: int) -> int:
        """A slot for (layer, expert): a free one, else the least recently used one's (evicted)."""
        if len(self.slot_of) < self.capacity:
            slot = self.key.index(None)
        else:
            old, slot = self.slot_of.popitem(last=False)
            self.key[slot] = None
            self.evictions += 1
        self.key[slot] = (layer, expert)
        self.slot_of[(layer, expert)] = slot
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        return slot

    def fill(self, slot: int, layer: int, expert: int) -> int:
        """Read (layer, expert) from the files into ``slot``; returns the bytes read."""
        n = self.files.read_into(layer, expert, self._views[slot]) if self.files is not None else 0
        self.reads += 1
        self.bytes_read += n
        return n

    def check_invariants(self) -> None:
        """Raise AssertionError when the accounting disagrees with itself (tests)."""
        assert len(self.slot_of) <= self.capacity
        assert self.held_bytes <= self.pool_bytes <= self.budget_bytes, (self.held_bytes, self.pool_bytes)
        assert sum(t.numel() * t.element_size() for t in self.pool.values()) in (0, self.pool_bytes)
        for k, s in self.slot_of.items():
            assert self.key[s] == k, f"slot {s} holds {self.key[s]}, the table says {k}"

    def __repr__(self) -> str:
        return (f"HostExpertCache({self.capacity} slots × {format_bytes(self.expert_bytes)} = "
                f"{format_bytes(self.pool_bytes)} of host_budget {format_bytes(self.budget_bytes)}; "
                f"{self.reads} disk reads, {self.hits} hits)")


def _one_signature(info) -> tuple:
    """The layers' one expert signature ((name, shape, dtype) per tensor); ValueError when they differ."""
    sigs = {tuple((n, tuple(getattr(l.experts, n).shape[1:]), getattr(l.experts, n).dtype) for n in l.param_names)
            for l in info.layers}
    if len(sigs) != 1:
        raise ValueError("host_budget=: the disk tier keeps one pool of host slots, and this model's MoE layers "
                         f"have {len(sigs)} different expert shapes; run it without host_budget.")
    return next(iter(sigs))


@dataclass
class DiskTier:
    """One run's view of the host cache: reads on the run's clock, recorded in its trace, priced by its cost
    model. ``fetch`` is what the store (a device copy's source) and the schedule (a host compute's weights) call."""

    cache: HostExpertCache
    clock: Any
    cost: Any
    trace: Any

    def __post_init__(self) -> None:
        self.cache.new_run()
        self._read_s = self.cost.disk_time(self.cost.expert_bytes, self.cache.pieces)

    @property
    def files(self) -> "ExpertFiles | None":
        return self.cache.files

    def fetch(self, layer: int, expert: int, reason: str,
              issue_at: Handle | None = None) -> tuple[dict[str, torch.Tensor], Handle | None, int]:
        """(host views of the expert, when they are there, host slot): a hit, or a read from the files issued at
        ``issue_at`` into the least recently used slot (after the last read of its old contents)."""
        c = self.cache
        slot = c.lookup(layer, expert)
        if slot is not None:
            return c.views(slot), c.ready[slot], slot
        slot = c.take(layer, expert)
        got: list[int] = []
        span = self.clock.disk(self._read_s, lambda: got.append(c.fill(slot, layer, expert)), after=(c.busy[slot],),
                               issue_at=issue_at)
        c.ready[slot] = span.end
        self.trace.disk_read(layer, expert, slot, int(self.cost.expert_bytes), got[0], span.start, span.end, reason)
        return c.views(slot), span.end, slot

    def used(self, slot: int, end: Handle | None) -> None:
        """A copy or compute reading ``slot`` ends at ``end``: the slot is not refilled before."""
        if end is not None:
            b = self.cache.busy[slot]
            self.cache.busy[slot] = end if b is None else self.clock.latest([b, end])
