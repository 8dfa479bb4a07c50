"""Run an engine over prompts and average its metrics: the one helper behind compare, the planner, ablations,
the K sweep, the regime map and the QuantTuner.

A sweep is a list of :class:`Cell` (a strategy and its engine options) evaluated on a source of prompts: live
(:class:`LiveSource`: a model generates; the sweeps use its subclass that replays where a replay is the live run,
:mod:`.calibration`) or replayed (:class:`TraceSource`: a recorded or imported routing trace, the fast path). :func:`run_cells` maps the cells over any ``concurrent.futures.Executor`` (a process pool,
Dask's or Ray's executor) with results identical to the serial run. By default (``executor="auto"``) a replayed
sweep of many cells runs on a local process pool (:func:`trace_pool`) that receives the trace once per worker;
a live sweep stays in this process (each worker would need its own copy of the model).

A strategy whose draft does not fit the budget is a row that says so (:class:`DoesNotFit`, with the minimum
budget), not an exception that ends a table; any other error is a bug and propagates.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..errors import BudgetTooSmall
from ..model.identity import model_identity
from ..offload.clock import is_measured
from ..analysis.pool import cores, install, installed, process_pool
from ..analysis.record import record
from ..analysis.replay import replay, replay_setup
from ..run.engine import Engine, auto_planner
from ..run.setup import RunSetup
from ..traces.trace_file import RoutingTrace

__all__ = ["PromptRuns", "DoesNotFit", "NotReplayable", "SKIPPED", "run_prompts", "try_engine", "Cell",
           "LiveSource", "TraceSource", "run_cells", "TracePool", "trace_pool", "sweep_executor",
           "POOL_MIN_CELLS", "workers_of"]

POOL_MIN_CELLS = 8  # fewer replayed cells than this run here: a pool's start-up would cost more than it saves


@dataclass
class PromptRuns:
    """The metrics of one engine's generations, one dict per prompt (``metrics[i]`` for ``prompts[i]``)."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = float("nan")  # wall time of all the runs (this machine's, not the simulated clock's)

    def as_record(self) -> dict[str, Any]:
        """Plain data for a results file (:mod:`.results_file`); :meth:`of_record` reads it back, equal."""
        return {"metrics": self.metrics, "seconds": self.seconds}

    @classmethod
    def of_record(cls, rec: dict[str, Any]) -> "PromptRuns":
        return cls([dict(m) for m in rec["metrics"]], rec["seconds"])

    def mean(self, key: str) -> float:
        """Mean over prompts, NaN-aware (acceptance is NaN without speculation: it stays NaN, quietly)."""
        vals = [m.get(key, np.nan) for m in self.metrics]
        vals = [np.nan if v is None else v for v in vals]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(np.nanmean(np.asarray(vals, dtype=float))) if vals else float("nan")

    def first(self, key: str) -> Any:
        """A value every prompt shares (slots per layer, draft bytes, the clock label)."""
        return self.metrics[0].get(key) if self.metrics else None

    def means(self, keys: Iterable[str]) -> dict[str, float]:
        return {k: self.mean(k) for k in keys}


@dataclass
class NotReplayable:
    """A configuration a routing trace cannot answer (a draft it did not record, K beyond its chains, …)."""

    reason: str

    @property
    def label(self) -> str:
        return f"not replayable from this trace: {self.reason}"


@dataclass
class DoesNotFit:
    """A configuration the budget cannot hold: why, and the smallest budget that would."""

    reason: str
    minimum_bytes: int
    minimum_fraction: float

    @property
    def label(self) -> str:
        return f"does not fit (needs ≥ {self.minimum_fraction:.3f} of the expert bytes)"


def try_engine(model, tokenizer, strategy, **engine_kw) -> "Engine | DoesNotFit":
    """An Engine, or :class:`DoesNotFit` when the budget cannot hold the strategy's draft plus one slot per layer."""
    try:
        return Engine(model, tokenizer, strategy, **engine_kw)
    except BudgetTooSmall as e:
        return DoesNotFit(str(e), e.minimum_bytes, e.minimum_fraction)


def run_prompts(engine: Engine, prompts: Sequence, max_new_tokens: int, bar=None, **generate_kw) -> PromptRuns:
    """``engine.generate`` on every prompt; ``bar`` (a tqdm bar) is advanced once per prompt."""
    runs = PromptRuns()
    for p in prompts:
        runs.metrics.append(engine.generate(p, max_new_tokens=max_new_tokens, **generate_kw).metrics)
        if bar is not None:
            bar.update()
    return runs


