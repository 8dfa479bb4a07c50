"""What the draft (or the oracle) says each layer will need in a window: the paper's per-layer route counters."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

__all__ = ["WindowForecast"]


class WindowForecast:
    """What the draft (or the oracle) says each layer will need in this window."""

    def __init__(self, num_layers: int) -> None:
        self.counts = [Counter() for _ in range(num_layers)]
        self.first = [dict() for _ in range(num_layers)]
        self.steps = 0

    def add(self, routing: dict[int, np.ndarray], step: int | None = None) -> None:
        s = self.steps if step is None else step
        for layer, idx in routing.items():
            for e in idx.reshape(-1).tolist():
                if e < 0:  # -1: a slot an imported trace did not record (no lookup, nothing to forecast)
                    continue
                self.counts[layer][e] += 1
                self.first[layer].setdefault(e, s)
        self.steps += 1

    def top(self, layer: int, m: int) -> list[int]:
        """Top-m experts by count; ties go to the one the draft needed first."""
        first = self.first[layer]
        ranked = sorted(self.counts[layer].items(), key=lambda kv: (-kv[1], first[kv[0]], kv[0]))
        return [e for e, _ in ranked[:m]]

    def next_use(self, layer: int, expert: int) -> float:
        """For eviction: sooner-needed and more-often-needed experts score lower (kept longer)."""
        c = self.counts[layer].get(expert, 0)
        return math.inf if c == 0 else self.first[layer][expert] - c / 1e3

    def union_size(self) -> int:
        return sum(len(c) for c in self.counts)


