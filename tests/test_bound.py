"""The bound (sl.bound): the clairvoyant schedule's TPOT of a recorded sequence is below every non-speculative
strategy's replayed TPOT, equals the all-resident run where every expert fits, and its eviction is Belady's; its
analysis variants (initial="prompt", evict="lru"/"lfu_decay") never miss less, lead= only delays copies, and all
refuse bad values early."""

import math

import numpy as np
import pandas as pd
import pytest

import specter_lab as sl
from specter_lab.analysis.cache_bounds import belady_hits
from specter_lab.errors import OptionError
from specter_lab.analysis.bound import (POOLS, VARIANTS, _Problem, _simulate, bound_column, bound_of, trace_bound,
                                       x_of_bound)
from specter_lab.traces.trace_file import RoutedSequence, TraceError

NON_SPECULATIVE = ["lru", "on_demand", "gate_lookahead", "global_lru", "fiddler", "host_lru", "static_split"]
PROMPTS = [[5, 6, 7, 8, 9, 10], [17, 3, 99, 42, 42, 7, 200, 11]]
# (hardware, cost shape): a projected one where copies dominate, and the tiny model as it is on an eager profile
SETTINGS = [("a100-40g-pcie4@compiled", "deepseek-v2-lite@full"), ("rtx4090-pcie4", "mixtral-8x7b@full"),
            ("t4-pcie3", None)]


@pytest.fixture(scope="module")
def random_trace(model):
    return sl.record(model, None, PROMPTS, max_new_tokens=16, k_max=0, progress=False)


@pytest.fixture(scope="module")
def bundled_trace():
    model, tok = sl.load_model("tiny")
    return sl.record(model, tok, ["def fib(n):"], max_new_tokens=14, k_max=0, progress=False)


def _check_below(trace, budgets, label):
    """Bound ≤ every non-speculative strategy's replayed TPOT, per sequence; returns the rows (printed with -s)."""
    rows = []
    for hw, shape in SETTINGS:
        for budget in budgets:
            kw = dict(expert_budget=budget, hardware=hw, cost_shape=shape)
            bounds = trace_bound(trace, **kw)
            for s in NON_SPECULATIVE:
                for i, rep in enumerate(sl.replay(trace, s, **kw)):
                    tpot, b = rep.metrics["tpot_ms"], bounds[i].tpot_ms
                    rows.append({"trace": label, "hardware": hw, "cost_shape": shape, "budget": budget, "seq": i,
                                 "strategy": s, "tpot_ms": tpot, "bound_tpot_ms": b})
                    assert b <= tpot * (1 + 1e-12), f"{label} {kw} seq {i}: {s} {tpot} ms beats the bound {b} ms"
    df = pd.DataFrame(rows)
    df["x_of_bound"] = bound_column(df)
    best = df.loc[df.groupby(["hardware", "budget", "seq"]).tpot_ms.idxmin()]
    print(f"\n{label}: best strategy per cell and its × of the bound\n"
          + best[["hardware", "cost_shape", "budget", "seq", "strategy", "tpot_ms", "bound_tpot_ms",
                  "x_of_bound"]].to_string(index=False))
    return df


def test_no_non_speculative_strategy_beats_the_bound_random_model(random_trace):
    # 8 experts × 2 layers, top-2: 0.125 = one slot per layer (streams), 0.25 / 0.5 evict, 1.0 holds all
    df = _check_below(random_trace, (0.125, 0.25, 0.5, 1.0), "tiny_random_model('qwen2_moe', seed=1)")
    assert (df.x_of_bound <= 1 + 1e-12).all()


def test_no_non_speculative_strategy_beats_the_bound_bundled_model(bundled_trace):
    # 32 experts × 4 layers, top-4: 0.1 = 3 slots per layer (fewer than top-k: every layer streams)
    _check_below(bundled_trace, (0.1, 0.35, 1.0), "bundled tiny model")


