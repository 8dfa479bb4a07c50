"""The offloading strategies, as data: each name is a combination of typed mechanism choices (decoding,
prefetch source, chunking, eviction, slot pool, miss rule, refresh).

A :class:`Strategy` is validated when it is built, so a misspelt mechanism fails here, not inside a run. One
function, :func:`specter_lab.run.assembly.assemble`, turns a strategy into a run's parts; nothing else builds
from its mechanism fields. Elsewhere code asks whether a strategy drafts (``speculative``) and its ``k`` (the
planner, the replay's checks and the tables: to pick candidates, check that a trace holds long enough chains of
drafts, and label rows), and two analyses read one field each: the planner's candidates by ``miss``, the bound's
online-eviction twin (:mod:`specter_lab.analysis.gap`) by ``eviction``. Every strategy runs in the same runtime
(same model, same store, same clock), so comparisons are one run at equal device memory.

Adding a mechanism: a class where the mechanism lives (e.g. a miss rule in ``offload/mechanisms.py``), its name
in the ``Literal`` alias below, and one line in the assembly that builds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Literal, Union, get_args

__all__ = ["Strategy", "STRATEGIES", "BASELINES", "AUTO", "get_strategy", "strategy_names", "describe",
           "NOT_CANDIDATES", "PLANNER_MARGIN", "planner_choice", "Prefetch",
           "Eviction", "Miss", "Pool", "Chunking", "Dispatch", "Role", "PREFETCH", "EVICTION", "MISS", "POOL",
           "DISPATCH", "ROLES"]

Prefetch = Literal["none", "gate", "draft", "oracle"]
Eviction = Literal["lru", "lfu", "lfu_decay", "arc", "forecast"]
Miss = Literal["copy", "host", "auto", "balance"]
Pool = Literal["layer", "global"]
Dispatch = Literal["specter", "mixtral_offloading"]
ChunkingName = Literal["adaptive", "budgeted", "stall"]
Chunking = Union[ChunkingName, tuple[float, ...]]  # a named rule, or the draft fractions to issue prefetches at
Role = Literal["baseline", "specter", "replica", "reference"]

PREFETCH: tuple[str, ...] = get_args(Prefetch)
EVICTION: tuple[str, ...] = get_args(Eviction)
MISS: tuple[str, ...] = get_args(Miss)
POOL: tuple[str, ...] = get_args(Pool)
DISPATCH: tuple[str, ...] = get_args(Dispatch)
ROLES: tuple[str, ...] = get_args(Role)
CHUNKING_NAMES: tuple[str, ...] = get_args(ChunkingName)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Strategy:
    """How one strategy decodes and moves experts (validated when built: a bad value names its field).

    * ``speculative`` – draft K tokens with the draft, verify with the target.
    * ``prefetch``    – ``none`` | ``gate`` (next layer's router on this layer's state) | ``draft`` (the draft's
      routing counts over the window) | ``oracle`` (the target's true routing of the window).
    * ``chunking``    – ``adaptive`` (the paper: first boundary at ⌊0.2·K⌋ steps, then just enough steps to hide
      the bytes just issued), ``budgeted`` (beyond the paper), ``stall`` (ranked across layers by expected stall
      saved, none issued that would still wait for the link at verification) or a tuple of draft fractions
      (``specmoeoff``).
    * ``eviction``    – ``lru`` | ``lfu`` | ``lfu_decay`` (LFU whose counts decay per use of the layer:
      :class:`~specter_lab.caching.policies.DecayLFU`) | ``arc`` (adaptive replacement:
      :class:`~specter_lab.caching.policies.ARC`) | ``forecast`` (furthest forecast next use, then recency).
    * ``pool``        – ``layer``: a fixed number of slots per layer; ``global``: one pool for all layers, the
      victim chosen over every layer's slots (llama.cpp's ``--moe-cache-mib``).
    * ``k``           – draft length, or ``"auto"`` for the per-window governor.
    * ``shared_slots`` – one slot pool for all layers, re-divided each window by the forecast's demand.
    * ``miss``        – what a miss after the prefill does: ``copy`` it (and keep it), compute it on the ``host``
      CPU from its host copy (nothing copied on demand), decide per miss by expected reuse (``auto``), or per
      layer by which lane ends the layer sooner, reuse credited (``balance``): see
      :mod:`specter_lab.offload.hostexec`.
    * ``cpu_share``   – with ``miss="copy"``: this share of the misses is computed on the host instead
      (llama.cpp's ``--moe-cache-cpu-share``).
    * ``reuse``       – draft prefetch copies only experts the forecast routes at least ``reuse`` times in the
      window; with host execution the one-offs are computed on the host during verification instead.
    * ``static``      – no cache: the last layers that fit keep all their experts on the device (loaded before
      the prompt), the first ``N`` layers compute every expert on the host (llama.cpp's ``--n-cpu-moe N``).
    * ``writeback``   – every miss that evicts also copies the evicted expert back to the host (device→host),
      as Mixtral-Offloading's cache does: two copies on the link per miss.
    * ``refresh``     – after each decode layer, if the link is idle, copy the expert that layer's recent tokens
      used most (device and host uses alike) and the device lacks, in place of the eviction policy's victim if
      it is used at least twice as often (:mod:`specter_lab.offload.refresh`; non-speculative, per-layer slots).
    * ``single_stream`` – copies run on the compute stream: no copy overlaps any compute.
    * ``dispatch``    – whose expert dispatch the cost model prices (its aten ops and host syncs are counted,
      :mod:`specter_lab.pricing.opcount`): ``specter`` (this runtime: one routing read-back per layer) or
      ``mixtral_offloading`` (the artifact's: 3 syncs per expert, unfused MLPs).
    """

    name: str
    speculative: bool = False
    prefetch: Prefetch = "none"
    chunking: Chunking = "adaptive"
    eviction: Eviction = "lru"
    k: int | str = 8
    protect: bool = True
    keep: bool = True  # False: drop every expert after use (no cache at all)
    shared_slots: bool = False  # slots shared across layers by forecast demand instead of a fixed M per layer
    pool: Pool = "layer"  # global: one LRU over every layer's slots (llama.cpp's expert cache)
    miss: Miss = "copy"  # copy | host | auto (host execution of missed experts)
    cpu_share: float = 0.0  # share of misses computed on the host instead of copied (miss="copy" only)
    static: bool = False  # whole layers on the device or on the host, decided once (llama.cpp --n-cpu-moe)
    reuse: int = 1  # prefetch an expert only if the window's forecast routes it at least this many times
    writeback: bool = False  # copy each evicted expert back to the host (Mixtral-Offloading's swap)
    single_stream: bool = False  # copies on the compute stream (no overlap)
    dispatch: Dispatch = "specter"  # whose counted expert dispatch (aten ops, host syncs) prices the run
    refresh: bool = False  # copy a layer's most used non-resident expert when the link is idle
    description: str = ""
    # What runs this placement today outside specter_lab, in a user's words ("" : specter_lab only), and the
    # llama.cpp flags that express it ("" : none do; {n_cpu_moe} / {cache_mib} are filled from the placement)
    elsewhere: str = ""
    llama_cpp: str = ""
    # What the row is to a comparison (not a mechanism: the assembly never reads it): a baseline the paper's
    # method is compared with, the paper's method or an extension of it, a replica of an artifact's costs, or a
    # reference that reads the true routing.
    role: Role = "baseline"

    def __post_init__(self) -> None:
        for name in ("speculative", "protect", "keep", "shared_slots", "static", "writeback", "single_stream",
                     "refresh"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Strategy {self.name!r}: {name}={getattr(self, name)!r} must be True or False.")
        for name, allowed in (("prefetch", PREFETCH), ("eviction", EVICTION), ("miss", MISS), ("pool", POOL),
                              ("dispatch", DISPATCH), ("role", ROLES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Strategy {self.name!r}: {name}={getattr(self, name)!r} is unknown; use one of "
                                 f"{list(allowed)}.")
        c = self.chunking
        if c not in CHUNKING_NAMES and not (isinstance(c, tuple) and c and all(_is_number(f) and 0 <= f <= 1
                                                                                for f in c)):
            raise ValueError(f"Strategy {self.name!r}: chunking={c!r}: use 'adaptive', 'budgeted', 'stall' or a "
                             "tuple of draft fractions in [0, 1].")
        if self.k != "auto" and not (_is_int(self.k) and self.k >= 1):
            raise ValueError(f"Strategy {self.name!r}: k={self.k!r}: use an integer draft length >= 1 or 'auto'.")
        if not (_is_int(self.reuse) and self.reuse >= 1):
            raise ValueError(f"Strategy {self.name!r}: reuse={self.reuse!r}: use an integer >= 1.")
        if not (_is_number(self.cpu_share) and 0 <= self.cpu_share < 1):
            raise ValueError(f"Strategy {self.name!r}: cpu_share={self.cpu_share!r}: use a number in [0, 1).")
        if self.cpu_share and self.miss != "copy":
            raise ValueError(f"Strategy {self.name!r}: cpu_share={self.cpu_share} splits copied misses; with "
                             f"miss={self.miss!r} the host already decides: leave cpu_share=0.")
        if self.refresh and (self.speculative or self.pool != "layer" or self.static or not self.keep):
            raise ValueError(f"Strategy {self.name!r}: refresh=True copies into a layer's own slots between tokens "
                             "of plain decoding: use it with speculative=False, pool='layer', static=False and "
                             "keep=True.")
        if self.pool == "global" and (self.shared_slots or self.static):
            raise ValueError(f"Strategy {self.name!r}: pool='global' already shares one pool across layers: "
                             "leave shared_slots=False and static=False.")

    def with_options(self, **kw) -> "Strategy":
        """A copy with the given fields changed (None leaves a field as it is); validated like any strategy."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise TypeError(f"Strategy options {unknown} are unknown; use any of {sorted(known - {'name'})}.")
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in [
        Strategy("on_demand", elsewhere="accelerate-style offload (device_map with a CPU share)",
                 eviction="lru", keep=False, description="plain offloading: load each routed expert "
                 "when asked, keep nothing (accelerate-style)"),
        Strategy("lru", elsewhere="mixtral-offloading",
                 eviction="lru", description="per-layer LRU expert cache, no prediction (mixtral-offloading's "
                 "policy, run lean: immutable host copies, a copy stream, one sync per layer)"),
        Strategy("mixtral_offloading", eviction="lru", writeback=True, single_stream=True,
                 dispatch="mixtral_offloading", role="replica", description="Mixtral-Offloading as Specter's artifact runs it: per-"
                 "layer LRU, every miss also writes the evicted expert back to the host, copies and experts on one "
                 "stream, its DeepSeek dispatch (~19 host syncs per layer at top-6, unfused expert MLPs)"),
        Strategy("global_lru", elsewhere="llama.cpp --cpu-moe --moe-cache-mib", llama_cpp="--cpu-moe --moe-cache-mib {cache_mib}",
                 eviction="lru", pool="global", description="one LRU over a slot pool shared by "
                 "every layer, misses copied (llama.cpp --moe-cache-mib; cpu_share= computes a share of misses on "
                 "the host, --moe-cache-cpu-share)"),
        Strategy("gate_lookahead", prefetch="gate", eviction="lru",
                 description="prefetch one layer ahead with the next layer's router (pre-gated MoE style)"),
        Strategy("spec_lru", speculative=True, prefetch="none", eviction="lru",
                 description="speculative decoding with the quantized draft; demand loads + LRU"),
        Strategy("specmoeoff", elsewhere="SpecMoEOff (research code)",
                 speculative=True, prefetch="draft", chunking=(0.2, 0.6), eviction="lru", k=3,
                 description="SpecMoEOff as re-implemented by the paper: K=3, top-M prefetch at draft fractions "
                 "0.2 and 0.6"),
        Strategy("specter", speculative=True, prefetch="draft", chunking="adaptive", eviction="lru", k=8,
                 role="specter", description="the paper: K-token quantized draft, multi-step lookahead prefetch with adaptive "
                 "chunking, protected top-M"),
        Strategy("specter_plus", speculative=True, prefetch="draft", chunking="budgeted", eviction="forecast",
                 k="auto", role="specter", description="beyond the paper: furthest-forecast eviction, bandwidth-aware prefetch, "
                 "K governor"),
        Strategy("fiddler", elsewhere="ktransformers GPU experts / Fiddler",
                 miss="host", description="Fiddler-style: the device keeps what the prompt loaded "
                 "(its most used experts, LRU), every later miss is computed on the host CPU, nothing is copied"),
        Strategy("host_lru", miss="auto", description="LRU cache that copies a miss only when its expected reuse "
                 "pays for the copy, else computes it on the host CPU (llama.cpp / ktransformers users' choice, "
                 "decided per miss)"),
        Strategy("lfu_decay", eviction="lfu_decay", description="per-layer cache evicting the least frequently "
                 "used expert, counts decaying per use of the layer (the field's best online policy, layer+LFU), "
                 "misses copied"),
        Strategy("host_lfu", miss="auto", eviction="lfu_decay", description="host_lru with decayed-LFU eviction"),
        Strategy("split_lru", elsewhere="HybriMoE / DALI (research code)",
                 miss="balance", description="per-token split (HybriMoE, DALI): the device computes "
                 "the resident experts while the host computes the misses placed there, each miss to the lane that "
                 "ends the layer sooner, a copy credited with its expected reuse; LRU cache"),
        Strategy("split_lfu", miss="balance", eviction="lfu_decay", description="split_lru with decayed-LFU "
                 "eviction"),
        Strategy("pregate_split", prefetch="gate", miss="balance", eviction="lfu_decay", refresh=True,
                 description="split_lfu with pre-gated prefetch (Pre-gated MoE, ProMoE): layer l+1's router on "
                 "layer l's state forecasts its experts; the split copies ahead only the ones its placement would "
                 "copy when that layer comes, and a copy still landing then may run on the host instead; an idle "
                 "link copies in each layer's most used missing expert (refresh, MoE-Infinity style)"),
        Strategy("split_arc", miss="balance", eviction="arc", description="split_lru with adaptive replacement "
                 "(ARC) eviction: recency against repeated use, balanced by which ghost list a returning expert "
                 "comes from"),
        Strategy("static_split", elsewhere="llama.cpp --n-cpu-moe N / -ot", llama_cpp="--n-cpu-moe {n_cpu_moe}",
                 miss="host", static=True, description="llama.cpp --n-cpu-moe N at equal "
                 "memory: whole layers' experts on the device, the first N layers' experts computed on the host"),
        Strategy("specter_host", speculative=True, prefetch="draft", chunking="adaptive", eviction="lru", k=8,
                 miss="host", reuse=2, role="specter", description="specter's draft and lookahead prefetch of the experts the window "
                 "reuses; the one-offs and what the forecast missed "
                 "is computed on the host during verification instead of copied (SpecMoEOff / MoE-SpAc style)"),
        Strategy("specter_split", speculative=True, prefetch="draft", chunking="budgeted", eviction="lfu_decay",
                 k="auto", miss="balance", role="specter", description="Specter for small budgets: the window's forecast copies "
                 "only what the link lands before verification needs it (most forecast first, evicting nothing more "
                 "likely), verification splits what is still missing between the device and the host by lane "
                 "(split_lfu's rule), K governor"),
        Strategy("oracle", speculative=True, prefetch="oracle", chunking="adaptive", eviction="forecast", k=8,
                 role="reference", description="specter's schedule with the target's true routing as the forecast "
                 "(a reference, not a bound: sl.bound is the limit)"),
    ]
}


# ``strategy="auto"`` is not a row: it asks the planner (sl.plan) to choose among the rows, a draft variant, bits
# and K for this model, budget and hardware. It is accepted wherever a strategy name is (Engine, compare, the CLI).
AUTO = "auto"
AUTO_DESCRIPTION = ("the planner's choice for this model, budget and hardware (sl.plan): any strategy, a draft "
                    "variant, bits, K, or no speculation")

# What the paper's method is compared with at equal memory: every row whose role is a baseline (not Specter or
# its extensions, not a replica of an artifact's implementation costs, not a reference reading the true routing).
BASELINES: tuple[str, ...] = tuple(n for n, s in STRATEGIES.items() if s.role == "baseline")


# The planner's candidates come from the strategy table: every non-speculative row, and the speculative rows that
# are searched over draft variant × K. A row left out says why here, so a new strategy is a candidate unless
# someone writes down why not (tests/test_strategy_lists.py holds the table and these lists together). The planner
# (sl.plan) and the estimate (sl.estimate) both choose with :func:`planner_choice`.
NOT_CANDIDATES = {
    "on_demand": "keeps nothing: lru at the same budget holds everything it holds and more",
    "mixtral_offloading": "a replica of an artifact's implementation costs, not a configuration anyone would pick",
    "spec_lru": "specter_plus searched over draft × K with demand loads covers it (its prefetch only adds)",
    "specmoeoff": "a re-implementation for the paper's comparison; specter_plus's search covers its K and draft",
    "specter": "the paper's fixed K=8 int4: one point of specter_plus's search over draft × K",
    "oracle": "reads the target's true routing: a reference, not something a run can do",
}
PLANNER_MARGIN = 0.1  # a speculative pick must beat the best plain one by this share (see planner_choice)


def planner_choice(ranked: "list[tuple[str, float]]", margin: float = PLANNER_MARGIN) -> int:
    """Which of ``ranked`` (strategy name, predicted TPOT), fastest first, the planner picks: the fastest,
    unless it speculates and beats the best plain strategy by less than ``margin`` (a few short calibration runs
    are noisy, and a near-tie there became a loss on other prompts). Returns its index."""
    plain = next((i for i, (name, _) in enumerate(ranked) if not get_strategy(name).speculative), None)
    if plain not in (None, 0) and ranked[0][1] > (1 - margin) * ranked[plain][1]:
        return plain
    return 0


def strategy_names(with_auto: bool = True) -> list[str]:
    """Every name a caller may pass as ``strategy=``: the rows, then ``"auto"``."""
    return [*STRATEGIES, AUTO] if with_auto else list(STRATEGIES)


def describe(name: str) -> str:
    """One line on what a strategy name does (``"auto"`` included)."""
    return AUTO_DESCRIPTION if name == AUTO else get_strategy(name).description


def get_strategy(name: "str | Strategy") -> Strategy:
    if isinstance(name, Strategy):
        return name
    if name == AUTO:
        raise ValueError("strategy='auto' is the planner, not a row: give it to sl.Engine (which plans), or "
                         "choose with sl.plan(...) and pass the plan.")
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is unknown; use one of {strategy_names()}.")
    return STRATEGIES[name]
