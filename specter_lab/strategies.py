"""The offloading strategies, as data: each name is a combination of decoding, prediction, prefetch and eviction.

Every strategy runs in the same runtime (same model, same store, same clock), so comparisons are one run at
equal device memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Strategy", "STRATEGIES", "BASELINES", "get_strategy"]


@dataclass(frozen=True)
class Strategy:
    """How one strategy decodes and moves experts.

    * ``speculative`` – draft K tokens with the quantized draft, verify with the target.
    * ``prefetch``    – ``none`` | ``gate`` (next layer's router on this layer's state) | ``draft`` (the draft's
      routing counts over the window) | ``oracle`` (the target's true routing of the window).
    * ``chunking``    – ``adaptive`` (the paper: first boundary at ⌊0.2·K⌋ steps, then just enough steps to hide
      the bytes just issued) or a tuple of draft fractions (``specmoeoff``: 0.2 and 0.6).
    * ``eviction``    – ``lru`` | ``lfu`` | ``forecast`` (furthest forecast next use, then recency).
    * ``k``           – draft length, or ``"auto"`` for the per-window governor.
    * ``shared_slots`` – one slot pool for all layers, re-divided each window by the forecast's demand.
    * ``miss``        – what a miss after the prefill does: ``copy`` it (and keep it), compute it on the ``host``
      CPU from its host copy (nothing copied on demand), or decide per miss (``auto``): see
      :mod:`specter_lab.offload.hostexec`.
    * ``reuse``       – draft prefetch copies only experts the forecast routes at least ``reuse`` times in the
      window; with host execution the one-offs are computed on the host during verification instead.
    * ``static``      – no cache: the last layers that fit keep all their experts on the device (loaded before
      the prompt), the first ``N`` layers compute every expert on the host (llama.cpp's ``--n-cpu-moe N``).
    * ``writeback``   – every miss that evicts also copies the evicted expert back to the host (device→host),
      as Mixtral-Offloading's cache does: two copies on the link per miss.
    * ``single_stream`` – copies run on the compute stream: no copy overlaps any compute.
    * ``dispatch``    – whose expert dispatch the cost model prices (its aten ops and host syncs are counted,
      :mod:`specter_lab.offload.hostops`): ``specter`` (this runtime: one routing read-back per layer) or
      ``mixtral_offloading`` (the artifact's: ~3 syncs per expert, unfused MLPs).
    """

    name: str
    speculative: bool = False
    prefetch: str = "none"
    chunking: str | tuple[float, ...] = "adaptive"
    eviction: str = "lru"
    k: int | str = 8
    protect: bool = True
    keep: bool = True  # False: drop every expert after use (no cache at all)
    shared_slots: bool = False  # slots shared across layers by forecast demand instead of a fixed M per layer
    miss: str = "copy"  # copy | host | auto (host execution of missed experts)
    static: bool = False  # whole layers on the device or on the host, decided once (llama.cpp --n-cpu-moe)
    reuse: int = 1  # prefetch an expert only if the window's forecast routes it at least this many times
    writeback: bool = False  # copy each evicted expert back to the host (Mixtral-Offloading's swap)
    single_stream: bool = False  # copies on the compute stream (no overlap)
    dispatch: str = "specter"  # specter | mixtral_offloading: whose counted expert dispatch prices the run
    description: str = ""

    def with_options(self, **kw) -> "Strategy":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in [
        Strategy("on_demand", eviction="lru", keep=False, description="plain offloading: load each routed expert when asked, "
                 "keep nothing (accelerate-style)"),
        Strategy("lru", eviction="lru", description="per-layer LRU expert cache, no prediction (mixtral-offloading's "
                 "policy, run lean: immutable host copies, a copy stream, one sync per layer)"),
        Strategy("mixtral_offloading", eviction="lru", writeback=True, single_stream=True,
                 dispatch="mixtral_offloading", description="Mixtral-Offloading as Specter's artifact runs it: per-"
                 "layer LRU, every miss also writes the evicted expert back to the host, copies and experts on one "
                 "stream, its DeepSeek dispatch (~19 host syncs per layer at top-6, unfused expert MLPs)"),
        Strategy("gate_lookahead", prefetch="gate", eviction="lru",
                 description="prefetch one layer ahead with the next layer's router (pre-gated MoE style)"),
        Strategy("spec_lru", speculative=True, prefetch="none", eviction="lru",
                 description="speculative decoding with the quantized draft; demand loads + LRU"),
        Strategy("specmoeoff", speculative=True, prefetch="draft", chunking=(0.2, 0.6), eviction="lru", k=3,
                 description="SpecMoEOff as re-implemented by the paper: K=3, top-M prefetch at draft fractions "
                 "0.2 and 0.6"),
        Strategy("specter", speculative=True, prefetch="draft", chunking="adaptive", eviction="lru", k=8,
                 description="the paper: K-token quantized draft, multi-step lookahead prefetch with adaptive "
                 "chunking, protected top-M"),
        Strategy("specter_plus", speculative=True, prefetch="draft", chunking="budgeted", eviction="forecast",
                 k="auto", description="beyond the paper: furthest-forecast eviction, bandwidth-aware prefetch, "
                 "K governor"),
        Strategy("fiddler", miss="host", description="Fiddler-style: the device keeps what the prompt loaded "
                 "(its most used experts, LRU), every later miss is computed on the host CPU, nothing is copied"),
        Strategy("host_lru", miss="auto", description="LRU cache that copies a miss only when its expected reuse "
                 "pays for the copy, else computes it on the host CPU (llama.cpp / ktransformers users' choice, "
                 "decided per miss)"),
        Strategy("static_split", miss="host", static=True, description="llama.cpp --n-cpu-moe N at equal "
                 "memory: whole layers' experts on the device, the first N layers' experts computed on the host"),
        Strategy("specter_host", speculative=True, prefetch="draft", chunking="adaptive", eviction="lru", k=8,
                 miss="host", reuse=2, description="specter's draft and lookahead prefetch of the experts the window "
                 "reuses; the one-offs and what the forecast missed "
                 "is computed on the host during verification instead of copied (SpecMoEOff / MoE-SpAc style)"),
        Strategy("auto", description="the planner's choice for this model, budget and hardware (sl.plan): "
                 "any of the above, a draft variant, bits, K, or no speculation"),
        Strategy("oracle", speculative=True, prefetch="oracle", chunking="adaptive", eviction="forecast", k=8,
                 description="bound: specter's schedule with the target's true routing as the forecast"),
    ]
}


# What the paper's method is compared with at equal memory: every strategy that is not Specter, its extension or
# a bound, nor a replica of an artifact's implementation costs (mixtral_offloading: see specter_lab.paper).
BASELINES = ("on_demand", "lru", "gate_lookahead", "spec_lru", "specmoeoff", "fiddler", "host_lru", "static_split")


def get_strategy(name: "str | Strategy") -> Strategy:
    if isinstance(name, Strategy):
        return name
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is unknown; use one of {list(STRATEGIES)}.")
    return STRATEGIES[name]
