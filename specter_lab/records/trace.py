"""Trace: typed records of one generation, turned into pandas DataFrames on demand, and the tally the metrics read.

The per-op records (``trace="full"``) are what the views draw; the :class:`~specter_lab.records.tally.Tally` beside them
is counted at every level, so :mod:`specter_lab.records.metrics` needs no frame and a sweep needs no per-op record.

Each record kind is one slotted dataclass below; its fields are the columns of its frame (``COLUMNS``). Times are
clock handles while the run records and milliseconds from the start of the run once :meth:`Trace.finalize` ran,
on the clock named in ``trace.meta['clock']``.

The trace also owns the *current step*: the decode loop calls :meth:`Trace.begin_step`, and everything recorded
until the next call (copies, cache events, spans, routing) belongs to that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

from .tally import Tally
from ..units import Handle

__all__ = ["Trace", "StepRecord", "TokenRecord", "RoutingRecord", "ForecastRecord", "CacheEvent", "Transfer",
           "ComputeSpan", "DiskRead", "COLUMNS", "TRACE_LEVELS"]



@dataclass(slots=True)
class StepRecord:
    """One decoding step: the prefill, one token (``decode``) or one draft/verify ``window``."""

    step: int
    kind: str
    start: Handle
    end: Handle
    drafted: int
    accepted: int
    committed: int
    recomputed: int = 0  # tokens fed again after a recurrent state was restored (hybrid models)


@dataclass(slots=True)
class TokenRecord:
    """A generated token (``committed``) or a draft token verification rejected. ``status``: prefill | decode |
    accepted | rejected | corrected | bonus."""

    index: int
    step: int
    token_id: int
    status: str
    committed: bool
    time: Handle


@dataclass(slots=True)
class RoutingRecord:
    """The top-k expert ids of one forward in one layer, ``ids[t][r]`` for token ``pos0 + t`` and rank ``r``
    (expanded to one row per (position, rank) in the frame). ``source``: draft | target | shadow | recompute."""

    step: int
    source: str
    layer: int
    pos0: int
    ids: list


@dataclass(slots=True)
class ForecastRecord:
    """What the predictor said the target would need in a step: ``count`` routings of (layer, expert)."""

    step: int
    layer: int
    expert: int
    count: int


@dataclass(slots=True)
class CacheEvent:
    """hit | miss | host | prefetch | prefetch_used | prefetch_wasted | evict, for one (layer, expert). ``host``
    follows a ``miss`` that was computed on the host CPU instead of copied (host execution)."""

    step: int
    layer: int
    expert: int
    event: str
    time: Handle


@dataclass(slots=True)
class Transfer:
    """One host→device copy of an expert into a slot; ``id`` is what compute spans name in ``copy_id``."""

    id: int
    step: int
    layer: int
    expert: int
    slot: int
    bytes: int
    start: Handle
    end: Handle
    reason: str  # demand | prefetch (a forecast) | refresh (offload/refresh.py) | preload (static, before the prompt)


# Copy reasons that load an expert ahead of its lookup: a forecast's prefetch, or a refresh (offload/refresh.py).
# Both count as a cache "prefetch", later used or wasted; the views tell them apart.
AHEAD = ("prefetch", "refresh")


@dataclass(slots=True)
class DiskRead:
    """One expert read from the checkpoint's files into a host-cache slot (the disk tier), before its copy to the
    device (or its host compute). ``bytes`` is what the clock priced (the copies' bytes: deployment dtype, maybe
    projected); ``file_bytes`` what was really read; ``reason`` the device load it served (demand | prefetch |
    preload | host)."""

    id: int
    step: int
    layer: int
    expert: int
    slot: int  # the host-cache slot it filled
    bytes: int
    file_bytes: int
    start: Handle
    end: Handle
    reason: str


@dataclass(slots=True)
class ComputeSpan:
    """One compute op on a lane: an expert (``expert >= 0``), a layer's dense part (``expert == -1``) or the LM
    head (``layer == -1``). ``stall`` is how long it waited on copies after its lane was free; ``copy_id`` the
    transfer that brought the weights it read (None: resident from before, a draft copy, or no expert)."""

    step: int
    phase: str
    layer: int
    expert: int
    start: Handle
    end: Handle
    stall: Handle  # while recording: the handle of when the lane was ready; finalize() makes it ms of waiting
    copy_id: int | None = None
    lane: str = "device"  # device | host (an expert computed on the host CPU: host execution)


_RECORDS = {"steps": StepRecord, "tokens": TokenRecord, "forecast": ForecastRecord, "cache": CacheEvent,
            "transfers": Transfer, "compute": ComputeSpan, "disk": DiskRead}
COLUMNS: dict[str, list[str]] = {name: [f.name for f in fields(cls)] for name, cls in _RECORDS.items()}
COLUMNS["routing"] = ["step", "position", "layer", "expert", "rank", "source"]
_TIMES = {"steps": ("start", "end"), "tokens": ("time",), "cache": ("time",), "transfers": ("start", "end"),
          "compute": ("start", "end"), "disk": ("start", "end")}
TRACE_LEVELS = ("full", "steps")


@dataclass
class Trace:
    """Append-only records of one run. ``meta`` says which clock produced the times and what was priced.

    ``level="full"`` records everything; ``level="steps"`` only steps and tokens (what a speed run or a sweep
    pays for), the per-op records stay empty. The :class:`~specter_lab.records.tally.Tally` that the metrics read is
    kept at both levels, so a run's metrics do not depend on its level. ``numeric``: the clock's handles are
    numbers (the simulated clock), summed as they come."""

    meta: dict[str, Any] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    tokens: list[TokenRecord] = field(default_factory=list)
    routing_raw: list[RoutingRecord] = field(default_factory=list)
    forecast: list[ForecastRecord] = field(default_factory=list)
    cache_events: list[CacheEvent] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    compute: list[ComputeSpan] = field(default_factory=list)
    disk_reads: list[DiskRead] = field(default_factory=list)
    record_routing: bool = True
    level: str = "full"
    numeric: bool = True
    tally: Tally | None = None
    step: int = 0  # the step being recorded (begin_step)
    _copies: int = 0  # transfer ids handed out
    _reads: int = 0  # disk read ids handed out
    _finalized: bool = False
    _frames: dict | None = None
    # (start, end) handles of work that is not part of the method (the oracle's look at the target's true
    # routing, a real forward on CUDA): finalize() cuts these intervals out of the timeline
    excluded: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.level not in TRACE_LEVELS:
            raise ValueError(f"trace={self.level!r}: use one of {TRACE_LEVELS}.")
        self.full = self.level == "full"
        if self.tally is None:
            self.tally = Tally(self.numeric, timed=self.numeric or self.full)

    # ----------------------------------------------------------- recording (hot path)
    def begin_step(self, step: int) -> None:
        self.step = step
        self.tally.step(step)

    def cache(self, layer: int, expert: int, event: str, t: Handle) -> None:
        self.tally.cache(event)
        if self.full:
            self.cache_events.append(CacheEvent(self.step, layer, expert, event, t))

    def cache_many(self, layer: int, experts: list[int], event: str, t: Handle) -> None:
        """:meth:`cache` for several experts of one layer at once (one count at the ``steps`` level)."""
        if self.full:
            for e in experts:
                self.cache_events.append(CacheEvent(self.step, layer, e, event, t))
        if experts:
            self.tally.cache(event, len(experts))

    def transfer(self, layer: int, expert: int, slot: int, nbytes: int, start: Handle, end: Handle,
                 reason: str) -> int:
        """Record a copy; returns its id (counted even when not recorded, so ids stay unique)."""
        tid = self._copies
        self._copies += 1
        self.tally.transfer(nbytes, reason)
        if self.full:
            self.transfers.append(Transfer(tid, self.step, layer, expert, slot, nbytes, start, end, reason))
        return tid

    def disk_read(self, layer: int, expert: int, slot: int, nbytes: int, file_bytes: int, start: Handle,
                  end: Handle, reason: str) -> int:
        """Record a read from the checkpoint files (the disk tier); returns its id (counted at every level)."""
        rid = self._reads
        self._reads += 1
        self.tally.disk_read(nbytes, file_bytes, start, end)
        if self.full:
            self.disk_reads.append(DiskRead(rid, self.step, layer, expert, slot, nbytes, file_bytes, start, end,
                                            reason))
        return rid

    def span(self, phase: str, layer: int, expert: int, span, copy_id: int | None = None,
             lane: str = "device") -> None:
        self.tally.span(phase, lane, span.start, span.end, span.stall_from)
        if self.full:
            self.compute.append(ComputeSpan(self.step, phase, layer, expert, span.start, span.end,
                                            span.stall_from, copy_id, lane))

    def spans(self, phase: str, layer: int, experts: list[int], spans: list, copy_ids: "list[int | None] | None" = None,
              lane: str = "device") -> None:
        """:meth:`span` of each of ``experts`` in turn (their ``spans``, and the copies they read when the trace is
        full): one call per layer, not per expert."""
        self.tally.spans(phase, lane, spans)
        if self.full:
            step, ids = self.step, copy_ids or [None] * len(spans)
            self.compute.extend([ComputeSpan(step, phase, layer, e, sp.start, sp.end, sp.stall_from, c, lane)
                                 for e, sp, c in zip(experts, spans, ids)])

    def routed(self, source: str, layer: int, pos0: int, index_array) -> None:
        if source == "target":
            self.tally.routed(layer, index_array)
        if self.record_routing and self.full:
            # A list, not the numpy view: views of tiny tensors pin small heap blocks between the KV-cache
            # reallocations and fragment the heap (measured by scripts/long_run.py).
            self.routing_raw.append(RoutingRecord(self.step, source, layer, pos0, index_array.tolist()))

    def forecast_count(self, layer: int, expert: int, count: int) -> None:
        self.tally.named(layer, expert)
        if self.full:
            self.forecast.append(ForecastRecord(self.step, layer, expert, count))

    def token(self, index: int, token_id: int, status: str, committed: bool, t: Handle) -> None:
        self.tokens.append(TokenRecord(index, self.step, token_id, status, committed, t))

    def step_done(self, kind: str, start: Handle, end: Handle, drafted: int = 0, accepted: int = 0,
                  committed: int = 1, recomputed: int = 0) -> None:
        self.steps.append(StepRecord(self.step, kind, start, end, drafted, accepted, committed, recomputed))

    @property
    def copies(self) -> int:
        """Copies recorded so far (at every level: ids are handed out either way)."""
        return self._copies

    # ----------------------------------------------------------- resolving
    def finalize(self, clock) -> "Trace":
        """Turn clock handles into ms (synchronising a CUDA clock once). Idempotent."""
        if self._finalized:
            return self
        clock.synchronize()
        ms = _cutting(clock.to_ms, [(clock.to_ms(a), clock.to_ms(b)) for a, b in self.excluded])
        self.tally.finalize(ms)
        for name, cols in _TIMES.items():
            for rec in self._records(name):
                for c in cols:
                    setattr(rec, c, ms(getattr(rec, c)))
        for rec in self.compute:
            rec.stall = rec.start - ms(rec.stall) if rec.stall is not None else 0.0
        self._finalized = True
        return self

    def exclude(self, start: Handle, end: Handle) -> None:
        """Cut [start, end] out of the timeline at finalize(): every later time moves back by its length."""
        self.excluded.append((start, end))

    def _records(self, name: str) -> list:
        return {"steps": self.steps, "tokens": self.tokens, "forecast": self.forecast, "cache": self.cache_events,
                "transfers": self.transfers, "compute": self.compute, "disk": self.disk_reads}[name]

    def snapshot(self, clock, kinds: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Frames of the run *so far*, while it is still recording (what a live view draws), plus ``meta``.

        The records are copied and their times resolved on the copy, so the run goes on recording untouched.
        ``kinds`` (e.g. ``("steps", "tokens")``) copies only those frames and leaves the others empty: a view of
        the token strip and the progress then costs nothing per copy, expert or routing record.
        On a CUDA clock resolving a time synchronises the device: a live view that refreshes often perturbs
        the timings it shows, which is why views throttle their refreshes."""
        if self._finalized:
            return {**self.frames(), "meta": dict(self.meta)}
        wanted = set(_RECORDS) | {"routing"} if kinds is None else set(kinds)
        copy = Trace(meta=dict(self.meta), record_routing=self.record_routing, level=self.level,
                     numeric=self.numeric)
        for name, attr, recs in (("steps", "steps", self.steps), ("tokens", "tokens", self.tokens),
                                 ("cache", "cache_events", self.cache_events),
                                 ("transfers", "transfers", self.transfers), ("compute", "compute", self.compute),
                                 ("disk", "disk_reads", self.disk_reads)):
            if name in wanted:
                setattr(copy, attr, [type(r)(*(getattr(r, c) for c in r.__slots__)) for r in recs])
        copy.forecast = list(self.forecast) if "forecast" in wanted else []
        copy.routing_raw = list(self.routing_raw) if "routing" in wanted else []
        return {**copy.finalize(clock).frames(), "meta": copy.meta}

    def frames(self) -> dict[str, pd.DataFrame]:
        """All frames as pandas DataFrames (cached after the first call)."""
        if self._frames is None or len(self._frames) < len(_FRAME_ORDER):
            self._frames = {name: self.frame(name) for name in _FRAME_ORDER}
        return self._frames

    def frame(self, name: str) -> pd.DataFrame:
        """One of :meth:`frames`, built alone (and cached): a view of the steps and tokens builds no other."""
        if not self._finalized:
            raise RuntimeError("trace is still recording; frames() is available once generate() returned")
        if self._frames is None:
            self._frames = {}
        f = self._frames.get(name)
        if f is None:
            f = self._frames[name] = (_routing_frame(self.routing_raw) if name == "routing" else
                                      _frame(self._records(name), COLUMNS[name]))
        return f


