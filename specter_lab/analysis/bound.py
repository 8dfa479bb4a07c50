"""The limit: the TPOT of a clairvoyant schedule of one recorded sequence, against which any strategy is read.

A recorded (or imported) sequence knows its future, so it can be priced as if a strategy knew it too.
:func:`bound` does, for **non-speculative decoding** (one target forward per token) at an engine's device memory,
profile, execution mode and cost shape, with the engine's own :class:`~specter_lab.pricing.cost.CostModel`:

* **dense work exactly as the live run** prices it: per decode forward i (context P + i) and MoE layer,
  ``dense_layer_time(1, P + i)``, then each routed expert ``expert_time(n)`` on the compute lane, then
  ``head_time(1)``; TPOT = the decode forwards' time / (N − 1), as :mod:`specter_lab.records.metrics` measures it;
* **memory**: the most permissive use of the engine's budget, one pool of ``budget_bytes // expert_bytes``
  full-precision slots shared by every layer (what ``global_lru`` pools; a per-layer split and a static split
  are special cases, a draft's bytes are given to slots). A per-layer pool of ``pool // layers`` slots is also
  tried (see *variants*);
* **start of decoding**: the pool starts full (Belady's set or the most used experts, see below), every copy
  landed, the link and the host idle (the prefill is not part of TPOT; a real run starts from what its prefill
  left, copies maybe still in flight);
* **eviction**: Belady's (evict the expert whose next use is furthest in the future; never one the current
  layer still needs);
* **copies**: every copy starts as early as the link (one copy at a time, in request order) and its slot (the
  victim's last use) allow, whenever that is: the schedule knows which expert comes next, so it does not wait
  for the router. A layer computes its experts in the order they become ready; a layer that needs more experts
  than there are slots streams the rest through the slots of experts it has computed (as the runtime does);
* **host execution**: an expert may instead run on the host lane (``LayerSchedule.host_time``; it starts after
  the layer's dense part, when its input exists, and the device waits for it at the layer's end); the pool then
  stays as it was. Misses, and also resident experts: the cost model lets the host lane run beside the device,
  so where a host expert is cheap against the device's per-expert dispatch (eager, unprojected tiny models),
  splitting a layer's experts between the two lanes beats having them all resident, and a strategy that sends
  misses to the host (``fiddler``) does exactly that.

The copy-or-host choice is greedy, per expert (resident ones first, then misses, in expert order): whichever ends
the layer sooner given both lanes' state (a tie is copied; the future is not weighed). Neither that greedy nor
the initial set is provably optimal once copies and the host overlap, so :func:`bound` prices twelve clairvoyant
schedules and keeps the fastest (``schedule`` says which): pool {global, per layer} × initial set {Belady's: the
first experts asked for; the most used over the sequence} × experts {misses always copied, nothing on the host;
greedy copy-or-host; misses always on the host}. Each is a schedule that a strategy knowing the routing could run
on the simulated clock, so the bound is *achieved*, not a proof that nothing goes lower; ``tests/test_bound.py``
shows that no non-speculative strategy of the package beats it on two models, several budgets, profiles and cost
shapes. With every expert resident (budget 1.0) it equals the all-resident run (``static_split`` there) exactly,
unless the host lane pays even for resident experts (see above), where it is lower, as ``fiddler`` is.

**What it does not bound**: speculative strategies verify several tokens per forward and pay dense work and the
LM head once per window, so they can go below this autoregressive bound; their "× of the bound" can exceed 1.0
(read it then as "beats autoregressive decoding at any cache policy"). A draft's own cost and device memory are
not part of it. Prefill time is not part of it (TPOT excludes it).

**Analysis variants** (keyword options of :func:`bound`, :func:`bound_of` and :func:`trace_bound`; the defaults
are the bound above). Each replaces one clairvoyant piece by what an online run could do, everything else kept,
so the step from the bound to the variant is what that piece of clairvoyance is worth:

* ``initial="prompt"``: the pool starts from the prompt's experts, most used in the prefill first (ties: the
  smaller layer, then expert), instead of the two clairvoyant initial sets; the rest stays clairvoyant (the same
  bound, achieved not proven, for runs that start from their prefill's experts);
* ``evict=`` an online policy (``"lru"``, ``"lfu"``, ``"lfu_decay"``, ``"arc"``: every policy of
  :mod:`specter_lab.caching.policies` that reads no future, the same classes the store evicts with, one use clock
  per layer and the store's decay, as ``split_lfu`` evicts): evict as it does, never an expert the current layer
  asks for, instead of Belady's. Copies still
  start as early as the link and the slot allow (the schedule still knows *which* expert comes next), so this is
  no longer a bound: it reads how much of the bound's lead is eviction and how much is timing. It never misses
  less than Belady's (MIN), but its TPOT can end a few percent *below* the bound's on short sequences: an
  eviction that misses more can free a slot sooner (6 of 162 sequence × setting cells of 14–40-token test
  sequences, by up to 4 %; none of the 256-token cells of ``docs/measured/closer_to_bound.md``).
* ``lead=N``: a copy starts no earlier than N of the run's layers before its router asks (``lead=0``: when it
  asks; ``math.inf``: anywhere in its token; fractions allowed, each layer's time taken as the last gap between
  two routers), and never before its token's forward began: the foresight of a perfect pre-gating predictor
  (layer l's router run on an earlier layer's state), against the bound's unlimited foresight, which starts a copy
  whenever the link and a slot are free, tokens ahead. Under a ``@full`` projection a run layer's work and its
  experts' copies are both priced ``depth_scale`` times a real layer's, so N run layers of lead hide what N real
  layers hide in the real model; but a run token has fewer layers, so the token's start cuts a forecast short
  more often than it would there. With ``evict="lfu_decay"`` and ``initial="prompt"`` it reads what an online
  schedule with that predictor could reach.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..caching.policies import ONLINE, POLICIES, Belady, NextUse  # the policies rank the timed pools

from ..errors import BudgetTooSmall, OptionError
from ..model import MoEModelInfo
from ..offload.schedule import counts_of, host_lane_time
from ..run.setup import RunSetup
from .replay import replay_setup
from ..traces.trace_file import RoutedSequence, RoutingTrace, TraceError

__all__ = ["BoundResult", "bound", "bound_of", "trace_bound", "bound_tpots", "x_of_bound", "bound_column", "VARIANTS",
           "INITIAL_POOLS", "EVICTIONS"]

POOLS = ("global", "layer")
INITIAL = ("belady", "frequent")
MISSES = ("copy", "greedy", "host")
VARIANTS: tuple[tuple[str, str, str], ...] = tuple(itertools.product(POOLS, INITIAL, MISSES))
# the analysis variants (module docstring), the bound's own first
INITIAL_POOLS = ("clairvoyant", "prompt")
# the bound itself (Belady), then every online policy a run can evict with (the same classes as the store's)
EVICTIONS = ("belady", *(n for n in ONLINE if not POLICIES[n].forecasting))


@dataclass
class BoundResult:
    """The clairvoyant schedule's TPOT of one sequence and its parts, per decode token (simulated, on the
    engine's profile and cost shape: ``assumptions``). ``tpot_ms = compute_ms + copy_ms + host_ms``."""

    tpot_ms: float
    compute_ms: float  # device busy: dense parts, experts on the device, LM head
    copy_ms: float  # exposed copy time: the device waiting for a copy
    host_ms: float  # exposed host time: the device waiting for a host result
    misses: int  # decode requests whose expert was not in the pool when asked
    copies: int
    host_experts: int  # experts computed on the host lane (misses, and resident ones where that was faster)
    tokens: int  # decode forwards priced (N − 1)
    pool_slots: int  # full-precision slots the budget holds (one pool for every layer)
    schedule: str  # which clairvoyant schedule was fastest
    assumptions: str = ""
    variants: dict[str, float] = field(default_factory=dict, repr=False)  # label → TPOT ms of every schedule tried

    def as_dict(self) -> dict[str, Any]:
        return {"bound_tpot_ms": self.tpot_ms, "bound_compute_ms": self.compute_ms, "bound_copy_ms": self.copy_ms,
                "bound_host_ms": self.host_ms, "bound_misses": self.misses, "bound_copies": self.copies,
                "bound_host_experts": self.host_experts, "bound_pool_slots": self.pool_slots,
                "bound_schedule": self.schedule}


