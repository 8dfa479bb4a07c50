"""Run an engine over prompts and average its metrics: the one helper behind compare, the planner, ablations,
the K sweep, the regime map and the QuantTuner.

A strategy whose draft does not fit the budget is a row that says so (:class:`DoesNotFit`, with the minimum
budget), not an exception that ends a table; any other error is a bug and propagates.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from .engine import Engine
from .errors import BudgetTooSmall

__all__ = ["PromptRuns", "DoesNotFit", "run_prompts", "try_engine"]


@dataclass
class PromptRuns:
    """The metrics of one engine's generations, one dict per prompt (``metrics[i]`` for ``prompts[i]``)."""

    metrics: list[dict[str, Any]] = field(default_factory=list)

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