_FRAME_ORDER = ("steps", "tokens", "routing", "forecast", "cache", "transfers", "compute", "disk")


def _cutting(ms, cuts: list[tuple[float, float]]):
    """``ms`` with the intervals ``cuts`` (ms) removed from the time axis: a time after a cut moves back by the
    cut's length, a time inside one moves to its start."""
    if not cuts:
        return ms
    cuts = sorted(cuts)

    def cut_ms(h):
        t = ms(h)
        return t - sum(max(0.0, min(t, b) - a) for a, b in cuts)

    return cut_ms


def _frame(records: list, columns: list[str]) -> pd.DataFrame:
    get = attrgetter(*columns)
    return pd.DataFrame([get(r) for r in records], columns=columns)


def _routing_frame(raw: list[RoutingRecord]) -> pd.DataFrame:
    """Expand the compact per-forward routing arrays into one long frame (one numpy concat, not a frame each)."""
    if not raw:
        return pd.DataFrame(columns=COLUMNS["routing"])
    arrays = [np.asarray(r.ids, dtype=np.int64).reshape(len(r.ids), -1) for r in raw]
    sizes = [a.size for a in arrays]
    cols = {
        "step": np.repeat([r.step for r in raw], sizes),
        "position": np.concatenate([np.repeat(np.arange(r.pos0, r.pos0 + a.shape[0]), a.shape[1])
                                    for r, a in zip(raw, arrays)]),
        "layer": np.repeat([r.layer for r in raw], sizes),
        "expert": np.concatenate([a.reshape(-1) for a in arrays]),
        "rank": np.concatenate([np.tile(np.arange(a.shape[1]), a.shape[0]) for a in arrays]),
        "source": np.repeat(np.array([r.source for r in raw], dtype=object), sizes),
    }
    keep = cols["expert"] >= 0  # -1: a slot an imported trace did not record (no lookup)
    return pd.DataFrame({name: col[keep] for name, col in cols.items()})
