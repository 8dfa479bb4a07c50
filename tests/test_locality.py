"""The per-layer LRU hit curve counts like moe-lrc (checked against a plain stack-distance reference and against
the runtime's LRU where they must agree), and less_local lands on a real model's locality."""

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.analysis.cache_bounds import lru_hits
from specter_lab.traces.locality import TARGET_HIT_AT_HALF, less_local, lru_hit_curve


def _reference(seq, capacity, cold):
    """moe-lrc's calc_lru for one layer, written plainly: a recency list, a token's lookups before its update."""
    recency, hits, lookups = [], 0, 0  # most recent first
    for token in seq:
        token = [int(e) for e in token if e >= 0]
        seen_before = len(recency)
        new = 0
        for e in token:
            lookups += 1
            if e in recency:
                hits += recency.index(e) < capacity
            else:
                hits += cold == "fit" and seen_before + new < capacity
                new += 1
        for e in token:  # later slots are more recent
            if e in recency:
                recency.remove(e)
            recency.insert(0, e)
    return hits, lookups


def _random(T, L, E, k, seed, holes=0.0, sticky=0.0):
    rng = np.random.default_rng(seed)
    a = np.argsort(rng.random((T, L, E)), axis=-1)[..., :k]
    for t in range(1, T):  # some locality: keep a token's experts from the previous one
        keep = rng.random((L, 1)) < sticky
        a[t] = np.where(keep, a[t - 1], a[t])
    a[rng.random(a.shape) < holes] = -1
    return a


@pytest.mark.parametrize("cold", ["fit", "miss"])
def test_the_curve_is_moe_lrc_counting_per_layer(cold):
    seqs = [_random(60, 3, 16, 4, seed, holes=0.1, sticky=0.5) for seed in (0, 1)]
    got = lru_hit_curve(seqs, (0.25, 0.5, 1.0), num_experts=16, cold=cold, per_layer=True)
    for f, slots in ((0.25, 4), (0.5, 8), (1.0, 16)):
        for layer in range(3):
            h = n = 0
            for s in seqs:
                dh, dn = _reference(s[:, layer], slots, cold)
                h, n = h + dh, n + dn
            assert got[f][layer] == pytest.approx(h / n)
    assert lru_hit_curve(seqs, (1.0,), num_experts=16, cold="fit")[1.0] == pytest.approx(1.0)


def test_top_1_agrees_with_the_runtime_lru():
    """With one expert per token the runtime's LRU (analysis.lru_hits: cold misses) is the stack LRU."""
    a = _random(80, 2, 8, 1, seed=5, sticky=0.4)
    got = lru_hit_curve(a, (0.25, 0.5), num_experts=8, cold="miss", per_layer=True)
    for f, slots in ((0.25, 2), (0.5, 4)):
        for layer in range(2):
            h, n = lru_hits([{int(e)} for e in a[:, layer, 0]], slots, count_from=0)
            assert got[f][layer] == pytest.approx(h / n)


@pytest.fixture(scope="module")
def bundled_routing():
    model, tok = sl.load_model("tiny")
    trace = sl.record(model, tok, sl.heldout_prompts(4), max_new_tokens=64, k_max=0, progress=False)
    return [np.concatenate([s.prefill, s.decode]) for s in trace.sequences], trace


def test_the_bundled_model_is_as_local_as_the_research_note_says(bundled_routing):
    seqs, _ = bundled_routing
    curve = lru_hit_curve(seqs, (0.34, 0.5), num_experts=32)
    assert curve[0.5] == pytest.approx(0.83, abs=0.03)  # routing_locality.md: 0.83 at 16/32, 0.67 at 11/32
    assert curve[0.34] == pytest.approx(0.67, abs=0.03)


@pytest.mark.parametrize("model_name", sorted(TARGET_HIT_AT_HALF))
def test_less_local_lands_on_a_real_models_locality(bundled_routing, model_name):
    seqs, trace = bundled_routing
    target = TARGET_HIT_AT_HALF[model_name]
    out = less_local(seqs, target, num_experts=32, seed=0)
    assert lru_hit_curve(out.routing, (0.5,), num_experts=32)[0.5] == pytest.approx(target, abs=0.02)
    assert out.hit_rate == pytest.approx(target, abs=0.02) and 0 < out.q < 1
    for src, new in zip(seqs, out.routing):
        assert new.shape == src.shape and new.dtype == src.dtype
        assert ((new >= 0) & (new < 32)).all()
        s = np.sort(new, axis=-1)
        assert (s[..., 1:] != s[..., :-1]).all(), "a token routes to one expert twice"
        changed = (new != src).mean()
        assert changed == pytest.approx(out.q, abs=0.05)  # each slot replaced with probability q
    # imported, a replayed LRU run sees the lower locality too (its own warm-up and counting differ)
    imported = sl.import_routing(out.routing[0], trace.config, [(0, len(trace.sequences[0].prompt), "prefill"),
                                 (len(trace.sequences[0].prompt), len(trace.sequences[0].decode), "decode")],
                                 k_max=0)
    before = sl.replay(trace, "lru", expert_budget=0.5, sequences=[0])[0].metrics["hit_rate"]
    after = sl.replay(imported, "lru", expert_budget=0.5)[0].metrics["hit_rate"]
    assert after < before - 0.05


def test_less_local_refuses_what_it_cannot_reach(bundled_routing):
    seqs, _ = bundled_routing
    with pytest.raises(ValueError, match="only lowers locality"):
        less_local(seqs, 0.95, num_experts=32)
    with pytest.raises(ValueError, match="replacing every expert"):
        less_local(seqs, 0.05, num_experts=32)
    with pytest.raises(ValueError, match="integer array"):
        lru_hit_curve(np.zeros((3, 2, 2)), num_experts=4)
    with pytest.raises(ValueError, match="fractions"):
        lru_hit_curve(seqs, (0.0,), num_experts=32)
    a = less_local(seqs[0], 0.72, num_experts=32, seed=1)
    b = less_local(seqs[0], 0.61, num_experts=32, seed=1)
    assert a.q < b.q and isinstance(a.routing, np.ndarray)
