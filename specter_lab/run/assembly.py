"""One way to assemble a run: a :class:`~specter_lab.run.strategies.Strategy` (typed mechanism choices) → the run's
parts. This module is the only reader of a strategy's mechanism fields.

=====================  ==============================================================================
strategy field         part built here
=====================  ==============================================================================
``eviction``, ``pool``  the store's eviction policy and slot pool (``caching/policies.py``, ``offload/store.py``)
``miss``, ``cpu_share``  the miss rule (``offload/hostexec.py``)
``prefetch``           gate lookahead in the schedule, or the window's forecast source (``decode/speculative.py``)
``chunking``, ``reuse``  the lookahead prefetcher (``predict/prefetch.py``)
``k``                  a fixed draft length or the K governor (``predict/governor.py``)
``speculative``        the decode loop: autoregressive or speculative (``decode/``)
``static``             whole layers preloaded on the device, the rest computed on the host
``writeback``          the store copies each evicted expert back to the host (``offload/store.py``)
``single_stream``      the run's clock puts copies on the compute stream (:func:`run_clock`)
``dispatch``           whose counted expert dispatch the cost model prices (:func:`dispatch_implementation`)
``refresh``            the schedule's popularity copies on an idle link (``offload/refresh.py``)
=====================  ==============================================================================

Adding a mechanism = one class where its kind lives + its name in the strategy's ``Literal`` + one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch

from ..decode import Decoder, Sampling, Speculation, autoregressive, speculative
from ..decode.speculative import DraftForecast, OracleForecast
from ..caching.policies import make_policy
from ..offload.clock import Clock
from ..offload.hostexec import (BalancedMisses, CopyMisses, CostedMisses, HostMisses, MissPolicy, MissRule,
                                ShareMisses)
from ..offload.hostcache import DiskTier, HostExpertCache
from ..offload.refresh import Refresh
from ..offload.runtime import OffloadRuntime
from ..offload.schedule import DraftSource, LayerSchedule
from ..offload.store import ExpertStore
from ..predict import KGovernor, LookaheadPrefetcher
from .strategies import Strategy
from ..records.trace import Trace

__all__ = ["RunParts", "assemble", "make_store", "make_schedule", "miss_rule", "places_whole_layers",
           "computes_on_host", "looks_at_the_target", "run_clock", "dispatch_implementation"]


@dataclass
class RunParts:
    """What one run is made of: the store and its schedule, the runtime (tensor side), the decoder and the loop
    that drives it (``loop(decoder, prompt)``), and the speculation's stateful parts (None: autoregressive)."""

    store: ExpertStore
    schedule: LayerSchedule
    runtime: OffloadRuntime
    decoder: Decoder
    loop: Callable[[Decoder, torch.Tensor], list[int]]
    speculation: Speculation | None = None
    attach: bool = True  # False: a replay, whose decoder runs no model


def places_whole_layers(st: Strategy) -> bool:
    """The budget places whole layers on the device (a static split), not slots per layer."""
    return st.static


def computes_on_host(st: Strategy) -> bool:
    """Some experts run on the host lane (it needs host copies in ``host_dtype`` when that differs)."""
    return st.miss != "copy" or st.static or bool(st.cpu_share)


def uses_gate_predictions(st: Strategy) -> bool:
    """Gate lookahead: prefetches with the next layer's router applied to this layer's state (recorded by
    ``sl.record``; an imported trace has none)."""
    return st.prefetch == "gate"


def looks_at_the_target(st: Strategy) -> bool:
    """The oracle: an off-clock forward of the target per window (a real forward on a measured clock)."""
    return st.prefetch == "oracle"


def miss_rule(st: Strategy, store: ExpertStore) -> MissRule:
    """The strategy's rule for misses after the prefill (``miss``, ``cpu_share``)."""
    if st.miss == "host":
        return HostMisses()
    if st.miss in ("auto", "balance"):
        layers = store.info.layers
        policy = MissPolicy([l.num_experts for l in layers], store.slots_per_layer, [l.top_k for l in layers])
        if st.miss == "auto":
            return CostedMisses(policy)
        # with pre-gated prefetch the split also places the prefetches still landing when their layer comes
        return BalancedMisses(policy, pregated=st.prefetch == "gate")
    return ShareMisses(st.cpu_share) if st.cpu_share else CopyMisses()


