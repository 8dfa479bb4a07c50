"""The cache simulator (caching/simulate.py) is held to the runtime's own store (offload/store.py + caching/policies.py,
driven by a replay): same hits and misses per layer, for every eviction policy the store has, per-layer and
global pools, on the bundled model's recorded trace and on an import made as local as DeepSeek-V2-Lite's. Then
its rules on small hand-checked sequences, and the stack-distance fast path against the simulator."""

from functools import partial

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.caching import policies
from specter_lab.caching.policies import LFU, ForecastBelady, NextUse
from specter_lab.caching.simulate import lru_stack_positions, simulate, stack_requests
from specter_lab.traces.locality import TARGET_HIT_AT_HALF

BUDGETS = (0.1, 0.25, 0.5)  # 3 slots of 32 a layer (top-4 streams through them), 8, 16


@pytest.fixture(scope="module")
def traces():
    """The bundled model's recorded trace, and an import of it made as local as DeepSeek-V2-Lite's."""
    model, tok = sl.load_model("tiny")
    rec = sl.record(model, tok, sl.heldout_prompts(2), max_new_tokens=40, k_max=0, progress=False)
    seqs = [np.concatenate([s.prefill, s.decode]) for s in rec.sequences]
    less = sl.less_local(seqs, TARGET_HIT_AT_HALF["deepseek-v2-lite-chat"], num_experts=32, seed=0)
    p, d = len(rec.sequences[0].prompt), len(rec.sequences[0].decode)
    imported = sl.import_routing(less.routing[0], rec.config, [(0, p, "prefill"), (p, d, "decode")], k_max=0)
    return {"recorded": rec, "deepseek-v2-lite-like": imported}


class _Now:
    """The current request, in the simulator's time (forward · layers + layer), read off the store's touches: every
    layer of a forward touches an expert, in layer order (shared by a store's per-layer policies)."""

    def __init__(self, layers: int) -> None:
        self.layers, self.t = layers, -1

    def touched(self, layer: int) -> None:
        t, last = divmod(self.t, self.layers) if self.t >= 0 else (-1, self.layers)
        self.t = (t + (layer < last)) * self.layers + layer


class _OracleEviction(ForecastBelady):
    """The store's ``forecast`` eviction given a perfect forecast: each key's true next request after the current
    one (``now``; a victim is chosen before its layer's first touch, but then only experts the layer needs, which
    are protected, are asked for at that time)."""

    def __init__(self, uses: NextUse, now: _Now, *args, **kw) -> None:
        super().__init__()
        self.uses, self.now = uses, now
        self.forecast = self

    def follow(self, forecast) -> None:  # keep the oracle (a run's end calls follow(None))
        pass

    def touch(self, key, now=0) -> None:
        self.now.touched(key[0])
        super().touch(key, now)

    def next_use(self, layer: int, expert: int) -> float:
        return self.uses.after((layer, expert), self.now.t)


def _requests(seq, layers: int) -> np.ndarray:
    """The requests a replay of ``seq`` makes: the prefill (one forward: the union of its experts), then each
    decode forward."""
    per_layer = [[set(seq.prefill[:, l].ravel().tolist()) - {-1}]
                 + [set(row[l].tolist()) - {-1} for row in seq.decode] for l in range(layers)]
    return stack_requests(per_layer)


def _store_run(trace, seq_index: int, strategy: str, eviction: str, budget: float):
    """Replay one sequence with the store's own eviction (prefetch off): per-layer hits and misses, and the
    slots per layer it had."""
    (result,) = sl.replay(trace, strategy, expert_budget=budget, eviction=eviction, sequences=[seq_index])
    assert result.config["strategy"].prefetch == "none"
    ce = result.trace.frames()["cache"]
    L = trace.num_layers
    count = {ev: ce[ce.event == ev].groupby("layer").size().reindex(range(L), fill_value=0).to_numpy()
             for ev in ("hit", "miss")}
    return count["hit"], count["miss"], list(result.config["split"].slots_per_layer)


# the store's eviction policies (every online one of caching/policies.py) and the simulator's that stands for each
POLICY_PAIRS = [("lru", "lru"), ("lfu", "lfu"), ("lfu_decay", "lfu_decay"), ("arc", "arc"), ("forecast", "belady")]


@pytest.mark.parametrize("which", ["recorded", "deepseek-v2-lite-like"])
@pytest.mark.parametrize("eviction,policy", POLICY_PAIRS)
@pytest.mark.parametrize("strategy,pool", [("lru", "layer"), ("global_lru", "global")])
def test_the_simulator_hits_what_the_store_hits(traces, which, eviction, policy, strategy, pool, monkeypatch):
    assert set(policies.ONLINE) == {e for e, _ in POLICY_PAIRS}, "a store policy the simulator is not held to"
    trace = traces[which]
    layers = trace.num_layers
    rates, evictions, unlike_lru = [], 0, 0
    for i in range(len(trace.sequences)):
        routing = _requests(trace.sequences[i], layers)
        for budget in BUDGETS:
            if eviction == "forecast":  # the store's make_policy builds this run's policy from POLICIES
                monkeypatch.setitem(policies.POLICIES, "forecast", partial(_OracleEviction, NextUse.of(routing.tolist()),
                                                                          _Now(layers)))
            hits, misses, slots = _store_run(trace, i, strategy, eviction, budget)
            sim = simulate(routing, slots if pool == "layer" else sum(slots), policy=policy, pool=pool)
            what = f"{which} seq {i} budget {budget}: {strategy}/{eviction}"
            assert sim.hits.tolist() == hits.tolist() and sim.misses.tolist() == misses.tolist(), what
            rates.append(sim.hit_rate)
            evictions += int((sim.loads - sim.fills).sum())
            lru = simulate(routing, slots if pool == "layer" else sum(slots), pool=pool)
            unlike_lru += int(sim.hits.tolist() != lru.hits.tolist())
    assert max(rates) > 0 and min(rates) < 1 and evictions > 0  # the budgets made the caches choose
    assert (unlike_lru > 0) == (policy != "lru")  # LFU and the oracle forecast really rank otherwise


