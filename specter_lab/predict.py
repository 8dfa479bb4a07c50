"""Routing forecasts and the prefetch planner.

* :class:`WindowForecast` – per-layer counts of the draft's top-k over the tokens drafted so far in a window
  (the paper's counters), with the first draft step that routed to each expert (for furthest-next-use eviction).
* :class:`LookaheadPlanner` – the paper's multi-step lookahead: at chunk boundaries prefetch the top-M experts
  per layer (M = that layer's slots), layer by layer, protecting the predicted ones from each other. The first
  boundary comes after ⌊0.2·K⌋ draft steps; the next after ⌈bytes issued / (bandwidth · draft-step time)⌉ more
  steps, both running averages: just enough drafting to hide the copies just issued.
* :class:`KGovernor` – ``k="auto"``: decides after every draft step whether one more draft token pays.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

__all__ = ["WindowForecast", "LookaheadPlanner", "KGovernor"]


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


@dataclass
class LookaheadPlanner:
    """The paper's prefetch planner over one store. ``chunking`` is ``"adaptive"`` or draft fractions."""

    store: object
    cost: object
    chunking: str | tuple[float, ...] = "adaptive"
    first_fraction: float = 0.2
    protect: bool = True
    step_time_avg: float | None = None  # running average of one draft step (s)
    bandwidth_avg: float | None = None  # running average of effective copy bandwidth (bytes/s)
    next_boundary: int = 0
    _fraction_steps: list[int] = field(default_factory=list)
    bytes_issued: int = 0

    def begin_window(self, k: int) -> None:
        self.bytes_issued = 0
        if self.chunking == "adaptive":
            self.next_boundary = max(1, math.floor(self.first_fraction * k))
            self._fraction_steps = []
        else:
            self._fraction_steps = sorted({max(1, math.floor(f * k)) for f in self.chunking})
            self.next_boundary = self._fraction_steps.pop(0)

    def observe_step(self, seconds: float) -> None:
        a = 0.2
        self.step_time_avg = seconds if self.step_time_avg is None else (1 - a) * self.step_time_avg + a * seconds

    def due(self, steps_done: int) -> bool:
        return self.next_boundary > 0 and steps_done >= self.next_boundary

    def boundary(self, steps_done: int, forecast: WindowForecast, issue_at=None, trace_step: int = 0) -> int:
        """Prefetch top-M per layer, layer by layer. Returns bytes issued and schedules the next boundary."""
        issued = 0
        for layer in range(len(forecast.counts)):
            m = self.store.slots[layer].size
            top = forecast.top(layer, m)
            protect = set(top) if self.protect else set()
            for e in top:
                if self.store.prefetch(layer, e, protected=protect, issue_at=issue_at):
                    issued += self.cost.expert_bytes
        self.bytes_issued += issued
        copy_bw = self.cost.expert_bytes / self.cost.copy_time(self.cost.expert_bytes)
        self.bandwidth_avg = copy_bw if self.bandwidth_avg is None else 0.8 * self.bandwidth_avg + 0.2 * copy_bw
        if self.chunking == "adaptive":
            step = self.step_time_avg or 1e-4
            hide = math.ceil(issued / (self.bandwidth_avg * step)) if issued else 1
            self.next_boundary = steps_done + max(1, hide)
        else:
            self.next_boundary = self._fraction_steps.pop(0) if self._fraction_steps else 0
        return issued


@dataclass
class KGovernor:
    """``k="auto"``: keep drafting while one more token is expected to lower the time per committed token.

    Model of a window with j drafted tokens (acceptance α per token, estimated online as an EMA):

        E[tokens](j) = (1 − α^(j+1)) / (1 − α)                      committed tokens (accepted + bonus/correction)
        T(j)         = t0 + j · t_draft + t_verify + c · U(j)       window time
        U(j)         = experts the forecast says verification needs that are not resident (union grows with j)

    where ``t_draft`` is the running draft-step time, ``c`` the time to copy one expert that drafting did not
    hide, ``t_verify`` the verification pass without misses. Draft one more token iff
    T(j+1)/E(j+1) < T(j)/E(j), with U(j+1) extrapolated from the union's last growth. Bounded by ``k_max``.
    """

    k_max: int = 16
    k_min: int = 1
    alpha: float = 0.7
    ema: float = 0.1

    def update_acceptance(self, accepted: int, drafted: int) -> None:
        if drafted:
            # Per-token acceptance from a window: accepted of drafted, with the first rejection ending the chain.
            rate = accepted / drafted
            self.alpha = (1 - self.ema) * self.alpha + self.ema * rate

    def expected_tokens(self, j: int) -> float:
        a = min(self.alpha, 0.999)
        return (1 - a ** (j + 1)) / (1 - a)

    def keep_drafting(self, j: int, t_draft: float, t_verify: float, t_copy: float, uncovered_now: int,
                      uncovered_growth: float) -> bool:
        if j < self.k_min:
            return True
        if j >= self.k_max:
            return False
        t_now = j * t_draft + t_verify + t_copy * uncovered_now
        t_next = (j + 1) * t_draft + t_verify + t_copy * (uncovered_now + uncovered_growth)
        return t_next / self.expected_tokens(j + 1) < t_now / self.expected_tokens(j)
