"""One way to assemble a run: typed strategies, the assembly's mechanism table, the schedule priced without
tensors, and global_lru (one LRU over a slot pool shared by every layer) as the proof that a strategy is cheap
to add."""

import dataclasses

import pytest

import specter_lab as sl
from conftest import hf_greedy
from specter_lab.run.assembly import make_schedule, make_store, miss_rule
from specter_lab.offload.clock import SimClock, make_clock
from specter_lab.offload.hostexec import BalancedMisses, CopyMisses, CostedMisses, HostMisses, ShareMisses
from specter_lab.pricing.profiles import PROFILES
from specter_lab.offload.schedule import ForwardInfo, counts_of
from specter_lab.run.strategies import EVICTION, MISS, POOL, PREFETCH, Strategy
from specter_lab.records.trace import Trace

IDS = [5, 6, 7, 8, 9, 10]
N = 16


# --------------------------------------------------------------------------------------------- typed strategies

@pytest.mark.parametrize("field, value", [("miss", "hots"), ("prefetch", "draftt"), ("eviction", "mru"),
                                          ("pool", "shared"), ("chunking", "sometimes"), ("k", 0), ("reuse", 0),
                                          ("cpu_share", 1.0), ("speculative", 1)])
def test_a_bad_mechanism_fails_when_the_strategy_is_built_naming_its_field(field, value):
    with pytest.raises((ValueError, TypeError), match=field):
        Strategy("x", **{field: value})
    with pytest.raises((ValueError, TypeError), match=field):
        sl.STRATEGIES["lru"].with_options(**{field: value})


def test_engine_overrides_are_checked_before_any_work(model):
    with pytest.raises(ValueError, match="cpu_share"):
        sl.Engine(model, None, "global_lru", cpu_share=2)
    with pytest.raises(TypeError, match="unknown"):
        sl.STRATEGIES["lru"].with_options(mis="host")


def test_every_mechanism_value_assembles_into_a_part(model):
    """Each value a Strategy field accepts maps to a part the assembly builds (no string left unread)."""
    info = sl.inspect_model(model)
    profile = PROFILES["rtx4090-pcie4"]
    cost = sl.Engine(model, None, "lru").cost
    rules = {"copy": CopyMisses, "host": HostMisses, "auto": CostedMisses, "balance": BalancedMisses}
    for miss in MISS:
        st = Strategy("x", miss=miss)
        store = make_store(st, info, [2] * info.num_layers, SimClock(profile), cost, Trace())
        assert isinstance(miss_rule(st, store), rules[miss])
    st = Strategy("x", cpu_share=0.25)
    assert isinstance(miss_rule(st, make_store(st, info, [2] * info.num_layers, SimClock(profile), cost, Trace())),
                      ShareMisses)
    for eviction in EVICTION:
        st = Strategy("x", eviction=eviction)
        assert make_store(st, info, [2] * info.num_layers, SimClock(profile), cost, Trace()).policy.name == eviction
    for pool in POOL:
        st = Strategy("x", pool=pool)
        assert make_store(st, info, [2] * info.num_layers, SimClock(profile), cost, Trace()).pool == pool
    for prefetch in PREFETCH:
        eng = sl.Engine(model, None, Strategy("x", speculative=prefetch != "gate", prefetch=prefetch, k=2),
                        cache_slots=3)
        run = eng.prepare(IDS, 2)
        assert run.parts.schedule.gate_lookahead == (prefetch == "gate")
        if prefetch in ("draft", "oracle"):
            assert run.speculation.prefetcher is not None
            assert type(run.speculation.source).__name__ == ("OracleForecast" if prefetch == "oracle"
                                                             else "DraftForecast")
        run.store.release()


def test_make_clock_resolves_hardware():
    assert not make_clock("rtx4090-pcie4").measured
    assert make_clock("a100-40g-pcie4@compiled").profile.execution == "compiled"
    with pytest.raises(ValueError, match="cuda"):
        make_clock("cuda")  # no GPU here: the error says so (skip-free: this machine has none)
    with pytest.raises(ValueError, match="not a known profile"):
        make_clock("rtx9999")


# --------------------------------------------------------------------------------------------- the schedule alone

def _forwards(live_routing):
    """Group the live run's moe.routing calls into forwards: (ForwardInfo fields, {layer: idx})."""
    out = []
    for fwd, layer, idx in live_routing:
        if not out or out[-1][0] is not fwd:
            out.append((fwd, {}))
        out[-1][1][layer] = idx
    return out