@pytest.mark.parametrize("hw,shape", SETTINGS[:2])
def test_with_every_expert_resident_the_bound_is_the_all_resident_run(random_trace, bundled_trace, hw, shape):
    for trace in (random_trace, bundled_trace):
        kw = dict(expert_budget=1.0, hardware=hw, cost_shape=shape)
        for b, rep in zip(trace_bound(trace, **kw), sl.replay(trace, "static_split", **kw)):
            assert rep.metrics["demand_misses"] == 0 and b.misses == b.copies == b.host_experts == 0
            assert math.isclose(b.tpot_ms, rep.metrics["tpot_ms"], rel_tol=1e-9), (b.tpot_ms, rep.metrics["tpot_ms"])
            assert b.copy_ms == b.host_ms == 0 and math.isclose(b.compute_ms, b.tpot_ms, rel_tol=1e-12)


def test_where_the_host_lane_pays_for_resident_experts_the_bound_goes_below_all_resident(random_trace):
    # Eager tiny model, no projection: a host expert beside the device's dispatch-bound one ends a layer sooner,
    # so fiddler (misses on the host) beats having every expert resident; the bound covers that too.
    kw = dict(expert_budget=1.0, hardware="t4-pcie3")
    resident = sl.replay(random_trace, "static_split", **kw)[0].metrics["tpot_ms"]
    fiddler = sl.replay(random_trace, "fiddler", **kw)[0].metrics["tpot_ms"]
    b = trace_bound(random_trace, sequences=[0], **kw)[0]
    assert fiddler < resident and b.tpot_ms <= fiddler and b.host_experts > 0 and b.misses == 0


def test_parts_add_up_and_the_pool_is_the_whole_budget(model, random_trace):
    kw = dict(expert_budget=0.25, hardware="a100-40g-pcie4@compiled", cost_shape="deepseek-v2-lite@full")
    eng = sl.Engine(model, None, "lru", **kw)
    b = sl.bound(eng, random_trace.sequences[1])
    assert math.isclose(b.tpot_ms, b.compute_ms + b.copy_ms + b.host_ms, rel_tol=1e-12)
    assert b.pool_slots == eng.split.budget_bytes // eng.cost.expert_bytes == 4
    assert b.tokens == len(random_trace.sequences[1].tokens) - 1 and b.misses > 0
    assert b.tpot_ms == min(b.variants.values()) and b.schedule in b.variants
    # a speculative engine at the same expert budget gives its draft's bytes to slots: the same bound
    kw["expert_budget"] = 0.75
    spec, lru = sl.Engine(model, None, "specter", **kw), sl.Engine(model, None, "lru", **kw)
    assert spec.draft_bytes > 0 and sum(spec.split.slots_per_layer) < sum(lru.split.slots_per_layer)
    assert sl.bound(spec, random_trace.sequences[1]).tpot_ms == sl.bound(lru, random_trace.sequences[1]).tpot_ms


@pytest.mark.parametrize("slots", [2, 3, 5])
def test_its_eviction_is_beladys(model, bundled_trace, random_trace, slots):
    """Per-layer pools, every miss copied, Belady's initial set: the misses are analysis.belady_hits' (from an
    empty cache) less the compulsory fills of the initial set."""
    eng = sl.Engine(model, None, "lru", expert_budget=1.0)
    seq = random_trace.sequences[1]
    prob = _Problem.of(seq, eng.info, eng.cost, None)
    out = _simulate(prob, slots * eng.info.num_layers, "layer", "belady", "copy")
    want = 0
    for l, layer in enumerate(eng.info.layers):
        reqs = [set(int(e) for e in row[l, : layer.top_k]) for row in seq.decode]
        hits, total = belady_hits(reqs, min(slots, layer.num_experts), count_from=0)
        want += total - hits - min(slots, len(set().union(*reqs)))
    assert out.misses == out.copies == want


