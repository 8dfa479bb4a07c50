"""Run an engine over prompts and average its metrics: the one helper behind compare, the planner, ablations,
the K sweep, the regime map and the QuantTuner.

A sweep is a list of :class:`Cell` (a strategy and its engine options) evaluated on a source of prompts: live
(:class:`LiveSource`: a model generates) or replayed (:class:`TraceSource`: a recorded or imported routing
trace, the fast path). :func:`run_cells` maps the cells over any ``concurrent.futures.Executor`` (a process pool,
Dask's or Ray's executor) with results identical to the serial run.

A strategy whose draft does not fit the budget is a row that says so (:class:`DoesNotFit`, with the minimum
budget), not an exception that ends a table; any other error is a bug and propagates.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

from .engine import Engine, auto_planner
from .errors import BudgetTooSmall
from .replay import refusal, replay, skeleton
from .routing_trace import RoutingTrace

__all__ = ["PromptRuns", "DoesNotFit", "NotReplayable", "SKIPPED", "run_prompts", "try_engine", "Cell",
           "LiveSource", "TraceSource", "run_cells", "as_source"]


@dataclass
class PromptRuns:
    """The metrics of one engine's generations, one dict per prompt (``metrics[i]`` for ``prompts[i]``)."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = float("nan")  # wall time of all the runs (this machine's, not the simulated clock's)

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
        # a sweep reads metrics only: no per-op records (the metrics are the same at every trace level)
        return try_engine(self.model, self.tokenizer, cell.strategy, **{"trace": "steps", **cell.kwargs})

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

    @property
    def label(self) -> str:
        return self.trace.source

    @property
    def prompts(self) -> list:
        return [s.prompt.tolist() for s in self.trace.sequences]

    def engine(self, cell: Cell) -> "Engine | DoesNotFit | NotReplayable":
        strategy, kw = self._resolved(cell)
        try:
            eng = try_engine(skeleton(self.trace.config), self.tokenizer, strategy, **kw)
        except ValueError as e:  # e.g. a draft variant that computes with the cache: the trace cannot hold it
            return NotReplayable(str(e))
        why = None if isinstance(eng, DoesNotFit) else refusal(eng, self.trace)
        return NotReplayable(why) if why else eng

    def run(self, cell: Cell) -> "PromptRuns | DoesNotFit | NotReplayable":
        t0 = time.perf_counter()
        skipped = self.engine(cell)
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
        plan = auto_planner()(None, self.tokenizer, kw.get("hardware"), kw.get("expert_budget", 0.5),
                              cost_shape=kw.get("cost_shape"), progress=False, draft=kw.get("draft"), k=kw.get("k"),
                              trace=self.trace)
        return plan, {k: v for k, v in kw.items() if k not in ("draft", "k")}


def as_source(model, tokenizer, prompts, max_new_tokens: int, trace: RoutingTrace | None) -> "LiveSource | TraceSource":
    """The source a sweep evaluates on: the trace when given (then ``prompts`` must be None: they are its own),
    else the model's live runs."""
    if trace is None:
        if model is None:
            raise ValueError("model is None and no trace= was given: pass a model, or a recorded trace to replay.")
        return LiveSource(model, tokenizer, list(prompts), max_new_tokens)
    if not isinstance(trace, RoutingTrace):
        raise TypeError(f"trace= must be a sl.RoutingTrace (sl.record(...) or sl.load_trace(path)), got "
                        f"{type(trace).__name__}.")
    if prompts is not None:
        raise ValueError("prompts= and trace= both given: a trace replays its own recorded prompts; drop prompts=.")
    return TraceSource(trace, tokenizer)


SKIPPED = (DoesNotFit, NotReplayable)  # a row that says why, not an exception that ends a table


def _run(source, cell: Cell):
    return source.run(cell)


def run_cells(source: "LiveSource | TraceSource", cells: Sequence[Cell], executor: Executor | None = None,
              progress: bool = False, desc: str = "cells") -> list["PromptRuns | DoesNotFit"]:
    """Evaluate every cell on ``source``, in order; on ``executor`` when given (results identical to the serial
    run: each cell is a deterministic run of its own), else here, one after the other."""
    cells = list(cells)
    with tqdm(total=len(cells), desc=desc, disable=not progress) as bar:
        if executor is None:
            out = []
            for c in cells:
                out.append(source.run(c))
                bar.update()
            return out
        futures = [executor.submit(_run, source, c) for c in cells]
        out = []
        for f in futures:
            out.append(f.result())
            bar.update()
        return out
