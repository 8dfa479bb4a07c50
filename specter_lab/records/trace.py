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
from typing import Any, Callable

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
        # The per-op records, as rows (tuples in their record's field order, clock handles as recorded): a tuple
        # costs a tenth of a record object, and a replay at trace="full" writes hundreds of thousands. The record
        # objects (``compute``, ``cache_events``, ...) are made when first read; times turn into ms then.
        self._rows: dict[str, list[tuple]] = {name: [] for name in _ROW_KINDS}
        self._objects: dict[str, list] = {}
        self._ms: Callable[[Handle], float] | None = None  # handle → ms, once finalized

    # the per-op records, read as objects (made from the rows on first read; their times in ms once finalized)
    routing_raw = property(lambda self: self._records("routing"))
    forecast = property(lambda self: self._records("forecast"))
    cache_events = property(lambda self: self._records("cache"))
    transfers = property(lambda self: self._records("transfers"))
    compute = property(lambda self: self._records("compute"))
    disk_reads = property(lambda self: self._records("disk"))

    # ----------------------------------------------------------- recording (hot path)
    def begin_step(self, step: int) -> None:
        self.step = step
        self.tally.step(step)

    def cache(self, layer: int, expert: int, event: str, t: Handle) -> None:
        self.tally.cache(event)
        if self.full:
            self._rows["cache"].append((self.step, layer, expert, event, t))

    def cache_many(self, layer: int, experts: list[int], event: str, t: Handle) -> None:
        """:meth:`cache` for several experts of one layer at once (one count at the ``steps`` level)."""
        if self.full:
            step = self.step
            self._rows["cache"].extend([(step, layer, e, event, t) for e in experts])
        if experts:
            self.tally.cache(event, len(experts))

    def transfer(self, layer: int, expert: int, slot: int, nbytes: int, start: Handle, end: Handle,
                 reason: str) -> int:
        """Record a copy; returns its id (counted even when not recorded, so ids stay unique)."""
        tid = self._copies
        self._copies += 1
        self.tally.transfer(nbytes, reason)
        if self.full:
            self._rows["transfers"].append((tid, self.step, layer, expert, slot, nbytes, start, end, reason))
        return tid

    def disk_read(self, layer: int, expert: int, slot: int, nbytes: int, file_bytes: int, start: Handle,
                  end: Handle, reason: str) -> int:
        """Record a read from the checkpoint files (the disk tier); returns its id (counted at every level)."""
        rid = self._reads
        self._reads += 1
        self.tally.disk_read(nbytes, file_bytes, start, end)
        if self.full:
            self._rows["disk"].append((rid, self.step, layer, expert, slot, nbytes, file_bytes, start, end, reason))
        return rid

    def span(self, phase: str, layer: int, expert: int, span, copy_id: int | None = None,
             lane: str = "device") -> None:
        self.tally.span(phase, lane, span.start, span.end, span.stall_from)
        if self.full:
            self._rows["compute"].append((self.step, phase, layer, expert, span.start, span.end, span.stall_from,
                                          copy_id, lane))

    def spans(self, phase: str, layer: int, experts: list[int], spans: list, copy_ids: "list[int | None] | None" = None,
              lane: str = "device") -> None:
        """:meth:`span` of each of ``experts`` in turn (their ``spans``, and the copies they read when the trace is
        full): one call per layer, not per expert."""
        self.tally.spans(phase, lane, spans)
        if self.full:
            step, ids = self.step, copy_ids or [None] * len(spans)
            self._rows["compute"].extend([(step, phase, layer, e, sp.start, sp.end, sp.stall_from, c, lane)
                                          for e, sp, c in zip(experts, spans, ids)])

    def routed(self, source: str, layer: int, pos0: int, index_array) -> None:
        if source == "target":
            self.tally.routed(layer, index_array)
        if self.record_routing and self.full:
            # A list, not the numpy view: views of tiny tensors pin small heap blocks between the KV-cache
            # reallocations and fragment the heap (measured by scripts/long_run.py).
            self._rows["routing"].append((self.step, source, layer, pos0, index_array.tolist()))

    def forecast_count(self, layer: int, expert: int, count: int) -> None:
        self.tally.named(layer, expert)
        if self.full:
            self._rows["forecast"].append((self.step, layer, expert, count))

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
        """Turn clock handles into ms (synchronising a CUDA clock once). Idempotent. The per-op records' times
        turn when they are first read (:meth:`_records`, :meth:`frames`): a sweep that reads the metrics alone
        converts none."""
        if self._finalized:
            return self
        clock.synchronize()
        ms = self._ms = _cutting(clock.to_ms, [(clock.to_ms(a), clock.to_ms(b)) for a, b in self.excluded])
        self.tally.finalize(ms)
        for rec in self.steps:
            rec.start, rec.end = ms(rec.start), ms(rec.end)
        for rec in self.tokens:
            rec.time = ms(rec.time)
        self._finalized = True
        return self

    def exclude(self, start: Handle, end: Handle) -> None:
        """Cut [start, end] out of the timeline at finalize(): every later time moves back by its length."""
        self.excluded.append((start, end))

    def _timed_rows(self, name: str) -> list[tuple]:
        """The rows of a per-op kind with their times in ms once finalized (as recorded before): the compute
        spans' ``stall`` becomes how long each waited."""
        rows = self._rows[name]
        ms = self._ms
        if ms is None or name not in _ROW_TIMES:
            return rows
        if name == "cache":
            return [(a, b, c, d, ms(t)) for a, b, c, d, t in rows]
        if name == "transfers":
            return [(i, st, l, e, sl, nb, ms(t0), ms(t1), why) for i, st, l, e, sl, nb, t0, t1, why in rows]
        if name == "disk":
            return [(i, st, l, e, sl, nb, fb, ms(t0), ms(t1), why) for i, st, l, e, sl, nb, fb, t0, t1, why in rows]
        out = []
        for st, ph, l, e, t0, t1, ready, cid, lane in rows:  # compute
            start = ms(t0)
            out.append((st, ph, l, e, start, ms(t1), start - ms(ready) if ready is not None else 0.0, cid, lane))
        return out

    def _records(self, name: str) -> list:
        """A kind's records as objects: steps and tokens as kept; a per-op kind made from its rows (kept once
        finalized: the records are then the run's for good)."""
        if name == "steps":
            return self.steps
        if name == "tokens":
            return self.tokens
        objs = self._objects.get(name)
        if objs is None:
            cls = RoutingRecord if name == "routing" else _RECORDS[name]
            objs = [cls(*r) for r in self._timed_rows(name)]
            if self._finalized:
                self._objects[name] = objs
        return objs

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
        if "steps" in wanted:
            copy.steps = [StepRecord(*(getattr(r, c) for c in r.__slots__)) for r in self.steps]
        if "tokens" in wanted:
            copy.tokens = [TokenRecord(*(getattr(r, c) for c in r.__slots__)) for r in self.tokens]
        for name in _ROW_KINDS:
            if name in wanted:
                copy._rows[name] = list(self._rows[name])  # rows are tuples: a shallow copy is a copy
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
            if name == "routing":
                f = _routing_frame(self._rows["routing"])
            elif name in _ROW_KINDS:
                f = pd.DataFrame(self._timed_rows(name), columns=COLUMNS[name])
            else:
                f = _frame(self._records(name), COLUMNS[name])
            self._frames[name] = f
        return f


