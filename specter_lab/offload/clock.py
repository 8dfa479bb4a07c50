"""Two streams, compute and copy, and the time they keep.

The runtime never asks which clock it has. It asks a clock to run a copy or a compute op *after* some earlier
ops (their handles) and gets handles back; the trace turns handles into milliseconds at the end.

* :class:`SimClock` – handles are virtual seconds (floats) advanced by the :class:`CostModel`; the work itself
  (real tensor copies and matmuls on the CPU) still runs, so a cache bug changes the output.
* :class:`CudaClock` – handles are CUDA events on a real compute stream and a real copy stream; copies are
  pinned and non-blocking, and compute waits on the copy's event (``wait_event``), never on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

Handle = Any  # float seconds (SimClock) or torch.cuda.Event (CudaClock)


@dataclass
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


def stamper(clock, traced: bool) -> Callable[[], Handle]:
    """``clock.now`` where a time is needed: always on the simulated clock (free, and it prices issue times),
    on CUDA only when the trace records per-op events (each stamp is an event record on the stream)."""
    return clock.now if traced or clock.kind == "simulated" else (lambda: None)


class SimClock:
    """Virtual time. A copy starts when the copy stream is free, it was issued, and whatever it waits on ended.
    A compute op starts when the compute stream is free and its inputs are ready; the wait is the stall."""

    kind = "simulated"

    def __init__(self, profile, single_stream: bool = False) -> None:
        self.profile = profile
        # single_stream: copies go on the compute stream (Mixtral-Offloading): a copy waits for the compute
        # issued before it, and compute issued after it waits for the copy (no overlap at all)
        self.single_stream = single_stream
        self.compute_t = 0.0
        self.copy_t = 0.0
        self.host_t = 0.0  # the host CPU's own timeline: experts computed there (host execution)

    @property
    def label(self) -> str:
        return self.profile.clock_label

    def now(self) -> Handle:
        return self.compute_t

    def copy(self, duration: float, fn: Callable[[], None], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span:
        fn()
        start = max([self.copy_t, self.compute_t if issue_at is None else issue_at, *[a for a in after if a is not None]])
        if self.single_stream:
            start = max(start, self.compute_t)
        self.copy_t = start + duration
        if self.single_stream:
            self.compute_t = self.copy_t
        return Span(start, self.copy_t)

    def compute(self, duration: float, fn: Callable[[], Any] | None = None, after: Iterable[Handle] = ()) -> tuple[Span, Any]:
        ready = self.compute_t
        start = max([ready, *[a for a in after if a is not None]])
        out = fn() if fn is not None else None
        self.compute_t = start + duration
        return Span(start, self.compute_t, ready), out

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

    def _event(self, stream=None, timing: bool = True):
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(stream or torch.cuda.current_stream(self.device))
        return ev

    def now(self) -> Handle:
        return self._event()

    def copy(self, duration: float, fn: Callable[[], None], after: Iterable[Handle] = (),
             issue_at: Handle | None = None) -> Span:
        with torch.cuda.stream(self.copy_stream):
            for a in after:
                if a is not None:
                    self.copy_stream.wait_event(a)
            start = self._event(self.copy_stream) if self.timing else None
            fn()
            end = self._event(self.copy_stream, self.timing)
        return Span(start, end)

    def compute(self, duration: float, fn: Callable[[], Any] | None = None, after: Iterable[Handle] = ()) -> tuple[Span, Any]:
        stream = torch.cuda.current_stream(self.device)
        ready = self._event(stream) if self.timing else None
        for a in after:
            if a is not None:
                stream.wait_event(a)
        start = self._event(stream) if self.timing else None
        out = fn() if fn is not None else None
        return Span(start, self._event(stream, self.timing), ready), out

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
