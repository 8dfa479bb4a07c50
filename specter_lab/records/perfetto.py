"""A run's timeline as Chrome trace-event JSON, the format ui.perfetto.dev and chrome://tracing open
(``result.to_perfetto(path)``, ``specter-lab run --perfetto FILE``).

One process, one track per lane: ``steps`` (a slice per decoding step), ``compute`` (the device stream: each
layer's dense part, each expert, the head), ``copy`` (the host-to-device link: each expert copy), ``host``
(experts computed on the host CPU) and ``disk`` (the disk tier: experts read from the checkpoint files into the
host cache; present only when the run had one, with a flow arrow from each read to the copy or host compute that
waited for it). Expert slices carry layer, expert, hit / miss, bytes and stall as args; a flow
arrow runs from each copy to the compute that read its weights (``ComputeSpan.copy_id``). ``status`` is ``hit``
(on the device before this step), ``miss`` (a demand copy in this step), ``prefetch`` / ``preload`` (copied ahead
in this step), ``host`` or ``draft`` (the draft's own low-bit copy). Times are the run's
clock (simulated or CUDA), in microseconds from the start of the run. Format reference: the Trace Event Format
(Google, "Trace Event Format" doc: ph X complete events, M metadata, s/f flow events).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..atomic import write_atomic

__all__ = ["trace_events", "write_perfetto", "TRACKS"]

PID = 1
TRACKS = {"steps": 1, "compute": 2, "copy": 3, "host": 4, "disk": 5}
_TRACK_TITLES = {"steps": "steps", "compute": "compute (device stream)", "copy": "copy (host to device link)",
                 "host": "host (experts on the CPU)", "disk": "disk (checkpoint files to the host cache)"}


def _us(ms: float) -> float:
    return round(float(ms) * 1e3, 3)


def _meta(result, disk: bool) -> list[dict]:
    m = result.metrics
    name = f"specter_lab {result.strategy} · {m.get('clock', '?')}"
    events = [{"ph": "M", "name": "process_name", "pid": PID, "args": {"name": name}}]
    for track, tid in TRACKS.items():
        if track == "disk" and not disk:
            continue
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid,
                       "args": {"name": _TRACK_TITLES[track]}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
    return events


def _slice(name: str, track: str, start_ms: float, end_ms: float, cat: str, args: dict) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "pid": PID, "tid": TRACKS[track], "ts": _us(start_ms),
            "dur": max(0.001, _us(end_ms) - _us(start_ms)), "args": args}


def _clean(args: dict) -> dict:
    """JSON-safe args: numpy scalars to Python, NaN / None dropped."""
    out = {}
    for k, v in args.items():
        v = v.item() if hasattr(v, "item") else v
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        out[k] = v
    return out


def trace_events(result) -> dict[str, Any]:
    """The trace-event document of ``result`` (a :class:`~specter_lab.run.engine.GenerationResult`)."""
    f = result.frames()
    if f["compute"].empty and f["transfers"].empty:
        raise ValueError("this run recorded no per-op events (trace='steps'): run the Engine with trace='full' "
                         "for a timeline.")
    disk = f.get("disk")
    has_disk = disk is not None and not disk.empty
    events = _meta(result, has_disk)
    for s in f["steps"].itertuples(index=False):
        events.append(_slice(f"{s.kind} {s.step}", "steps", s.start, s.end, "step", _clean(
            {"step": s.step, "kind": s.kind, "drafted": s.drafted, "accepted": s.accepted, "committed": s.committed})))
    transfers = {int(t.id): t for t in f["transfers"].itertuples(index=False)}
    for t in transfers.values():
        events.append(_slice(f"copy L{t.layer} E{t.expert}", "copy", t.start, t.end, "copy", _clean(
            {"step": t.step, "layer": t.layer, "expert": t.expert, "bytes": t.bytes, "reason": t.reason,
             "slot": t.slot, "copy_id": t.id})))
    expert_bytes = result.metrics.get("slot_bytes")
    for i, c in enumerate(f["compute"].itertuples(index=False)):
        copy_id = None if c.copy_id is None or (isinstance(c.copy_id, float) and math.isnan(c.copy_id)) \
            else int(c.copy_id)
        track = "host" if c.lane == "host" else "compute"
        if c.layer == -1:
            name, kind = "head", "head"
        elif c.expert == -1:
            name, kind = f"L{c.layer} dense", "dense"
        else:
            name, kind = f"L{c.layer} E{c.expert}", "expert"
        args = {"step": c.step, "phase": c.phase, "layer": c.layer, "stall_ms": c.stall}
        # the copy this compute waited for: one made in the same step (an older copy_id is a cache hit)
        copy = transfers.get(copy_id) if copy_id is not None else None
        fresh = copy if copy is not None and copy.step == c.step else None
        if kind == "expert":
            draft = c.phase == "draft"  # the draft computes its own resident low-bit copy: no cache involved
            status = "host" if track == "host" else "draft" if draft else ("hit" if fresh is None else
                                                                            ("miss" if fresh.reason == "demand"
                                                                             else fresh.reason))
            args.update(expert=c.expert, status=status, copy_id=copy_id,
                        bytes=int(copy.bytes) if copy is not None else (None if draft else expert_bytes))
        events.append(_slice(name, track, c.start, c.end, kind, _clean(args)))
        if fresh is not None:  # flow arrow: the copy that brought the weights -> the compute that waited on it
            flow = {"name": "weights", "cat": "copy->compute", "pid": PID, "id": i}
            events.append({**flow, "ph": "s", "tid": TRACKS["copy"], "ts": _us(fresh.start)})
            events.append({**flow, "ph": "f", "bp": "e", "tid": TRACKS[track], "ts": _us(c.start)})
    if has_disk:
        events += _disk_events(disk, f["transfers"], f["compute"])
    meta = {k: result.metrics.get(k) for k in ("clock", "tpot_ms", "hit_rate", "cost_shape", "execution",
                                                "disk_reads")}
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": _clean({"strategy": result.strategy, **meta, "new_tokens": len(result.token_ids)})}


def _disk_events(disk, transfers, compute) -> list[dict]:
    """The disk lane's slices, and a flow arrow from each read to the first copy (or host compute) of that
    expert that started at or after the read's end in the same step."""
    events = []
    later = {}
    for t in transfers.itertuples(index=False):
        later.setdefault((t.step, t.layer, t.expert), []).append((t.start, "copy"))
    for c in compute[compute.lane == "host"].itertuples(index=False) if "lane" in compute else []:
        later.setdefault((c.step, c.layer, c.expert), []).append((c.start, "host"))
    for d in disk.itertuples(index=False):
        events.append(_slice(f"read L{d.layer} E{d.expert}", "disk", d.start, d.end, "disk", _clean(
            {"step": d.step, "layer": d.layer, "expert": d.expert, "bytes": d.bytes, "file_bytes": d.file_bytes,
             "reason": d.reason, "host_slot": d.slot, "read_id": d.id})))
        nxt = min((s for s in later.get((d.step, d.layer, d.expert), []) if s[0] >= d.end - 1e-9), default=None)
        if nxt is not None:
            flow = {"name": "from disk", "cat": "disk->" + nxt[1], "pid": PID, "id": 1_000_000 + int(d.id)}
            events.append({**flow, "ph": "s", "tid": TRACKS["disk"], "ts": _us(d.start)})
            events.append({**flow, "ph": "f", "bp": "e", "tid": TRACKS[nxt[1]], "ts": _us(nxt[0])})
    return events


def write_perfetto(result, path: str) -> str:
    """Write :func:`trace_events` of ``result`` to ``path`` (JSON, whole or not at all); returns the path."""
    doc = trace_events(result)
    write_atomic(path, json.dumps(doc, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    return path