def test_x_of_bound_and_bad_input(model, random_trace):
    assert x_of_bound(2.0, 4.0) == 0.5 and math.isnan(x_of_bound(2.0, float("nan"))) and math.isnan(x_of_bound(1, 0))
    df = pd.DataFrame({"tpot_ms": [4.0, 0.0], "bound_tpot_ms": [3.0, 1.0]})
    col = bound_column(df)
    assert col.iloc[0] == 0.75 and math.isnan(col.iloc[1])
    eng = sl.Engine(model, None, "lru")
    with pytest.raises(TypeError, match="RoutedSequence"):
        sl.bound(eng, random_trace)
    seq = random_trace.sequences[0]
    other = RoutedSequence(seq.prompt, seq.tokens, seq.prefill, np.zeros((len(seq.tokens) - 1, 3, 2), np.int64))
    with pytest.raises(TraceError, match="2 MoE layers"):
        sl.bound(eng, other)
    short = RoutedSequence(seq.prompt, seq.tokens[:1], seq.prefill, seq.decode[:0])
    with pytest.raises(ValueError, match="fewer than 2"):
        sl.bound(eng, short)
    with pytest.raises(TypeError, match="RoutingTrace"):
        trace_bound(seq)


# ------------------------------------------------------------------------------ the analysis variants (issue 36)

def test_the_defaults_are_the_bound(model, random_trace, bundled_trace):
    """initial="clairvoyant", evict="belady" is the bound: its twelve schedules, the fastest kept, each the
    Belady-ranked simulation that tests/test_bound.py's other tests hold to the strategies and to belady_hits."""
    eng = sl.Engine(model, None, "lru", expert_budget=0.25, hardware="a100-40g-pcie4@compiled",
                    cost_shape="deepseek-v2-lite@full")
    seq = random_trace.sequences[1]
    b = sl.bound(eng, seq)
    assert sl.bound(eng, seq, initial="clairvoyant", evict="belady") == b
    prob = _Problem.of(seq, eng.info, eng.cost, None)
    want = {v: _simulate(prob, b.pool_slots, *v).tpot * 1e3 for v in VARIANTS}
    assert sorted(b.variants.values()) == sorted(want.values()) and b.tpot_ms == min(want.values())
    assert "clairvoyant" in b.assumptions and "eviction" not in b.schedule
    kw = dict(expert_budget=0.35, hardware="rtx4090-pcie4@compiled", cost_shape="deepseek-v2-lite@full")
    assert trace_bound(bundled_trace, initial="clairvoyant", evict="belady", **kw) == trace_bound(bundled_trace, **kw)


def _problems(model, random_trace, bundled_trace, budget):
    """(problem, pool slots, pool kind) of every sequence of both traces at ``budget`` (a100 compiled, DeepSeek-V2-Lite
    at full depth: copies dominate), for the tests that run the schedule's simulation directly."""
    for trace, m in ((random_trace, model), (bundled_trace, sl.load_model("tiny")[0])):
        eng = sl.Engine(m, None, "lru", expert_budget=budget, hardware="a100-40g-pcie4@compiled",
                        cost_shape="deepseek-v2-lite@full")
        slots = eng.split.budget_bytes // eng.cost.expert_bytes
        for seq in trace.sequences:
            prob = _Problem.of(seq, eng.info, eng.cost, None)
            for pool in POOLS:
                yield prob, slots, pool


@pytest.mark.parametrize("budget", [0.25, 0.35, 0.5])
def test_online_variants_never_miss_less_than_the_clairvoyant_schedule(model, random_trace, bundled_trace, budget):
    """Belady's eviction misses least (MIN) and its initial set (the first experts asked for) is MIN's best start:
    for every pool kind, with every miss copied, evict="lru"/"lfu_decay" and initial="prompt" miss at least as
    often, and they do change the schedule somewhere. TPOT is not compared per schedule: an eviction that misses
    more can free a slot sooner (reported with the option: it is an analysis, not a bound)."""
    changed = 0
    for prob, slots, pool in _problems(model, random_trace, bundled_trace, budget):
        best = _simulate(prob, slots, pool, "belady", "copy").misses
        for evict in ("lru", "lfu_decay"):
            online = _simulate(prob, slots, pool, "belady", "copy", evict=evict).misses
            assert online >= best, (pool, evict, online, best)
            changed += online > best
        prompt = _simulate(prob, slots, pool, "prompt", "copy").misses
        assert prompt >= best, (pool, prompt, best)
        changed += prompt > best
    assert changed > 0