# ------------------------------------------------------------------------------------------ the rules, by hand

def _one_layer(*tokens) -> np.ndarray:
    return stack_requests([[set(t) for t in tokens]])


def test_the_store_rule_never_evicts_an_expert_the_token_needs():
    # 2 slots hold {0, 1}, 0 least recent; token (2, 0): the miss 2 evicts 1, not the needed 0
    s = simulate(_one_layer({0}, {1}, {2, 0}, {0}), 2)
    assert s.hits.tolist() == [2] and s.loads.tolist() == [3]
    # 1 slot, token of 3: two stream through; the last streamed (ascending order) stays
    s = simulate(_one_layer({5, 6, 7}, {7}), 1)
    assert s.hits.tolist() == [1] and s.fills.tolist() == [1]


def test_lfu_counts_uses_not_loads_and_breaks_ties_by_recency():
    # 0 used 3 times, 1 once, then 2 once: a miss evicts the least used (1 and 2 tie at one use: 1 is older)
    s = simulate(_one_layer({0}, {0}, {1}, {0}, {2}, {3}, {0}, {2}, {1}), 3, policy="lfu")
    # 3 evicts 1 (count 1, older than 2); then 0 hit, 2 hit, 1 miss
    assert s.hits.tolist() == [4]
    pol = LFU(2)
    for k in ((0, 1), (0, 2)):
        pol.loaded(k, 0)
    assert pol.victim((), 0) == (0, 1)  # no uses yet: the least recently loaded
    pol.touch((0, 1), 1)
    assert pol.victim((), 1) == (0, 2) and pol.victim({(0, 2)}, 1) == (0, 1)


def test_belady_is_optimal_on_a_cyclic_sequence_where_lru_gets_nothing():
    cyc = _one_layer(*[{e} for e in [0, 1, 2] * 4])
    assert simulate(cyc, 2).hits.tolist() == [0]
    assert simulate(cyc, 2, policy="belady").hits.tolist() == [5]  # MIN: 12 requests, 3 cold, one miss per 2


def test_static_keeps_its_set_and_sends_the_rest_elsewhere():
    s = simulate(_one_layer({0, 1}, {1, 2}, {2, 3}), 2, policy="static", initial={0: [0, 1]})
    assert s.hits.tolist() == [3] and s.bypassed.tolist() == [3] and s.loads.tolist() == [0]
    assert s.bypass_steps.tolist() == [2]


def test_a_global_pool_evicts_across_layers():
    # layer 0 uses 0, then layer 1 uses 0 and 1: with 2 slots in all, layer 0's expert goes
    r = stack_requests([[{0}, set(), {0}], [{0}, {1}, set()]])
    assert simulate(r, 2, pool="global").hits.tolist() == [0, 0]
    assert simulate(r, 2, pool="layer").hits.tolist() == [1, 0]


def test_admission_refused_is_computed_elsewhere():
    s = simulate(_one_layer({0}, {0}, {1}), 2, admit=lambda l, e, t, free: e != 0)
    assert s.bypassed.tolist() == [2] and s.hits.tolist() == [0] and s.bypass_steps.tolist() == [2]


@pytest.mark.parametrize("cold", ["fit", "miss"])
def test_the_stack_positions_are_the_moe_lrc_simulation_at_every_size(cold):
    rng = np.random.default_rng(4)
    a = np.argsort(rng.random((50, 3, 12)), axis=-1)[..., :4]
    a[1::3] = a[::3][: len(a[1::3])]  # some reuse
    a[rng.random(a.shape) < 0.1] = -1
    pos = lru_stack_positions(a, np.array([12, 12, 12]), cold)
    for slots in (1, 2, 3, 4, 6, 12):
        s = simulate(a, slots, rule="moe-lrc")
        warm_hits = ((pos >= 0) & (pos < slots)).sum((0, 2))
        want = s.hits + s.fills if cold == "fit" else s.hits
        assert warm_hits.tolist() == want.tolist(), slots


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="routing"):
        simulate(np.zeros((3, 2)), 2)
    with pytest.raises(ValueError, match="policy="):
        simulate(np.zeros((3, 2, 1), dtype=int), 2, policy="mru")
    with pytest.raises(ValueError, match="rule="):
        simulate(np.zeros((3, 2, 1), dtype=int), 2, rule="fifo")
    with pytest.raises(ValueError, match="slots"):
        simulate(np.zeros((3, 2, 1), dtype=int), [1, 2, 3])
