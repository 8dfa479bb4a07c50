"""Routing forecasts (:mod:`.forecast`), the lookahead prefetcher (:mod:`.prefetch`) and the K governor
(:mod:`.governor`)."""

from .forecast import WindowForecast
from .governor import KGovernor, WindowOutcome, distinct_experts_curve
from .prefetch import LookaheadPrefetcher

__all__ = ["WindowForecast", "LookaheadPrefetcher", "KGovernor", "WindowOutcome", "distinct_experts_curve"]
