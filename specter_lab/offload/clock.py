"""Two streams, compute and copy, and the time they keep: the :class:`Clock` protocol and its two clocks.

The runtime never asks which clock it has. It asks a clock to run a copy or a compute op *after* some earlier
ops (their handles) and gets handles back; the trace turns handles into milliseconds at the end. Everything the
runtime, the store, the prefetcher and the decode loops ask of time is a method of :class:`Clock`; where the
clocks differ (can a time be read mid-run? is a copy done?) the clock answers, nobody branches on its kind.
:func:`make_clock` builds one from the ``hardware=`` argument.

* :class:`SimClock` – handles are virtual seconds (floats) advanced by the :class:`CostModel`; the work itself
  (real tensor copies and matmuls on the CPU) still runs, so a cache bug changes the output.
* :class:`CudaClock` – handles are CUDA events on a real compute stream and a real copy stream; copies are
  pinned and non-blocking, and compute waits on the copy's event (``wait_event``), never on the host.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol, runtime_checkable

import torch

from ..pricing.profiles import DEFAULT_PROFILE, PROFILES, HardwareProfile, get_profile
from ..units import Handle

__all__ = ["Clock", "Handle", "Span", "Done", "SimClock", "CudaClock", "ClockFactory", "make_clock", "stamper"]



@dataclass(slots=True)
class Span:
    start: Handle
    end: Handle
    stall_from: Handle | None = None  # compute only: when it became ready to run before waiting on copies


class Done:
    """A host job that already ran (the simulated clock runs host work at once, like its copies)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