def x_of_bound(bound_tpot_ms: float, tpot_ms: float) -> float:
    """"× of the bound" of one row: bound TPOT / the strategy's TPOT (1.0 = at the bound; lower = time left on
    the table; above 1.0 only for a speculative strategy, which the autoregressive bound does not cover)."""
    if not (tpot_ms > 0 and math.isfinite(tpot_ms)) or not math.isfinite(bound_tpot_ms):
        return float("nan")
    return bound_tpot_ms / tpot_ms


def bound_column(df, bound: str = "bound_tpot_ms", tpot: str = "tpot_ms"):
    """The "× of the bound" column of a table with a bound TPOT column and a TPOT column (a pandas Series)."""
    return df[bound] / df[tpot].where(df[tpot] > 0)


def bound(engine, seq: RoutedSequence, *, initial: str = "clairvoyant", evict: str = "belady",
          lead: "float | None" = None) -> BoundResult:
    """The TPOT of the fastest clairvoyant non-speculative schedule of ``seq`` at ``engine``'s device memory,
    profile, execution mode and cost shape (see the module docstring for what is and is not bounded).
    ``engine``: an :class:`~specter_lab.run.engine.Engine` (anything with ``.setup`` and ``.info``).
    ``initial="prompt"`` / ``evict="lru"|"lfu_decay"`` / ``lead=layers``: the analysis variants (module docstring);
    the defaults are the bound."""
    return bound_of(engine.setup, engine.info, seq, initial=initial, evict=evict, lead=lead)


