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
  (llama.cpp's ``--moe-cache-cpu-share``);
* :class:`BalancedMisses` (``balance``) – per layer, each miss to the lane that ends the layer sooner, credited
  with what a copy saves later (HybriMoE's intra-layer scheduling, DALI's per-token assignment).

Whatever the rule, the schedule issues the host's experts first, so the host computes the misses while the device
computes the resident experts (and the copied ones as they land): the per-token split runs both lanes at once.

A rule is asked only for the misses of a decode-phase forward on a layer that has device slots (the schedule
handles the prefill and static host layers itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


__all__ = ["MissPolicy", "MissRule", "CopyMisses", "HostMisses", "CostedMisses", "ShareMisses",
           "BalancedMisses", "ForecastRecall", "use_rates"]


def use_rates(rate: np.ndarray, routed: np.ndarray, decay: float) -> np.ndarray:
    """One forward's routing at a layer (ids ``[tokens, k]``, or one token's ``[k]``; -1: not recorded) folded into
    that layer's per-expert use rates: an exponential moving average of routings per token and forward."""
    ids = routed.reshape(-1)
    counts = np.bincount(ids[ids >= 0], minlength=len(rate)).astype(float)
    tokens = max(1, routed.shape[0] if routed.ndim > 1 else 1)
    return decay * rate + (1 - decay) * counts / tokens


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
        self.rate[layer] = use_rates(self.rate[layer], routed, self.decay)

    def copy_pays(self, layer: int, expert: int, victim: int | None, now_extra: float, per_use_saving: float) -> bool:
        """True if copying ``expert`` (evicting ``victim``) saves more later than it costs now."""
        return self.reuse_value(layer, expert, victim, per_use_saving) > max(0.0, now_extra)

    def reuse_value(self, layer: int, expert: int, victim: int | None, per_use_saving: float) -> float:
        """Seconds a copy of ``expert`` (evicting ``victim``) is expected to save later: its expected uses while
        resident × ``per_use_saving``, less the victim's (negative when the victim is used more)."""
        lifetime = max(1.0, self.slots[layer] / max(1, self.top_k[layer]))
        gain = self.rate[layer][expert] * lifetime * per_use_saving
        loss = (self.rate[layer][victim] * lifetime * per_use_saving) if victim is not None and victim >= 0 else 0.0
        return gain - loss


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
        pol, c = self.policy, schedule.cost
        pol.observe(layer, fwd.routing[layer])
        victim_e = _victim(schedule.store, layer, counts)
        saving = schedule.host_time(1) - c.expert_time(1)
        host = []
        for e in missing:
            n = counts[e]
            extra = c.copy_time(c.expert_bytes) + c.expert_time(n) - schedule.host_time(n)
            if not pol.copy_pays(layer, e, victim_e, extra, saving):
                host.append(e)
        return host


def _victim(store, layer: int, counts) -> int | None:
    """The expert a copy into ``layer`` would evict now, not one this layer asks for (None: a free slot, or
    nothing evictable)."""
    return store.victim(layer, counts)


@dataclass
class ForecastRecall:
    """How much of each layer's experts its pre-gate forecast named, as the run goes (decode forwards): a running
    share the runtime measures against the routing that followed, so a forecast that is mostly wrong stops moving
    bytes. A layer not seen yet is trusted (1.0)."""

    decay: float = 0.9  # weight of the past per forward: about the last ten count
    share: dict[int, float] = field(default_factory=dict)  # layer → running recall

    def observe(self, layer: int, named: set[int], asked) -> None:
        """Layer ``layer`` asked for ``asked`` (expert ids, -1 = none); its forecast had named ``named``."""
        asked = [e for e in asked if e >= 0]
        if asked:
            got = sum(e in named for e in asked) / len(asked)
            self.share[layer] = self.decay * self.of(layer) + (1 - self.decay) * got

    def of(self, layer: int) -> float:
        return self.share.get(layer, 1.0)


@dataclass
class BalancedMisses:
    """Per layer, each miss to the lane that finishes the layer sooner (HybriMoE's intra-layer scheduling, DALI's
    per-token 0-1 assignment), with what a copy saves later counted in its favour.

    The layer's work from the moment its routing is known, on the cost model: the device computes the resident
    experts (``expert_time(n)`` each, back to back), the copy lane lands each copied miss one ``copy_time`` after
    the previous one (starting behind any copy still in flight: the clock's copy lane, where it can be read) and
    the device computes it after it lands; the host lane computes its misses back to back (``host_time(n)``) and
    the device waits for the last one at the layer's end. Misses are placed largest first (most tokens: the
    longest-processing-time rule), each where the layer's finish ``max(device end, host end)`` is earlier, after
    crediting the copy with :meth:`MissPolicy.reuse_value` (the expert stays and is a hit at its later uses; the
    victim's later uses go to the host). A tie is copied. The placement is greedy, not optimal; the bound
    (:mod:`specter_lab.analysis.bound`) prices the same two lanes with the future known.

    Pre-gated (``pregated``): one layer ahead, the next layer's forecast is placed the same way with its copies
    starting now, and only the ones placed on the copy lane are prefetched (a blind prefetch of every forecast
    expert floods the link where a copy outlasts a layer: 0.41–0.56 of the bound against ``split_lfu``'s
    0.62–0.72 in ``docs/measured/closer_to_bound.md``'s compiled cells, a perfect forecast, one-off). When the
    layer comes, its misses are placed first, then each resident whose copy is still landing, without the reuse
    credit (the copy lands and stays either way): the device waits for it, or the host computes it now. Late
    residents go after the misses because, placed first, they take the host lane from the misses, which then
    queue behind the prefetches on the link.

    A forecast is acted on only while its layer's running recall (:class:`ForecastRecall`, measured by the runtime
    against the routing that followed) is at least ``trust``: a forecast that is mostly wrong fills the link with
    copies nobody asks for (the bundled model's predictor names 0.19 of layer 1's experts). 0.4 was chosen on the
    compiled cells of ``docs/measured/closer_to_bound.md``, where 0.3 to 0.5 read alike."""

    policy: MissPolicy
    # pre-gated prefetch (a ``prefetch="gate"`` row): prefetch ahead only what the placement would copy
    # (:meth:`copies_ahead`), and place a resident whose copy is still landing too (wait for it, or the host)
    pregated: bool = False
    # act on a layer's forecast only while its running recall (``forecast``) is at least this
    trust: float = 0.4
    forecast: ForecastRecall = field(default_factory=ForecastRecall)

    def on_host(self, schedule, fwd, layer, missing, counts, late: "dict[int, float] | None" = None) -> list[int]:
        self.policy.observe(layer, fwd.routing[layer])
        return self._place(schedule, layer, missing, counts, _link_backlog(schedule.clock), late or {})

    def copies_ahead(self, schedule, layer: int, predicted: dict[int, int], ahead: float) -> list[int]:
        """Of a forecast of ``layer``'s routing (expert → tokens), the misses this rule would copy if their copies
        started now, ``ahead`` seconds before the layer's router asks: what a pre-gated prefetch issues. The rest
        are left to the layer's own placement when it comes (the bound's ``lead=`` prices this foresight when the
        forecast is perfect)."""
        where = schedule.store.slots[layer].where
        missing = [e for e in predicted if e not in where]
        if not missing or self.forecast.of(layer) < self.trust:
            return []
        link = _link_backlog(schedule.clock) - ahead
        on_host = set(self._place(schedule, layer, missing, predicted, link, {}))
        return [e for e in missing if e not in on_host]

    def _place(self, schedule, layer, missing, counts, link: float, late: dict[int, float]) -> list[int]:
        """The greedy placement (class docstring): the misses and late residents that run on the host. ``link``:
        seconds from the router until the copy lane is free (negative: free before it asks)."""
        pol, c = self.policy, schedule.cost
        victim = _victim(schedule.store, layer, counts)
        saving = schedule.host_time(1) - c.expert_time(1)
        miss_set = set(missing)
        dev = sum(c.expert_time(n) for e, n in counts.items() if e not in miss_set and e not in late)
        t_copy = c.copy_time(c.expert_bytes)
        host_end = 0.0
        on_host = []
        for e in sorted(missing, key=lambda x: (-counts[x], x)):
            n = counts[e]
            land = max(0.0, link + t_copy)
            dev_if_copy = max(dev, land) + c.expert_time(n)
            host_if = host_end + schedule.host_time(n)
            finish_copy = max(dev_if_copy, host_end) - pol.reuse_value(layer, e, victim, saving)
            finish_host = max(dev, host_if)
            if finish_copy <= finish_host:
                dev, link = dev_if_copy, link + t_copy
            else:
                host_end = host_if
                on_host.append(e)
        # then residents still landing (after the misses, which have no copy under way): wait for the copy on the
        # device, or compute on the host now (the copy lands anyway and stays for later uses, so no reuse is
        # credited either way); the soonest landing first
        for e in sorted(late, key=lambda x: (late[x], x)):
            n = counts[e]
            dev_if_wait = max(dev, late[e]) + c.expert_time(n)
            host_if = host_end + schedule.host_time(n)
            if max(dev_if_wait, host_end) <= max(dev, host_if):
                dev = dev_if_wait
            else:
                host_end = host_if
                on_host.append(e)
        return on_host


def _link_backlog(clock) -> float:
    """Seconds until the copy lane is free (0 where a clock cannot say mid-run without a sync)."""
    free = clock.copy_free_at()
    if free is None:
        return 0.0
    return max(0.0, clock.elapsed(clock.now(), free))