@runtime_checkable
class Clock(Protocol):
    """What the runtime, the store, the prefetcher and the decode loops ask of time.

    Lanes: ``compute`` (the device's stream), ``copy`` (host→device link), ``host`` (the host CPU), ``disk`` (the
    checkpoint's files → host RAM, only with a host expert cache: :mod:`specter_lab.offload.hostcache`). An op runs
    *after* the handles it is given and returns a :class:`Span` of handles; :meth:`to_ms` resolves a handle once
    the run is over (:meth:`synchronize` first). A third clock (a replay clock, a CPU wall clock) implements
    these methods and one branch in :func:`make_clock`; nothing else changes."""

    label: str
    measured: bool  # True: time is measured on real hardware; False: priced by a profile
    readable_midrun: bool  # handles can be compared / subtracted while the run goes on (no device sync)
    stamps_free: bool  # now() costs nothing (the simulated clock): stamp every op even on a light trace

    def now(self) -> Handle: ...

    def copy(self, duration: float, fn: Callable[[], None], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span: ...

    def compute(self, duration: float, fn: Callable[[], Any] | None = None,
                after: Iterable[Handle] = ()) -> tuple[Span, Any]: ...

    def computes(self, durations: list[float], after: list[Handle | None]) -> list[Span]:
        """Compute ops with no work to run (a replay's experts), each after its one handle, in order: the spans
        :meth:`compute` would give one call at a time."""

    def disk(self, duration: float, fn: Callable[[], Any], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span:
        """A read from the checkpoint's files into host memory (the disk tier), on its own lane: it starts when
        the disk is free, it was issued and ``after`` ended (the host buffer it fills is no longer read)."""

    def host(self, duration: float, fn: Callable[[], Any], after: Iterable[Handle] = ()) -> tuple[Span, Any]: ...

    def join_host(self, span: Span, job) -> tuple[Span, Any]: ...

    def model_span(self, duration: float) -> Span:
        """The model's own work since the last MoE layer (attention, norms, router, head): priced or measured."""

    def mark_model_work(self) -> None:
        """The model's own work starts now (after an MoE layer, at a forward's start)."""

    def is_ready(self, handle: Handle | None, now: Handle) -> bool:
        """Has the op behind ``handle`` finished by ``now``? (No sync: a comparison or an event query.)"""

    def latest(self, handles: list[Handle]) -> Handle | None:
        """The handle of whichever op ends last."""

    def copy_free_at(self) -> Handle | None:
        """When the copy lane is free, where that can be read mid-run; None on a real clock."""

    def copy_idle(self, now: Handle) -> bool:
        """Has every copy issued so far ended by ``now``? (No sync: a comparison or an event query.)"""

    def step_seconds(self, start: Handle, end: Handle, wall_s: float) -> float:
        """A draft step's or a draft window's length, usable mid-run: the clock's own where readable, else the
        host's wall time."""

    def excluded(self, trace) -> "Iterator[None]":
        """Work done inside this block is cut out of ``trace``'s timeline (the oracle's off-clock look)."""

    def elapsed(self, a: Handle, b: Handle) -> float: ...

    def to_ms(self, h: Handle) -> float: ...

    def synchronize(self) -> None: ...


def stamper(clock: Clock, traced: bool) -> Callable[[], Handle]:
    """``clock.now`` where a time is needed: always where stamps are free (the simulated clock, where they also
    price issue times), on CUDA only when the trace records per-op events (each stamp is an event record)."""
    return clock.now if traced or clock.stamps_free else (lambda: None)


class SimClock:
    """Virtual time. A copy starts when the copy stream is free, it was issued, and whatever it waits on ended.
    A compute op starts when the compute stream is free and its inputs are ready; the wait is the stall."""

    kind = "simulated"
    measured = False
    readable_midrun = True
    stamps_free = True

    def __init__(self, profile, single_stream: bool = False) -> None:
        self.profile = profile
        # single_stream: copies go on the compute stream (Mixtral-Offloading): a copy waits for the compute
        # issued before it, and compute issued after it waits for the copy (no overlap at all)
        self.single_stream = single_stream
        self.compute_t = 0.0
        self.copy_t = 0.0
        self.host_t = 0.0  # the host CPU's own timeline: experts computed there (host execution)
        self.disk_t = 0.0  # the disk's timeline: experts read from the checkpoint files (the disk tier)

    @property
    def label(self) -> str:
        return self.profile.clock_label

    def now(self) -> Handle:
        return self.compute_t

    def model_span(self, duration: float) -> Span:
        span, _ = self.compute(duration)
        return span

    def mark_model_work(self) -> None:
        pass  # priced, not measured: model_span's duration is the work

    def is_ready(self, handle: Handle | None, now: Handle) -> bool:
        return handle is None or handle <= now

    def latest(self, handles: list[Handle]) -> Handle | None:
        return max(handles) if handles else None

    def copy_free_at(self) -> Handle | None:
        return self.copy_t

    def copy_idle(self, now: Handle) -> bool:
        return self.copy_t <= now

    def step_seconds(self, start: Handle, end: Handle, wall_s: float) -> float:
        return end - start

    @contextmanager
    def excluded(self, trace) -> Iterator[None]:
        yield  # an off-clock forward puts nothing on the simulated clock: nothing to cut

    def copy(self, duration: float, fn: Callable[[], None], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span:
        fn()
        start = self.compute_t if issue_at is None else issue_at
        if self.copy_t > start:
            start = self.copy_t
        for a in after:
            if a is not None and a > start:
                start = a
        if self.single_stream:
            start = max(start, self.compute_t)
        self.copy_t = start + duration
        if self.single_stream:
            self.compute_t = self.copy_t
        return Span(start, self.copy_t)

    def disk(self, duration: float, fn: Callable[[], Any], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span:
        """A disk read (one reader, in order, like the copy lane): it runs at once (the bytes are really read)
        and is priced from when it is issued, the disk is free and ``after`` ended."""
        fn()
        start = max([self.compute_t if issue_at is None else issue_at, self.disk_t,
                     *[a for a in after if a is not None]])
        self.disk_t = start + duration
        return Span(start, self.disk_t)

    def compute(self, duration: float, fn: Callable[[], Any] | None = None, after: Iterable[Handle] = ()) -> tuple[Span, Any]:
        ready = start = self.compute_t
        for a in after:  # a loop, not max([...]): this runs for every op of a replay
            if a is not None and a > start:
                start = a
        out = fn() if fn is not None else None
        self.compute_t = start + duration
        return Span(start, self.compute_t, ready), out

    def computes(self, durations: list[float], after: list[Handle | None]) -> list[Span]:
        spans, t = [], self.compute_t  # compute() inlined: a replay prices every expert of every layer here
        for duration, a in zip(durations, after):
            start = a if a is not None and a > t else t
            end = start + duration
            spans.append(Span(start, end, t))
            t = end
        self.compute_t = t
        return spans

    def host(self, duration: float, fn: Callable[[], Any], after: Iterable[Handle] = ()) -> tuple[Span, "Done"]:
        """Work on the host CPU (a third resource): it starts when the host is free and its inputs are there
        (issued now, from the compute stream's point of view), and runs beside device compute and copies. The
        result is collected with :meth:`join_host`."""
        start = max([self.host_t, self.compute_t, *[a for a in after if a is not None]])
        self.host_t = start + duration
        return Span(start, self.host_t, start), Done(fn())

    def join_host(self, span: Span, job: "Done") -> tuple[Span, Any]:
        """The device waits for a host result (the wait is a stall when the host is the slower side)."""
        wait, _ = self.compute(0.0, after=[span.end])
        return wait, job.result()

    def elapsed(self, a: Handle, b: Handle) -> float:
        """Seconds from handle a to handle b."""
        return b - a

    def to_ms(self, h: Handle) -> float:
        return 1e3 * h

    def synchronize(self) -> None:
        pass


class CudaClock:
    """Real CUDA time: the model runs on the current stream; copies go on a second stream.

    ``timing=True`` (``trace="full"``) makes every compute and copy span a pair of timing events, plus a ready
    event for the stall. ``timing=False`` (``trace="steps"``, a speed run) records one event per op, without
    timing (``cudaEventDisableTiming``: no timestamp written), only as the dependency the next op waits on;
    :meth:`now` stays a timing event, since step boundaries are what TPOT is computed from."""

    kind = "cuda"
    measured = True
    readable_midrun = False  # reading an event's time needs a sync
    stamps_free = False  # each stamp records an event on the stream

    def __init__(self, device: torch.device | None = None, timing: bool = True, single_stream: bool = False) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaClock needs CUDA; use a simulated hardware profile on this machine.")
        self.device = device or torch.device("cuda")
        self.timing = timing
        # single_stream: copies on the compute stream itself (Mixtral-Offloading), so nothing overlaps
        self.copy_stream = (torch.cuda.current_stream(self.device) if single_stream
                            else torch.cuda.Stream(device=self.device))
        self._pool = None  # one host worker thread, started on first host job (matmuls release the GIL)
        self.base = self._event()
        self.label = f"cuda:{torch.cuda.get_device_name(self.device)}"
        self._mark = None  # full trace: the event where the model's own work since the last MoE layer began
        self._disk_stream = None  # the disk tier's events (made on first use)
        self._last_copy = None  # the last copy's end event (copy_idle)

    def _event(self, stream=None, timing: bool = True):
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(stream or torch.cuda.current_stream(self.device))
        return ev

    def now(self) -> Handle:
        return self._event()

    def mark_model_work(self) -> None:
        self._mark = self._event() if self.timing else None

    def model_span(self, duration: float) -> Span:
        # HF has already issued the model's own kernels when the runtime hears of them (a span made now would
        # have no width): measure between the mark and now instead
        if self._mark is None:
            span, _ = self.compute(duration)
            return span
        end = self.now()
        span, self._mark = Span(self._mark, end, self._mark), end
        return span

    def is_ready(self, handle: Handle | None, now: Handle) -> bool:
        return handle is None or bool(handle.query())  # cudaEventQuery: no sync

    def latest(self, handles: list[Handle]) -> Handle | None:
        return handles[-1] if handles else None  # issued in order on one stream: the last one ends last

    def copy_free_at(self) -> Handle | None:
        return None

    def copy_idle(self, now: Handle) -> bool:
        return self._last_copy is None or bool(self._last_copy.query())  # one stream: the last copy ends last

    def step_seconds(self, start: Handle, end: Handle, wall_s: float) -> float:
        return wall_s  # eager decoding is host-bound: the host's time is the step's

    @contextmanager
    def excluded(self, trace) -> Iterator[None]:
        t0 = self.now()
        yield
        trace.exclude(t0, self.now())

    def copy(self, duration: float, fn: Callable[[], None], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span:
        with torch.cuda.stream(self.copy_stream):
            for a in after:
                if a is not None:
                    self.copy_stream.wait_event(a)
            start = self._event(self.copy_stream) if self.timing else None
            fn()
            end = self._last_copy = self._event(self.copy_stream, self.timing)
        return Span(start, end)

    def disk(self, duration: float, fn: Callable[[], Any], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span:
        """A disk read runs on this (host) thread: it first waits for ``after`` (copies still reading the pinned
        buffer it overwrites), then reads. Its span is a pair of events on an idle side stream recorded before and
        after the read, so they land on the GPU timeline at about the host's times (measured host time, placed on
        the device's clock; read it as approximate)."""
        for a in after:
            if a is not None:
                a.synchronize()
        if self._disk_stream is None:
            self._disk_stream = torch.cuda.Stream(device=self.device)
        start = self._event(self._disk_stream)
        fn()
        return Span(start, self._event(self._disk_stream))

    def compute(self, duration: float, fn: Callable[[], Any] | None = None, after: Iterable[Handle] = ()) -> tuple[Span, Any]:
        stream = torch.cuda.current_stream(self.device)
        ready = self._event(stream) if self.timing else None
        for a in after:
            if a is not None:
                stream.wait_event(a)
        start = self._event(stream) if self.timing else None
        out = fn() if fn is not None else None
        return Span(start, self._event(stream, self.timing), ready), out

    def computes(self, durations: list[float], after: list[Handle | None]) -> list[Span]:
        return [self.compute(d, None, (a,))[0] for d, a in zip(durations, after)]

    def host(self, duration: float, fn: Callable[[], Any], after: Iterable[Handle] = ()) -> tuple[Span, Any]:
        """Run ``fn`` (host tensors in, host tensors out) on a worker thread, so the host computes while this
        thread goes on issuing device work. ``after`` must already be complete (host inputs); the span's end is
        stamped when :meth:`join_host` collects the result."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specter-host")
        start = self._event() if self.timing else None
        return Span(start, None, start), self._pool.submit(fn)

    def join_host(self, span: Span, job) -> tuple[Span, Any]:
        """Block this thread until the host job is done (the device may still be busy with earlier work: no
        device sync), then stamp the span's end."""
        out = job.result()
        span.end = self._event(timing=self.timing) if self.timing else None
        return Span(span.end, span.end, span.end), out

    def elapsed(self, a: Handle, b: Handle) -> float:
        return a.elapsed_time(b) / 1e3

    def to_ms(self, h: Handle) -> float:
        return self.base.elapsed_time(h)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


@dataclass(frozen=True)
class ClockFactory:
    """What ``hardware=`` resolved to: the profile that prices (on a real clock it only feeds the planner's
    estimates) and how to make each run's clock."""

    profile: HardwareProfile
    measured: bool

    def make(self, device: torch.device | None = None, trace_level: str = "full",
             single_stream: bool = False) -> Clock:
        """A fresh clock for one run (``single_stream``: copies on the compute stream, no overlap)."""
        if self.measured:
            return CudaClock(device, timing=trace_level == "full", single_stream=single_stream)
        return SimClock(self.profile, single_stream=single_stream)


MEASURED = "cuda"  # the one ``hardware=`` value that measures instead of pricing


def is_measured(hardware: "str | HardwareProfile | None") -> bool:
    """Does ``hardware=`` ask for a real clock (CUDA events) rather than a simulated profile? Answered without
    needing the GPU, so a caller can refuse or adapt before :func:`make_clock` would."""
    return isinstance(hardware, str) and hardware == MEASURED


def make_clock(hardware: "str | HardwareProfile | None") -> ClockFactory:
    """Resolve ``hardware=``: ``"cuda"`` measures on the GPU; anything else is a profile that prices
    (:func:`~specter_lab.pricing.profiles.get_profile`). Raises on an unknown name, or ``"cuda"`` without CUDA."""
    if is_measured(hardware):
        if not torch.cuda.is_available():
            raise ValueError("hardware='cuda' needs a CUDA GPU, and torch.cuda.is_available() is False here. "
                             f"Use a simulated profile instead, one of {sorted(PROFILES)}.")
        return ClockFactory(PROFILES[DEFAULT_PROFILE], measured=True)
    return ClockFactory(get_profile(hardware), measured=False)