def _price_without_tensors(eng, live_routing):
    """Drive an autoregressive run's schedule from its routing alone: a tensorless store, no model, no hidden
    state; the model's own work priced as the decoder prices it."""
    st, cost, info = eng.strategy, eng.cost, eng.info
    clock, trace = SimClock(eng.profile), Trace(meta={}, level="full")
    store = make_store(st, info, eng.split.slots_per_layer, clock, cost, trace, materialize=False)
    schedule = make_schedule(st, info, store)
    for fwd0, routing in _forwards(live_routing):
        if fwd0.step != trace.step:
            trace.begin_step(fwd0.step)
        fwd = ForwardInfo(fwd0.step, fwd0.mode, fwd0.phase, fwd0.pos0)
        schedule.begin_forward()
        for layer in sorted(routing):
            idx = routing[layer]
            schedule.routed(fwd, layer, idx)
            schedule.layer(fwd, layer, counts_of(idx), idx.shape[0])
        trace.span(fwd.phase, -1, -1, schedule.model_span(cost.head_time(1)))
        if not st.keep:
            store.evict_all()
    return trace, store


@pytest.mark.parametrize("strategy", ["lru", "global_lru", "on_demand", "fiddler", "host_lru", "static_split"])
def test_a_layer_schedule_priced_from_routing_alone_gives_the_live_records(model, strategy):
    kw = dict(expert_budget=0.5) if sl.STRATEGIES[strategy].static else dict(cache_slots=3)
    eng = sl.Engine(model, None, strategy, **kw)
    run = eng.prepare(IDS, N)
    seen = []
    run.runtime.hooks["moe.routing"].append(lambda fwd, layer, idx: seen.append((fwd, layer, idx.copy())))
    before = len(run.trace.compute)
    run.execute()
    run.store.release()
    live = run.trace
    assert before == 0 and len(seen) == N * eng.info.num_layers
    priced, store = _price_without_tensors(eng, seen)
    assert store.device_bytes() == 0  # no tensor was made
    priced.finalize(store.clock)  # handles → ms, as the live trace was
    for name in ("cache_events", "transfers", "compute"):
        got = [dataclasses.astuple(r) for r in getattr(priced, name)]
        want = [dataclasses.astuple(r) for r in getattr(live, name)]
        assert got == want and (want or name == "transfers"), name


# --------------------------------------------------------------------------------------------- global_lru

def test_global_lru_is_lossless_on_the_bundled_model():
    model, tok = sl.load_model("tiny")
    ids = tok("def fib(n):")["input_ids"]
    ref = hf_greedy(model, ids, 24)
    for kw in (dict(expert_budget=0.35), dict(expert_budget=0.5), dict(expert_budget=0.35, cpu_share=0.3)):
        r = sl.Engine(model, tok, "global_lru", **kw).generate(ids, max_new_tokens=24)
        assert r.token_ids == ref, f"global_lru {kw} diverged from HF generate"
        assert (r.frames()["cache"].event == "evict").any()


def test_global_lru_moves_slots_to_the_layers_that_miss(model):
    """One pool: the total is the budget's, a miss takes the least recently used expert of any layer."""
    eng = sl.Engine(model, None, "global_lru", cache_slots=3)
    run = eng.prepare(IDS, N)
    total = sum(run.store.slots_per_layer)
    sizes = []
    run.runtime.hooks["moe.routing"].append(lambda fwd, layer, idx: sizes.append(run.store.slots_per_layer))
    run.execute()
    run.store.check_invariants()
    assert all(sum(s) == total for s in sizes)
    assert len({tuple(s) for s in sizes}) > 1, "no slot ever moved between layers"
    run.store.release()


def test_global_victim_is_the_least_recent_over_all_layers(model):
    info = sl.inspect_model(model)
    cost = sl.Engine(model, None, "lru").cost
    st = sl.STRATEGIES["global_lru"]
    store = make_store(st, info, [1] * info.num_layers, SimClock(PROFILES["rtx4090-pcie4"]), cost, Trace())
    for layer in range(info.num_layers):  # layer 0's expert is the oldest
        store.load(layer, 0, "demand")
    store.policy.touch((0, 0))  # ... until it is touched: now layer 1's is the oldest
    store.load(0, 5, "demand")
    assert store.resident(0) == {0, 5} and store.resident(1) == set()
    assert store.slots_per_layer[:2] == [2, 0]


def test_cpu_share_computes_that_share_of_misses_on_the_host(model):
    ids = IDS
    ref = hf_greedy(model, ids, 24)
    for share in (0.25, 0.5):
        r = sl.Engine(model, None, "global_lru", cache_slots=3, cpu_share=share).generate(ids, max_new_tokens=24)
        assert r.token_ids == ref
        ev = r.frames()["cache"]
        decode = ev[ev.step > 0]
        host, miss = (decode.event == "host").sum(), (decode.event == "miss").sum()
        assert miss > 8 and abs(host / miss - share) <= 1 / miss + 1e-9, (share, host, miss)