def make_store(st: Strategy, info, slots_per_layer: list[int], clock: Clock, cost, trace: Trace,
               device="cpu", host=None, materialize: bool = True,
               host_cache: HostExpertCache | None = None) -> ExpertStore:
    """The store with the strategy's eviction policy and pool; a static split's device layers preloaded.
    ``host_cache``: the disk tier's bounded host cache (None: every expert has a host copy)."""
    tier = DiskTier(host_cache, clock, cost, trace) if host_cache is not None else None
    store = ExpertStore(info, slots_per_layer, clock, cost, partial(make_policy, st.eviction), trace, device, host=host,
                        pool=st.pool, materialize=materialize, writeback=st.writeback, tier=tier)
    if st.static:  # load time, before the prompt: the device layers get every expert once
        for layer, size in enumerate(slots_per_layer):
            for e in range(size):
                store.load(layer, e, "preload")
    return store


def run_clock(st: Strategy, clocks, device=None, trace_level: str = "full") -> Clock:
    """One run's clock from the engine's clock factory: copies on their own stream, or on the compute stream
    (``single_stream``: no overlap, as Mixtral-Offloading runs)."""
    return clocks.make(device, trace_level, single_stream=st.single_stream)


def dispatch_implementation(st: Strategy) -> str:
    """The expert dispatch whose counted aten ops and host syncs price the run (``dispatch``)."""
    return st.dispatch


def make_schedule(st: Strategy, info, store: ExpertStore, draft: DraftSource | None = None,
                  host_weights=None) -> LayerSchedule:
    """The per-layer schedule: the miss rule, gate lookahead, the static split's host layers, the draft."""
    host_layers = [l for l, n in enumerate(store.slots_per_layer) if n == 0] if st.static else []
    wb = next(iter(host_weights[0].values())).element_size() if host_weights else None
    refresh = Refresh([l.num_experts for l in info.layers]) if st.refresh else None
    return LayerSchedule(info, store, store.clock, store.cost, store.trace, miss_rule(st, store), draft=draft,
                         gate_lookahead=st.prefetch == "gate", host_layers=host_layers,
                         host_weights=host_weights, host_weight_bytes=wb, refresh=refresh)


def speculation(st: Strategy, store: ExpertStore, governor: KGovernor | None) -> Speculation:
    """Draft length or governor, the forecast source, and the lookahead prefetcher."""
    prefetcher = None
    if st.prefetch in ("draft", "oracle"):
        prefetcher = LookaheadPrefetcher(store, store.cost, chunking=st.chunking, protect=st.protect,
                                         shared_slots=st.shared_slots and store.can_share(), min_count=st.reuse,
                                         host_misses=computes_on_host(st))
    source = OracleForecast() if st.prefetch == "oracle" else DraftForecast()
    return Speculation(st.k, source, prefetcher, governor if st.k == "auto" else None)


def assemble(st: Strategy, *, model, info, slots_per_layer: list[int], clock: Clock, cost, trace: Trace,
             sampling: Sampling, eos: list[int], max_new_tokens: int, device="cpu", host=None,
             draft: DraftSource | None = None, host_weights=None, governor: KGovernor | None = None,
             callback: Callable[[Any], None] | None = None,
             fault_hook: Callable[[int, int], None] | None = None,
             replay: Callable[..., Decoder] | None = None,
             host_cache: HostExpertCache | None = None) -> RunParts:
    """Turn a strategy into one run's parts (nothing runs yet). ``replay``: a decoder class that plays recorded
    routing instead of running ``model`` (:mod:`specter_lab.analysis.replay`); the store then holds no tensors.
    ``host_cache``: the disk tier (:mod:`specter_lab.offload.hostcache`)."""
    store = make_store(st, info, slots_per_layer, clock, cost, trace, device, host, materialize=replay is None,
                       host_cache=host_cache)
    store.fault_hook = fault_hook
    schedule = make_schedule(st, info, store, draft if st.speculative else None, host_weights)
    runtime = OffloadRuntime(info, schedule)
    dec = (replay or Decoder)(model, runtime, sampling, eos, max_new_tokens, callback, keep_cache=st.keep,
                              rewindable=st.speculative)
    attach = replay is None
    if not st.speculative:
        return RunParts(store, schedule, runtime, dec, autoregressive, attach=attach)
    spec = speculation(st, store, governor)
    return RunParts(store, schedule, runtime, dec, partial(speculative, spec=spec), spec, attach=attach)
