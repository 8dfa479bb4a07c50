"""What a run's metrics need, counted as the run records: the same at every trace level.

A sweep (compare, plan, the regime map, bench on a trace) reads a run's metrics, never its per-op frames, so it
runs with ``trace="steps"`` and pays for no per-op record; the metrics must not change with the level. The
:class:`Tally` is kept by :class:`~specter_lab.records.trace.Trace` beside its records: cache events and link bytes as
counters, op durations as sums, and the forecast's recall as set sizes closed step by step.
:mod:`specter_lab.records.metrics` reads it, plus the step and token records (kept at every level).

Durations: on a clock whose handles are numbers (the simulated clock: ``readable_midrun``) each duration is
added as the op is recorded; on a real clock the handle pairs are kept and resolved once the run is over
(``trace="full"`` only: a speed run's untimed events carry no time, and its sums are NaN).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ..units import Handle

__all__ = ["Tally", "Durations"]

_TIMED_PHASES = frozenset(("draft", "recompute", "snapshot"))



@dataclass
class Durations:
    """Σ (end − start) of one kind of op, in seconds on a numeric clock, else pairs resolved at :meth:`ms`."""

    numeric: bool
    timed: bool = True
    seconds: float = 0.0
    pairs: list = field(default_factory=list)

    def add(self, start: Handle, end: Handle) -> None:
        if self.numeric:
            self.seconds += end - start
        elif self.timed:
            self.pairs.append((start, end))

    def ms(self, to_ms: Callable[[Handle], float]) -> float:
        """The total in milliseconds (``to_ms`` resolves a handle; NaN where the ops carried no time)."""
        if self.numeric:
            return 1e3 * self.seconds
        if not self.timed:
            return float("nan")
        return sum(to_ms(b) - to_ms(a) for a, b in self.pairs)


@dataclass
class Tally:
    """Counters and sums of one run. Decode-phase quantities skip step 0 (the prefill), as TPOT does.

    * ``events[(event, decode)]`` – cache events (hit, miss, host, prefetch, prefetch_used, …);
    * ``link[reason]`` – bytes copied in decode steps, by reason (demand, prefetch, refresh, writeback, …);
    * ``disk[(what, decode)]`` – the disk tier's reads: ``reads``, ``bytes`` (priced like the copies) and
      ``file_bytes`` (what was really read from the files), in the prefill and in decode steps;
    * ``time[kind]`` – decode-step durations: ``stall`` (waits on copies), ``draft`` (draft spans), ``host``
      (the host lane), ``recompute``, ``snapshot``;
    * ``stalls`` – every non-zero stall in seconds, in order (numeric clocks): a decode loop sums a window's
      slice mid-run (the K governor);
    * ``forecast`` – (|U|, |P|, |P ∩ U|) summed over steps that had a forecast: U the distinct (layer, expert)
      the target used, P those the forecast named (recall and precision are their ratios).
    """

    numeric: bool = True
    timed: bool = True
    events: Counter = field(default_factory=Counter)
    link: Counter = field(default_factory=Counter)
    disk: Counter = field(default_factory=Counter)
    time: dict[str, Durations] = field(default_factory=dict)
    stalls: list[float] = field(default_factory=list)
    forecast: list[int] = field(default_factory=lambda: [0, 0, 0])
    ms: dict[str, float] = field(default_factory=dict)  # time's totals in ms, once finalized
    _step: int = 0
    _decode: bool = False  # _step >= 1 (the prompt's forward is step 0): read by every event
    _routed: list = field(default_factory=list)  # (layer, ids) of the target's routing in this step
    _named: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.time = {k: Durations(self.numeric, self.timed) for k in ("stall", "draft", "host", "recompute",
                                                                       "snapshot", "disk")}

    # ------------------------------------------------------------- recording
    def step(self, step: int) -> None:
        """A new step begins: close the forecast sets of the last one."""
        self.close_step()
        self._step = step
        self._decode = step >= 1

    def cache(self, event: str, n: int = 1) -> None:
        self.events[event, self._decode] += n

    def transfer(self, nbytes: int, reason: str) -> None:
        if self._decode:
            self.link[reason] += nbytes

    def disk_read(self, nbytes: int, file_bytes: int, start: Handle, end: Handle) -> None:
        decode = self._decode
        self.disk["reads", decode] += 1
        self.disk["bytes", decode] += nbytes
        self.disk["file_bytes", decode] += file_bytes
        if decode:
            self.time["disk"].add(start, end)

    def span(self, phase: str, lane: str, start: Handle, end: Handle, ready: Handle | None) -> None:
        # runs for every op: a zero stall (most ops) adds nothing to a sum of numbers, so it is skipped there
        if ready is not None:
            if not self.numeric:
                if self._decode:
                    self.time["stall"].add(ready, start)
            elif start != ready:
                self.stalls.append(start - ready)
                if self._decode:
                    self.time["stall"].add(ready, start)
        if not self._decode:
            return
        if lane == "host":
            self.time["host"].add(start, end)
        if phase in _TIMED_PHASES:
            self.time[phase].add(start, end)

    def spans(self, phase: str, lane: str, spans) -> None:
        """:meth:`span` of each of a layer's ops (:class:`~specter_lab.offload.clock.Span`), in order: the same sums
        in the same order, one call (this runs for every layer of a replay)."""
        if not self.numeric:
            for sp in spans:
                self.span(phase, lane, sp.start, sp.end, sp.stall_from)
            return
        decode = self._decode
        stall = self.time["stall"]
        host = self.time["host"] if decode and lane == "host" else None
        timed = self.time[phase] if decode and phase in _TIMED_PHASES else None
        for sp in spans:  # Durations.add inlined (numeric: seconds += end - start)
            ready, start = sp.stall_from, sp.start
            if ready is not None and start != ready:
                self.stalls.append(start - ready)
                if decode:
                    stall.seconds += start - ready
            if host is not None:
                host.seconds += sp.end - start
            if timed is not None:
                timed.seconds += sp.end - start

    def routed(self, layer: int, ids) -> None:
        """The target's top-k ids of one layer (an int array of any shape, not changed afterwards; -1: not
        recorded). Kept as given: the step's set of used (layer, expert) is made when it closes, and only if a
        forecast named anything (the recall)."""
        self._routed.append((layer, ids))

    def named(self, layer: int, expert: int) -> None:
        self._named.add((layer, expert))

    def close_step(self) -> None:
        if self._named:
            used = {(layer, e) for layer, ids in self._routed for e in ids.ravel().tolist() if e >= 0}
            f = self.forecast
            f[0] += len(used)
            f[1] += len(self._named)
            f[2] += len(used & self._named)
        self._routed, self._named = [], set()

    def finalize(self, to_ms: Callable[[Handle], float]) -> None:
        """The run is over: close the last step and resolve every duration to milliseconds (``ms``)."""
        self.close_step()
        self.ms = {kind: d.ms(to_ms) for kind, d in self.time.items()}

    # ------------------------------------------------------------- reading
    def count(self, event: str, decode_only: bool = False) -> int:
        return self.events[event, True] + (0 if decode_only else self.events[event, False])

    def recall_precision(self) -> tuple[float, float]:
        used, named, both = self.forecast
        return (both / used if used else float("nan"), both / named if named else float("nan"))