def test_online_variants_through_the_public_options(model, bundled_trace):
    """The options reach the schedule, name themselves, and an online pool also handles a layer that streams
    (0.1: fewer slots per layer than its top-k)."""
    kw = dict(hardware="a100-40g-pcie4@compiled", cost_shape="deepseek-v2-lite@full")
    for budget in (0.1, 0.35):
        base = trace_bound(bundled_trace, expert_budget=budget, **kw)[0]
        for evict in ("lru", "lfu_decay"):
            r = trace_bound(bundled_trace, expert_budget=budget, evict=evict, **kw)[0]
            assert r.schedule.endswith(f"{evict} eviction") and f"{evict} eviction (online)" in r.assumptions
            assert len(r.variants) == len(VARIANTS) and r.pool_slots == base.pool_slots and r.misses >= 1
        p = trace_bound(bundled_trace, expert_budget=budget, initial="prompt", **kw)[0]
        assert "prompt initial set" in p.schedule and len(p.variants) == len(VARIANTS) // 2


def test_a_bad_variant_is_refused_before_any_work(model, random_trace):
    eng = sl.Engine(model, None, "lru")
    with pytest.raises(OptionError, match=r"evict='fifo'.*\['belady', 'lru', 'lfu', 'lfu_decay', 'arc'\]") as e:
        sl.bound(eng, random_trace.sequences[0], evict="fifo")
    assert e.value.argument == "evict" and e.value.found == "fifo" and isinstance(e.value, ValueError)
    with pytest.raises(OptionError, match=r"initial='oracle'.*\['clairvoyant', 'prompt'\]"):
        bound_of(eng.setup, eng.info, "not even a sequence", initial="oracle")
    with pytest.raises(OptionError, match="evict="):  # before the trace is looked at
        trace_bound(None, evict="LRU")


@pytest.mark.parametrize("budget", [0.25, 0.35])
def test_lead_only_delays_copies(model, random_trace, bundled_trace, budget):
    """With every miss copied and Belady's eviction the copies and victims do not depend on time, so limiting how
    early a copy may start (lead=) changes no miss and can only delay: TPOT(lead=0) >= TPOT(lead=3) >=
    TPOT(lead=math.inf: anywhere within the token) >= the bound's unlimited foresight, and somewhere strictly."""
    strict = 0
    for prob, slots, pool in _problems(model, random_trace, bundled_trace, budget):
        runs = [_simulate(prob, slots, pool, "belady", "copy", lead=lead) for lead in (0, 3, math.inf, None)]
        assert len({r.misses for r in runs}) == 1 and len({r.copies for r in runs}) == 1
        tpots = [r.tpot for r in runs]
        assert all(a >= b - 1e-12 for a, b in zip(tpots, tpots[1:])), (pool, tpots)
        strict += tpots[0] > tpots[-1] + 1e-9
    assert strict > 0


def test_lead_through_the_public_options(bundled_trace):
    """lead= names itself in the schedule and the assumptions, and refuses a bad value before any work."""
    kw = dict(expert_budget=0.35, hardware="a100-40g-pcie4@compiled", cost_shape="deepseek-v2-lite@full",
              evict="lfu_decay", initial="prompt")
    r = trace_bound(bundled_trace, lead=2, **kw)[0]
    assert r.schedule.endswith("lead 2") and "at most 2 layer(s) before the router asks, within the token" in \
        r.assumptions
    assert trace_bound(bundled_trace, lead=None, **kw) == trace_bound(bundled_trace, **kw)
    for bad in (-1, "2", True, float("nan"), -math.inf):
        with pytest.raises(OptionError, match="lead=") as e:
            trace_bound(None, lead=bad)
        assert e.value.argument == "lead"