_FRAME_ORDER = ("steps", "tokens", "routing", "forecast", "cache", "transfers", "compute", "disk")
_ROW_KINDS = ("routing", "forecast", "cache", "transfers", "compute", "disk")  # kept as rows (Trace._rows)
_ROW_TIMES = ("cache", "transfers", "compute", "disk")  # rows with clock handles in them


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


def _routing_frame(raw: list[tuple]) -> pd.DataFrame:
    """Expand the compact per-forward routing rows (step, source, layer, pos0, ids) into one long frame (one numpy
    concat, not a frame each)."""
    if not raw:
        return pd.DataFrame(columns=COLUMNS["routing"])
    arrays = [np.asarray(ids, dtype=np.int64).reshape(len(ids), -1) for _, _, _, _, ids in raw]
    sizes = [a.size for a in arrays]
    cols = {
        "step": np.repeat([r[0] for r in raw], sizes),
        "position": np.concatenate([np.repeat(np.arange(r[3], r[3] + a.shape[0]), a.shape[1])
                                    for r, a in zip(raw, arrays)]),
        "layer": np.repeat([r[2] for r in raw], sizes),
        "expert": np.concatenate([a.reshape(-1) for a in arrays]),
        "rank": np.concatenate([np.tile(np.arange(a.shape[1]), a.shape[0]) for a in arrays]),
        "source": np.repeat(np.array([r[1] for r in raw], dtype=object), sizes),
    }
    keep = cols["expert"] >= 0  # -1: a slot an imported trace did not record (no lookup)
    return pd.DataFrame({name: col[keep] for name, col in cols.items()})