@dataclass(frozen=True)
class Cell:
    """One configuration of a sweep: a strategy and its engine options (budget, hardware, cost shape, K, …)."""

    strategy: Any
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, strategy, **options) -> "Cell":
        return cls(strategy, tuple(sorted(options.items())))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)


@dataclass
class LiveSource:
    """Prompts a model generates from (``max_new_tokens`` each): every cell is a live run."""

    model: Any
    tokenizer: Any
    prompts: Sequence
    max_new_tokens: int
    label: str = "live"

    def engine(self, cell: Cell) -> "Engine | DoesNotFit":
        # a sweep reads metrics only: no per-op records (the metrics are the same at every trace level), except
        # on the CUDA clock, where only a full trace's timed events give the stall and host sums
        level = "full" if is_measured(cell.kwargs.get("hardware")) else "steps"
        return try_engine(self.model, self.tokenizer, cell.strategy, **{"trace": level, **cell.kwargs})

    def identity(self) -> dict:
        """What every cell of a sweep on this source shares, for its results file: the model (config digest and
        weights' fingerprint), the prompts and their length."""
        prompts = json.dumps([p if isinstance(p, str) else [int(t) for t in p] for p in self.prompts])
        return {"model": model_identity(self.model), "prompts": hashlib.sha256(prompts.encode()).hexdigest()[:16],
                "n_prompts": len(self.prompts), "max_new_tokens": self.max_new_tokens}

    def setup(self, cell: Cell) -> "RunSetup | DoesNotFit":
        """The cell's run set-up (what a table says of it: clock, profile, projection), or why it does not fit."""
        eng = self.engine(cell)
        return eng if isinstance(eng, DoesNotFit) else eng.setup

    def routing(self) -> RoutingTrace:
        """The model's greedy routing over the prompts, no chains (what the bound reads): one generation each."""
        return record(self.model, self.tokenizer, self.prompts, max_new_tokens=self.max_new_tokens, k_max=0,
                      progress=False)

    def run(self, cell: Cell) -> "PromptRuns | DoesNotFit":
        eng = self.engine(cell)
        if isinstance(eng, DoesNotFit):
            return eng
        t0 = time.perf_counter()
        runs = run_prompts(eng, self.prompts, self.max_new_tokens)
        runs.seconds = time.perf_counter() - t0
        return runs


@dataclass
class TraceSource:
    """A recorded (or imported) routing trace: every cell is a replay of its sequences (greedy, simulated)."""

    trace: RoutingTrace
    tokenizer: Any = None
    _plans: dict = field(default_factory=dict, repr=False, compare=False)  # an ``auto`` cell's plan, made once

    def routing(self) -> RoutingTrace:
        """The routing the bound reads: the trace itself."""
        return self.trace

    def __getstate__(self) -> dict:  # sent to a worker: the trace and tokenizer, not the plans made here
        return {**self.__dict__, "_plans": {}}

    @property
    def label(self) -> str:
        return self.trace.source

    @property
    def prompts(self) -> list:
        return [s.prompt.tolist() for s in self.trace.sequences]

    def identity(self) -> dict:
        """What every cell of a sweep on this trace shares, for its results file: the trace's fingerprint."""
        return {"trace": self.trace.fingerprint()}

    def setup(self, cell: Cell) -> "RunSetup | DoesNotFit | NotReplayable":
        """The set-up a replay of the cell prices with (no Engine, no model), or why it cannot run."""
        strategy, kw = self._resolved(cell)
        try:
            return replay_setup(self.trace, strategy, **kw)[0]
        except BudgetTooSmall as e:
            return DoesNotFit(str(e), e.minimum_bytes, e.minimum_fraction)
        except ValueError as e:  # a draft the trace did not record, K beyond its chains, …
            return NotReplayable(str(e))

    def run(self, cell: Cell) -> "PromptRuns | DoesNotFit | NotReplayable":
        t0 = time.perf_counter()
        skipped = self.setup(cell)
        if isinstance(skipped, SKIPPED):
            return skipped
        strategy, kw = self._resolved(cell)
        results = replay(self.trace, strategy, tokenizer=self.tokenizer, trace_level="steps", **kw)
        return PromptRuns([r.metrics for r in results], time.perf_counter() - t0)

    def _resolved(self, cell: Cell) -> tuple[Any, dict[str, Any]]:
        """``auto`` plans on this trace (a live plan would run the model, which a trace source does not have)."""
        kw = cell.kwargs
        if cell.strategy != "auto":
            return cell.strategy, kw
        plan = self._plans.get(cell)
        if plan is None:  # planned here, serially: a cell is asked for its engine, then run (one plan, not two)
            plan = self._plans[cell] = auto_planner()(
                None, self.tokenizer, kw.get("hardware"), kw.get("expert_budget", 0.5), cost_shape=kw.get("cost_shape"),
                progress=False, draft=kw.get("draft"), k=kw.get("k"), trace=self.trace, executor=None)
        return plan, {k: v for k, v in kw.items() if k not in ("draft", "k")}