def bound_of(setup: RunSetup, info: MoEModelInfo, seq: RoutedSequence, *, initial: str = "clairvoyant",
             evict: str = "belady", lead: "float | None" = None) -> BoundResult:
    """:func:`bound` from a run set-up and the model's info alone (what :func:`trace_bound` uses: no Engine)."""
    check_variant(initial, evict, lead)
    if not isinstance(seq, RoutedSequence):
        raise TypeError(f"seq must be a RoutedSequence (trace.sequences[i]), got {type(seq).__name__}.")
    cost = setup.cost
    if seq.decode.ndim != 3 or seq.decode.shape[1] != info.num_layers:
        raise TraceError(f"seq.decode: shape {seq.decode.shape}, but the engine's model has {info.num_layers} MoE "
                         "layers: the sequence was recorded on another model.")
    if len(seq.tokens) < 2:
        raise ValueError("seq has fewer than 2 generated tokens: TPOT needs at least one decode forward.")
    total = sum(l.num_experts for l in info.layers)
    pool = int(min(total, setup.split.budget_bytes // max(1, cost.expert_bytes)))
    host_wb = setup.host_dtype.itemsize if setup.host_dtype is not None else None
    prob = _Problem.of(seq, info, cost, host_wb)
    variants = VARIANTS if initial == "clairvoyant" else tuple(itertools.product(POOLS, ("prompt",), MISSES))
    results = {v: _simulate(prob, pool, *v, evict=evict, lead=lead) for v in variants}
    best = min(variants, key=lambda v: results[v].tpot)
    r, n = results[best], prob.forwards
    ms = 1e3 / n
    what = "clairvoyant" if evict == "belady" else f"{evict} eviction (online), copies timed clairvoyantly"
    if lead is not None:
        what += (", copies started within the token" if math.isinf(lead) else
                 f", copies started at most {lead:g} layer(s) before the router asks, within the token")
    if initial == "prompt":
        what += ", starting from the prompt's experts"
    return BoundResult(r.tpot * 1e3, r.busy * ms, r.copy_wait * ms, r.host_wait * ms, r.misses, r.copies,
                       r.host, n, pool, _label(best, evict, lead),
                       f"simulated, {what}, non-speculative; pool {pool} slots; {cost.assumptions}",
                       {_label(v, evict, lead): results[v].tpot * 1e3 for v in variants})


def trace_bound(trace: RoutingTrace, strategy="lru", *, sequences: "Sequence[int] | None" = None,
                initial: str = "clairvoyant", evict: str = "belady", lead: "float | None" = None,
                **options) -> list[BoundResult]:
    """:func:`bound` of every recorded sequence (or those in ``sequences``) at the device memory, profile and cost
    shape a replay with these ``options`` would have (``strategy``: the row the bound is read against;
    only its budget split matters, e.g. a speculative one's ``cache_slots`` count its draft's bytes).
    ``initial`` / ``evict`` / ``lead``: the analysis variants (module docstring; ``evict``, not ``eviction``,
    which is the strategy's option and passes on to the set-up with the other ``options``)."""
    check_variant(initial, evict, lead)
    if strategy == "auto" or hasattr(strategy, "engine_kwargs"):
        strategy = "lru"  # a plan's choice does not change the device memory the bound is priced at
    setup, info = replay_setup(trace, strategy, check=False, **options)
    picked = range(len(trace.sequences)) if sequences is None else list(sequences)
    return [bound_of(setup, info, trace.sequences[i], initial=initial, evict=evict, lead=lead) for i in picked]


def bound_tpots(trace: RoutingTrace, expert_budget, hardware, cost_shape) -> "list[float] | None":
    """The bound's TPOT (ms) of each sequence at this memory, profile and cost shape: what ``bench`` and the
    planner read every row against. None where the budget holds no expert slot (no bound to read against)."""
    try:
        return [r.tpot_ms for r in trace_bound(trace, "lru", expert_budget=expert_budget, hardware=hardware,
                                               cost_shape=cost_shape)]
    except BudgetTooSmall:
        return None


def check_variant(initial: str, evict: str, lead: "float | None" = None) -> None:
    """Refuse an unknown analysis variant before any work (:class:`~specter_lab.errors.OptionError`)."""
    for name, value, choices in (("initial", initial, INITIAL_POOLS), ("evict", evict, EVICTIONS)):
        if value not in choices:
            raise OptionError(f"{name}={value!r} is not a variant of the bound; use one of {list(choices)} (the "
                              f"first, {choices[0]!r}, is the bound itself).", name, value, choices)
    if lead is not None and (isinstance(lead, bool) or not isinstance(lead, (int, float)) or not lead >= 0):
        raise OptionError(f"lead={lead!r}: give how many layers ahead of its router a copy may start, a "
                          "number >= 0 (0: when the router asks; math.inf: anywhere in its token), or None for the "
                          "bound's unlimited foresight.", "lead", lead, ("None", "0, 1, 2.5, …, math.inf"))


def _label(variant: tuple[str, str, str], evict: str = "belady", lead: "float | None" = None) -> str:
    pool, init, miss = variant
    misses = {"copy": "misses copied", "greedy": "each expert copy-or-host, greedy", "host": "misses on the host"}[miss]
    return (f"{pool} pool, {init} initial set, {misses}" + ("" if evict == "belady" else f", {evict} eviction")
            + ("" if lead is None else ", lead: the token" if math.isinf(lead) else f", lead {lead:g}"))


# --------------------------------------------------------------------------------------------- the simulation

@dataclass
class _Problem:
    """One sequence's decode requests and the prices the simulation needs (seconds)."""

    requests: list[dict[int, int]]  # per request t = i·L + l: expert key → tokens (key = l·E + e)
    dense: list[list[float]]  # per decode forward, per MoE layer: its dense part
    head: list[float]  # per decode forward: the LM head (and any dense layers)
    copy: float
    expert: dict[int, float]  # tokens → device time
    host: dict[int, float]  # tokens → host lane time
    layers: int
    num_experts: list[int]
    stride: int
    uses: NextUse  # key → request times it is asked at
    prompt: list[int] = field(default_factory=list)  # the prefill's experts, most used first (initial="prompt")

    @property
    def forwards(self) -> int:
        return len(self.dense)

    @classmethod
    def of(cls, seq: RoutedSequence, info, cost, host_wb) -> "_Problem":
        L, stride = info.num_layers, max(l.num_experts for l in info.layers)
        p = len(seq.prompt)
        requests, uses = [], {}
        for i in range(seq.decode.shape[0]):
            for l, layer in enumerate(info.layers):
                req = {l * stride + e: n for e, n in counts_of(seq.decode[i, l, : layer.top_k]).items()}
                for key in req:
                    uses.setdefault(key, []).append(len(requests))
                requests.append(req)
        sizes = {n for r in requests for n in r.values()}
        asked: dict[int, int] = {}  # prefill key → tokens that asked for it
        for l, layer in enumerate(info.layers):
            for e in seq.prefill[:, l, : layer.top_k].ravel().tolist():
                if e >= 0:
                    asked[l * stride + e] = asked.get(l * stride + e, 0) + 1
        n_fwd = seq.decode.shape[0]
        return cls(requests, [[cost.dense_layer_time(1, p + i, l) for l in range(L)] for i in range(n_fwd)],
                   [cost.head_time(1, p + i) for i in range(n_fwd)], cost.copy_time(cost.expert_bytes),
                   {n: cost.expert_time(n) for n in sizes},
                   {n: host_lane_time(cost, n, host_wb) for n in sizes}, L, [l.num_experts for l in info.layers],
                   stride, NextUse(uses), sorted(asked, key=lambda k: (-asked[k], k)))


class _Timed:
    """What a timed schedule needs beside a cache-simulator policy's ranking (a mixin before the policy): when
    each resident's copy lands and when its last compute ended. Keys are ``l·stride + e``."""

    def __init__(self, capacity: int, next_use: NextUse, **policy: Any) -> None:
        super().__init__(capacity, next_use, **policy)
        self.next_use = next_use
        self.ready: dict[int, float] = {}  # key → when its copy lands
        self.last: dict[int, float] = {}  # key → when its last compute ended

    def insert(self, key: int, ready: float, t: int) -> None:
        """``key`` enters at request ``t`` (-1: before decoding), its copy landing at ``ready``."""
        self.loaded(key, t)
        self.ready[key], self.last[key] = ready, -math.inf

    def evict(self, key: int) -> None:
        self.evicted(key)
        del self.ready[key], self.last[key]

    def free_at(self, key: int | None) -> float:
        """When the slot of ``key`` may be overwritten (its last read and its own copy done)."""
        return -math.inf if key is None else max(self.ready[key], self.last[key])

    def asked_now(self, key: int, t: int) -> bool:
        """Does request ``t`` ask for the resident ``key``?"""
        return self.next_use.asked(key, t)


class _Pool(_Timed, Belady):
    """The bound's pool: ranked by the cache simulator's Belady (furthest next use first, never a key requested
    now). Ties go to the smallest key, not to the least recent as in the simulator's default (the store's
    ``forecast`` order): hits do not depend on it while no layer streams, but which slot is freed does change when
    copies land, and the bound's TPOT was fixed with this order (recency ties moved it in 9 of 36 sequence ×
    budget × profile cells measured, by up to 2.7 %, all but one lower)."""

    def __init__(self, capacity: int, next_use: NextUse) -> None:
        super().__init__(capacity, next_use, ties="key")

    def asked_now(self, key: int, t: int) -> bool:
        return self.nxt[key] == t  # Belady keeps each resident's next request: no search

    def choose(self, t: int) -> "tuple[bool, int | None]":
        """(found, key): an empty slot (key None), else the furthest next use unless every resident is needed now."""
        if self.free > 0:
            return True, None
        key = self.victim((), t)
        return key is not None, key

    def stream_victim(self, done: list[int], t: int) -> int:
        """Of this layer's computed experts ``done``, the one next used furthest away (ties: the earliest loaded,
        the order this TPOT was fixed with, so the choice stays here rather than in ``Belady.victim``)."""
        return max(done, key=lambda k: self.next_use.after(k, t))


class _AskedAt:
    """The residents request ``t`` asks for, as a container (what an online policy may not evict now)."""

    def __init__(self, next_use: NextUse, t: int) -> None:
        self.next_use, self.t = next_use, t

    def __contains__(self, key: object) -> bool:
        return self.next_use.asked(key, self.t)


class _Online(_Timed):
    """A pool evicting as an online policy does (the policy class after this mixin), never an expert the current
    request asks for: the analysis variant ``evict=`` (module docstring)."""

    def choose(self, t: int) -> "tuple[bool, int | None]":
        if self.free > 0:
            return True, None
        key = self.victim(_AskedAt(self.next_use, t), t)
        return key is not None, key

    def stream_victim(self, done: list[int], t: int) -> int:
        """The policy's victim among this layer's computed experts ``done``."""
        keep = set(self.recency).difference(done)
        return self.victim(keep, t)


@functools.lru_cache(maxsize=None)
def _online_pool(evict: str) -> type:
    """The timed pool of an online policy: the mixin before the policy's own class."""
    return type(f"_Online_{evict}", (_Online, POLICIES[evict]), {})


def _new_pool(evict: str, capacity: int, prob: "_Problem") -> _Timed:
    if evict == "belady":
        return _Pool(capacity, prob.uses)
    # keys are l·stride + e: a policy that keeps something per layer (a use clock, ARC's lists) finds it so
    return _online_pool(evict)(capacity, prob.uses, layer_of=lambda key, s=prob.stride: key // s)


@dataclass
class _Outcome:
    tpot: float = 0.0
    busy: float = 0.0
    copy_wait: float = 0.0
    host_wait: float = 0.0
    misses: int = 0
    copies: int = 0
    host: int = 0


def _finish(start: float, dev: list[tuple[float, float, int]]) -> float:
    t = start
    for ready, dur, _ in sorted(dev):
        t = max(t, ready) + dur
    return t


def _initial(prob: _Problem, pools: list[_Timed], pool_of, init: str) -> None:
    """Fill every pool before decoding starts: Belady's set (the first experts asked for), the most used, or the
    prompt's experts (most used in the prefill first)."""
    if init == "prompt":
        order = prob.prompt
    elif init == "belady":
        order = [k for r in prob.requests for k in r]
        order = list(dict.fromkeys(order))
    else:
        uses = prob.uses.uses
        order = sorted(uses, key=lambda k: (-len(uses[k]), uses[k][0]))
    for key in order:
        pool = pools[pool_of(key)]
        if pool.free > 0:
            pool.insert(key, -math.inf, -1)


def _simulate(prob: _Problem, slots: int, pool_kind: str, init: str, miss: str, evict: str = "belady",
              lead: "float | None" = None) -> _Outcome:
    """One clairvoyant schedule's decode time (see the module docstring), on its own three-lane clock.
    ``lead``: the ``lead`` variant (module docstring; None: copies start whenever the link and slot allow)."""
    L = prob.layers
    if pool_kind == "global":
        pools, pool_of = [_new_pool(evict, slots, prob)], (lambda key: 0)
    else:
        pools = [_new_pool(evict, min(n, slots // L), prob) for n in prob.num_experts]
        pool_of = (lambda key: key // prob.stride)
    _initial(prob, pools, pool_of, init)
    out = _Outcome()
    compute_t = copy_t = host_t = 0.0
    # lead: run layers of foresight, each as long as the last gap between two routers, never reaching before the
    # token's forward began
    asked = span = token_start = 0.0  # the last router's time, the last gap between routers, this forward's start
    for t, req in enumerate(prob.requests):
        i, l = divmod(t, L)
        pool = pools[pool_of(l * prob.stride)]
        if l == 0:
            token_start = compute_t
        compute_t += prob.dense[i][l]
        out.busy += prob.dense[i][l]
        dense_end = compute_t
        if l > 0:
            span = dense_end - asked
        asked = dense_end
        if lead is None:
            earliest = -math.inf
        else:
            earliest = token_start if math.isinf(lead) else max(token_start, dense_end - lead * span)
        dev: list[tuple[float, float, int]] = []
        host_ends: list[float] = []
        deferred: list[int] = []
        greedy = miss == "greedy"
        for key in sorted(req, key=lambda k: (k not in pool.ready, k)):  # resident experts first, then misses
            n = req[key]
            if key in pool.ready:
                h_end = max(host_t, dense_end) + prob.host[n]
                h_max = max(host_ends, default=-math.inf)
                if greedy and max(_finish(dense_end, dev), h_max, h_end) < max(
                        _finish(dense_end, dev + [(pool.ready[key], prob.expert[n], key)]), h_max):
                    host_t = h_end  # the host lane beside the device ends the layer sooner (strictly)
                    host_ends.append(h_end)
                    out.host += 1
                    continue
                dev.append((pool.ready[key], prob.expert[n], key))
                continue
            out.misses += 1
            h_end = max(host_t, dense_end) + prob.host[n]
            found, victim = pool.choose(t) if pool.capacity and miss != "host" else (False, None)
            if not found:
                if miss != "host" and pool.capacity:
                    deferred.append(key)  # every slot holds an expert this layer still needs: stream it
                    continue
                host_t = h_end
                host_ends.append(h_end)
                out.host += 1
                continue
            c_end = max(copy_t, pool.free_at(victim), earliest) + prob.copy
            if miss != "copy":
                h_max = max(host_ends, default=-math.inf)
                end_copy = max(_finish(dense_end, dev + [(c_end, prob.expert[n], key)]), h_max)
                end_host = max(_finish(dense_end, dev), h_max, h_end)
                if end_host < end_copy:  # ties copied: the copy stays for later uses
                    host_t = h_end
                    host_ends.append(h_end)
                    out.host += 1
                    continue
            if victim is not None:
                pool.evict(victim)
            pool.insert(key, c_end, t)
            copy_t = c_end
            out.copies += 1
            dev.append((c_end, prob.expert[n], key))
        for ready, dur, key in sorted(dev):
            start = max(compute_t, ready)
            out.copy_wait += start - compute_t
            compute_t = start + dur
            out.busy += dur
            pool.last[key] = compute_t
        for key in deferred:
            compute_t, copy_t, host_t = _stream(prob, pool, t, key, req[key], compute_t, copy_t, host_t,
                                                host_ends, miss, out)
        if host_ends and max(host_ends) > compute_t:
            out.host_wait += max(host_ends) - compute_t
            compute_t = max(host_ends)
        for key in req:
            if key in pool:
                pool.touch(key, t)
        if l == L - 1:
            compute_t += prob.head[i]
            out.busy += prob.head[i]
    out.tpot = compute_t / prob.forwards
    return out


def _stream(prob: _Problem, pool: _Timed, t: int, key: int, n: int, compute_t: float, copy_t: float,
            host_t: float, host_ends: list[float], miss: str, out: _Outcome) -> tuple[float, float, float]:
    """A miss of a layer that needs more experts than its pool has slots: copy it into the slot of an expert this
    layer has already computed (the one next used furthest away), or run it on the host if that ends sooner."""
    # The simulator's deferred miss takes the victim of all residents once the layer's experts are used; here they
    # are all this layer's computed experts too, and the pool ranks them (stream_victim).
    done = [k for k in pool.ready if pool.last[k] > -math.inf and pool.asked_now(k, t)]
    victim = pool.stream_victim(done, t)
    c_end = max(copy_t, pool.free_at(victim)) + prob.copy
    h_end = max(host_t, compute_t) + prob.host[n]  # issued now (a later start than the layer's dense end)
    end_copy = max(compute_t, c_end) + prob.expert[n]
    if miss == "greedy" and h_end < end_copy:
        host_ends.append(h_end)
        out.host += 1
        return compute_t, copy_t, h_end
    pool.evict(victim)
    pool.insert(key, c_end, t)
    out.copies += 1
    start = max(compute_t, c_end)
    out.copy_wait += start - compute_t
    out.busy += prob.expert[n]
    pool.last[key] = start + prob.expert[n]
    return start + prob.expert[n], c_end, host_t
