"""Host execution of missed experts: compute an expert that is not on the device on the host CPU, from the host
copy that is already there, instead of copying it over the link (Fiddler, llama.cpp ``--n-cpu-moe``,
ktransformers).

At batch 1 a host expert reads its weights from DRAM once (17 MB for a DeepSeek-V2-Lite expert in bf16: ~0.3 ms
at 60 GB/s), where a copy moves them over PCIe (~0.7 ms) *and* then computes on the device; but a copied expert
stays, and is a hit the next time. :class:`MissPolicy` decides per miss which of the two pays, from what the copy
would save in later reuse against what it costs now.

Miss rules (a strategy's ``miss`` and ``cpu_share`` fields; :func:`specter_lab.run.assembly.assemble` picks one):

* :class:`CopyMisses` (``copy``) – every miss is copied (and kept): the GPU-only strategies;
* :class:`HostMisses` (``host``) – every miss after the prefill is computed on the host and nothing is copied on
  demand: the device cache is what the prompt left there (Fiddler's placement by popularity, measured on the
  prompt itself); speculative strategies still prefetch what the draft forecasts, and the one-offs run on the host;
* :class:`CostedMisses` (``auto``) – per miss, :class:`MissPolicy`;
* :class:`ShareMisses` (``copy`` with ``cpu_share=F``) – a share F of the misses on the host, the rest copied
  (llama.cpp's ``--moe-cache-cpu-share``).

A rule is asked only for the misses of a decode-phase forward on a layer that has device slots (the schedule
handles the prefill and static host layers itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = ["MissPolicy", "MissRule", "CopyMisses", "HostMisses", "CostedMisses", "ShareMisses"]


@dataclass
class MissPolicy:
    """Copy-or-host for one miss. A copy costs ``copy_time + expert_time(n) − host_time(n)`` more than
    computing on the host now (often negative on a fast link, when the host is slow); it saves
    ``host_time(1) − expert_time(1)`` at every later use while resident, and it evicts a victim, whose later uses
    then run on the host. Expected later uses = the expert's recent use rate (an exponential moving average of
    routings per forward, per layer) × the residency lifetime in forwards (slots / top_k, what an LRU cache of
    that size keeps an expert for when every routing is new)."""

    num_experts: list[int]
    slots: list[int]
    top_k: list[int]
    decay: float = 0.8  # weight of the past per forward: about the last 5 forwards count
    rate: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rate = [np.zeros(e) for e in self.num_experts]

    def observe(self, layer: int, routed: np.ndarray) -> None:
        """A forward's routing at ``layer`` (ids of any shape): update the per-expert use rates."""
        ids = routed.reshape(-1)
        counts = np.bincount(ids[ids >= 0], minlength=self.num_experts[layer]).astype(float)  # -1: not recorded
        tokens = max(1, routed.shape[0] if routed.ndim > 1 else 1)
        self.rate[layer] = self.decay * self.rate[layer] + (1 - self.decay) * counts / tokens

    def copy_pays(self, layer: int, expert: int, victim: int | None, now_extra: float, per_use_saving: float) -> bool:
        """True if copying ``expert`` (evicting ``victim``) saves more later than it costs now."""
        lifetime = max(1.0, self.slots[layer] / max(1, self.top_k[layer]))
        gain = self.rate[layer][expert] * lifetime * per_use_saving
        loss = (self.rate[layer][victim] * lifetime * per_use_saving) if victim is not None and victim >= 0 else 0.0
        return gain - loss > max(0.0, now_extra)


class MissRule(Protocol):
    """Which of a layer's misses run on the host (the rest are copied)."""

    def on_host(self, schedule, fwd, layer: int, missing: list[int], counts: dict[int, int]) -> list[int]: ...


class CopyMisses:
    """Copy every miss (and keep it)."""

    def on_host(self, schedule, fwd, layer, missing, counts) -> list[int]:
        return []


class HostMisses:
    """Compute every miss on the host; nothing is copied on demand."""

    def on_host(self, schedule, fwd, layer, missing, counts) -> list[int]:
        return list(missing)


@dataclass
class ShareMisses:
    """A fixed share of the misses on the host, spread evenly over the run (the i-th miss goes to the host when
    ⌊(i+1)·share⌋ > ⌊i·share⌋): llama.cpp's ``--moe-cache-cpu-share``."""

    share: float
    seen: int = 0

    def on_host(self, schedule, fwd, layer, missing, counts) -> list[int]:
        host = []
        for e in missing:
            if math.floor((self.seen + 1) * self.share) > math.floor(self.seen * self.share):
                host.append(e)
            self.seen += 1
        return host


@dataclass
class CostedMisses:
    """Per miss: copy when the expert's expected reuse pays for the copy (:class:`MissPolicy`), else the host."""

    policy: MissPolicy

    def on_host(self, schedule, fwd, layer, missing, counts) -> list[int]:
        pol, c, store = self.policy, schedule.cost, schedule.store
        pol.observe(layer, fwd.routing[layer])
        cands = [(j, e) for j, e in enumerate(store.slots[layer].expert) if e not in counts]
        victim = None if -1 in store.slots[layer].expert or not cands else store.policy.victim(layer, cands)
        victim_e = store.slots[layer].expert[victim] if victim is not None else None
        saving = schedule.host_time(1) - c.expert_time(1)
        host = []
        for e in missing:
            n = counts[e]
            extra = c.copy_time(c.expert_bytes) + c.expert_time(n) - schedule.host_time(n)
            if not pol.copy_pays(layer, e, victim_e, extra, saving):
                host.append(e)
        return host