SKIPPED = (DoesNotFit, NotReplayable)  # a row that says why, not an exception that ends a table


def _run(source, cell: Cell):
    return source.run(cell)


def run_cells(source: "LiveSource | TraceSource", cells: Sequence[Cell], executor: "Executor | str | None" = "auto",
              progress: bool = False, desc: str = "cells",
              on_result: "Callable[[int, Any], None] | None" = None) -> list["PromptRuns | DoesNotFit"]:
    """Evaluate every cell on ``source``, in order. ``executor``: any ``concurrent.futures.Executor`` (Dask's,
    Ray's, a pool of your own); ``"auto"`` (default) a local process pool for a replayed sweep of at least
    :data:`POOL_MIN_CELLS` cells on a machine with more than one core, else here; ``None`` here, one after the
    other. The rows are identical whichever runs them: each cell is a deterministic run of its own.
    ``on_result(i, result)`` is called in this process as each cell finishes (in the order they finish), e.g. to
    write it to a results file (:mod:`.results_file`) before the sweep goes on."""
    cells = list(cells)
    done = on_result or (lambda i, r: None)
    with sweep_executor(source, len(cells), executor) as ex, \
            tqdm(total=len(cells), desc=desc, disable=not progress) as bar:
        if ex is None:  # in the source's own order where it has one (the results are each cell's, whatever it is)
            out: list = [None] * len(cells)
            for i in (source.order(cells) if hasattr(source, "order") else range(len(cells))):
                out[i] = source.run(cells[i])
                done(i, out[i])
                bar.update()
            return out
        if isinstance(ex, TracePool) and ex.serves(source):
            # the trace is already in every worker; an ``auto`` cell planned here goes with its plan
            futures = [ex.submit(_run_installed, c, source._plans.get(c)) for c in cells]
        else:
            futures = [ex.submit(_run, source, c) for c in cells]
        index = {f: i for i, f in enumerate(futures)}
        for f in as_completed(futures):
            done(index[f], f.result())
            bar.update()
        return [f.result() for f in futures]


# ----------------------------------------------------------------------------------- the local process pool
@dataclass
class TracePool:
    """A local process pool whose workers each received one routing trace when they started, so a cell sent to
    them is a few bytes (a :class:`Cell`), not the trace again."""

    pool: ProcessPoolExecutor
    trace: RoutingTrace
    tokenizer: Any = None

    def serves(self, source) -> bool:
        return isinstance(source, TraceSource) and source.trace is self.trace and source.tokenizer is self.tokenizer

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)


def _install(trace: RoutingTrace, tokenizer) -> None:
    install(TraceSource(trace, tokenizer))  # a pool worker's source: the cells it is sent replay it


def _run_installed(cell: Cell, plan=None):
    source = installed()
    if plan is not None:
        source._plans[cell] = plan
    return source.run(cell)


@contextmanager
def trace_pool(trace: RoutingTrace, tokenizer=None, workers: int | None = None,
               start_method: str | None = None) -> Iterator[TracePool]:
    """A local process pool for replayed sweeps of ``trace`` (``workers``: default one per core; the trace is sent
    once per worker). ``start_method``: multiprocessing's (default :func:`~specter_lab.analysis.pool.start_method`)."""
    with process_pool(workers, _install, (trace, tokenizer), start_method) as pool:
        yield TracePool(pool, trace, tokenizer)


def workers_of(executor) -> int | None:
    """How many processes run a sweep's cells: 1 here (None), a local pool's size, None when not known."""
    if executor is None:
        return 1
    pool = executor.pool if isinstance(executor, TracePool) else executor
    return getattr(pool, "_max_workers", None)


def sweep_executor(source, n_cells: int, executor: "Executor | str | None"):
    """The executor a sweep of ``n_cells`` on ``source`` runs on, as a context (a pool made here is shut down
    at its end). ``"auto"``: a :func:`trace_pool` for a replayed sweep of :data:`POOL_MIN_CELLS` or more cells on
    more than one core (never inside a pool worker), else None (here)."""
    if executor == "auto":
        if isinstance(source, TraceSource) and n_cells >= POOL_MIN_CELLS and cores() > 1 and installed() is None:
            return trace_pool(source.trace, source.tokenizer, min(cores(), n_cells))
        return nullcontext(None)
    if isinstance(executor, str):
        raise ValueError(f"executor={executor!r}: use 'auto', None (serial) or a concurrent.futures.Executor.")
    return nullcontext(executor)
