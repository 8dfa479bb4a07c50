"""The K governor (k="auto"): its distinct-experts curve and its stop rule, on routing built here."""

from __future__ import annotations

import numpy as np
import pytest

from specter_lab.predict import KGovernor, distinct_experts_curve


def _history(rng, n_tokens, layers=3, experts=32, top_k=4):
    return [[rng.choice(experts, size=top_k, replace=False) for _ in range(layers)] for _ in range(n_tokens)]


def test_curve_of_uniform_routing_matches_the_closed_form():
    rng = np.random.default_rng(0)
    E, k = 32, 4
    curve = distinct_experts_curve(_history(rng, 2000, experts=E, top_k=k), 12)
    for n in (1, 2, 4, 8, 12):
        expected = E * (1 - (1 - k / E) ** n)  # each expert is missed by n independent top-k draws
        assert curve[n] == pytest.approx(np.full(3, expected), rel=0.03), n
    assert curve[0].sum() == 0 and np.all(np.diff(curve, axis=0) >= 0)


def test_curve_of_repeated_routing_is_flat():
    same = [[np.array([1, 2, 3, 4])] * 2 for _ in range(50)]
    curve = distinct_experts_curve(same, 16)
    assert np.all(curve[1:] == 4)


def test_curve_beyond_the_history_reuses_the_longest_window():
    rng = np.random.default_rng(1)
    curve = distinct_experts_curve(_history(rng, 5), 9)
    assert np.all(curve[6:] == curve[5])


def _governor(history, alpha):
    g = KGovernor(alpha=alpha, optimism=0.0)  # the cost model alone, no exploration bonus
    layers = len(history[0])
    g.observe_routing([np.stack([tok[l] for tok in history]) for l in range(layers)], len(history))
    return g


def test_governor_drafts_long_when_routing_repeats_and_short_when_every_token_brings_new_experts():
    rng = np.random.default_rng(2)
    t_draft, t_verify, t_copy = 1.0, 2.0, 0.7
    # Repeating routing and a draft that is nearly always right: a longer window adds no copies, so
    # amortising verification and the copies over more tokens wins up to k_max.
    flat = [[np.array([1, 2, 3, 4])] * 3 for _ in range(64)]
    assert _governor(flat, 0.98).best_k(1, t_draft, t_verify, t_copy, uncovered_now=6) == 16
    # At acceptance 0.9 the expected gain of the k-th token (0.9^k) falls below its draft cost first.
    k90 = _governor(flat, 0.9).best_k(1, t_draft, t_verify, t_copy, uncovered_now=6)
    assert 4 <= k90 < 16
    # Fresh experts every token over 256 experts, all of them copies: each drafted token costs ~4 copies per
    # layer, more than the token is worth at acceptance 0.5.
    fresh = _governor(_history(rng, 64, experts=256), 0.9)
    assert fresh.best_k(1, t_draft, t_verify, t_copy, uncovered_now=12) == 1
    # The same routing with no copies at all (everything resident) drafts longer again.
    assert fresh.best_k(1, t_draft, t_verify, t_copy, 0, miss_fraction=0.0) > 2


def test_governor_keeps_only_committed_rows_and_a_bounded_history():
    g = KGovernor(history=10)
    rows = [np.arange(8).reshape(4, 2) for _ in range(2)]  # 4 positions, 2 layers
    g.observe_routing(rows, committed=3)
    assert len(g._hist) == 3
    for _ in range(5):
        g.observe_routing(rows, committed=4)
    assert len(g._hist) == 10
    assert g._curve is not None and g._curve.shape == (g.k_max + 2, 2)


def test_governor_without_history_drafts_the_papers_k():
    g = KGovernor()
    assert [g.keep_drafting(j, 1.0, 2.0, 0.7, 5) for j in (1, 7, 8)] == [True, True, False]


def test_depth_acceptance_sees_bursts_that_one_rate_misses():
    """Half the windows fail at once, half accept all 8: after the first token the draft is always right. The
    per-depth model predicts the true mean yield of a K=8 window (5 tokens); a geometric model with the pooled
    per-token rate does not."""
    g = KGovernor(prior=0.5, decay=1.0, optimism=0.0)
    for _ in range(20):
        g.update_acceptance(0, 8)
        g.update_acceptance(8, 8)
    a = g.depth_acceptance()
    assert a[1] == pytest.approx(0.5, abs=0.05)
    assert np.all(a[2:9] > 0.95)
    pooled = 8 * 20 / (8 * 20 + 20)  # accepted / (accepted + failures) over all windows
    geometric = sum(pooled ** i for i in range(9))
    true_mean = (1 + 9) / 2  # 1 token (the correction) or 8 accepted + the bonus
    assert g.expected_tokens(8) == pytest.approx(true_mean, abs=0.2)
    assert abs(geometric - true_mean) > 0.8


def test_every_nth_window_explores_and_exposure_is_measured():
    g = KGovernor(k_max=6, explore_every=3)
    g.observe_routing([np.arange(8).reshape(4, 2)] * 2, committed=4)
    # Every token routes to 2 new experts per layer, each a 100 s copy: the model says "stop at once".
    costly = dict(t_draft=1.0, t_verify=1.0, t_copy=100.0, uncovered_now=0)
    seen = []
    for _ in range(6):
        g.begin_window()
        seen.append(g.keep_drafting(1, costly["t_draft"], costly["t_verify"], costly["t_copy"],
                                    costly["uncovered_now"]))
        assert g.keep_drafting(6, 1.0, 1.0, 1.0, 0) is False  # never beyond k_max
    assert seen == [False, False, True, False, False, True]  # every 3rd window explores
    g.observe_exposure(copies=10, stall=3.5, t_copy=1.0)
    assert g.exposure == pytest.approx(0.7 * 1.0 + 0.3 * 0.35)
    g.observe_exposure(copies=0, stall=1.0, t_copy=1.0)  # nothing copied: nothing learnt
    assert g.exposure == pytest.approx(0.805)


def test_exploring_windows_stop_where_the_next_token_is_rarely_reached():
    """An exploring window measures deep acceptance only if the tokens before were accepted: with a weak draft it
    stops where the next token is reached with less than ``explore_reach`` chance; with a strong one it goes on to
    k_max (``explore_reach=0``: always to k_max)."""

    def explored(alpha: float, **kw) -> int:
        g = KGovernor(k_max=16, explore_every=1, alpha=alpha, **kw)
        g.observe_routing([np.arange(8).reshape(4, 2)] * 2, committed=4)
        g.begin_window()
        assert g.exploring
        j = 1
        while g.keep_drafting(j, t_draft=1.0, t_verify=1.0, t_copy=100.0, uncovered_now=0):
            j += 1
        return j

    assert explored(0.73) == 5  # 0.73^4 = 0.28 reaches token 5, 0.73^5 = 0.21 not token 6
    assert explored(0.95) == 16  # 0.95^15 = 0.46
    assert explored(0.73, explore_reach=0.0) == 16
    g = KGovernor(alpha=0.5)
    assert g.reach_chance(1) == 1.0 and g.reach_chance(3) == pytest.approx(0.25)


def test_engine_keeps_one_governor_across_generate_calls():
    import specter_lab as sl

    model = sl.tiny_random_model("qwen2_moe", seed=3)
    eng = sl.Engine(model, None, "specter", cache_slots=3, k="auto")
    eng.generate([5, 6, 7, 8], max_new_tokens=10)
    g = eng.governor
    assert g is not None and g._windows >= 1 and g._reach[1] > 0
    before = g._windows
    eng.generate([9, 10, 11], max_new_tokens=10)
    assert eng.governor is g and g._windows > before
    assert sl.Engine(model, None, "specter", cache_slots=3, k=4).governor is None


def test_optimism_is_large_where_unmeasured_and_fades_with_evidence():
    g = KGovernor(alpha=0.7, optimism=0.2, decay=1.0)
    for _ in range(30):
        g.update_acceptance(1, 2)  # depth 1 accepted, depth 2 rejected: nothing seen beyond depth 2
    a = g.depth_acceptance()
    assert a[1] > 0.95 and a[2] < 0.15  # measured depths: the bonus has faded (0.2 / sqrt(32) = 0.035)
    # never reached: the pooled rate plus the full bonus, 0.2 / sqrt(prior)
    assert a[3:] == pytest.approx(np.full(len(a) - 3, g.alpha + 0.2 / np.sqrt(g.prior)))
    plain = KGovernor(alpha=0.7, optimism=0.0, decay=1.0)
    for _ in range(30):
        plain.update_acceptance(1, 2)
    assert np.all(plain.depth_acceptance()[3:] < a[3:])


def test_copies_still_in_flight_are_uncovered_for_the_governor(monkeypatch):
    """The governor prices the copies a window still needs. A copy the prefetcher issued while drafting is link
    time the window pays for until it lands: counted as resident, a forecast the prefetcher had copied looked
    covered (half the windows of this copy-bound replay saw nothing uncovered), its copies free."""
    import specter_lab as sl
    from conftest import COPY_BOUND, bundled_routing

    rows, config, segs = bundled_routing(1, 24)
    trace = sl.import_routing(rows, config, segs, draft_bits=4)
    seen = []
    keep = KGovernor.keep_drafting

    def spy(self, j, t_draft, t_verify, t_copy, uncovered_now, miss_fraction=1.0):
        seen.append((uncovered_now, miss_fraction))
        return keep(self, j, t_draft, t_verify, t_copy, uncovered_now, miss_fraction)

    monkeypatch.setattr(KGovernor, "keep_drafting", spy)
    sl.replay(trace, "specter_split", **{**COPY_BOUND, "expert_budget": 0.5}, draft=sl.QuantSpec(4, 64))
    assert len(seen) >= 4
    # a copy takes more than two layers here: after every draft step some of its copies are still on the link
    # (counted as resident, half the windows saw none uncovered)
    assert all(u > 0 for u, _ in seen), seen
    assert all(0 <= m <= 1 for _, m in seen)


def _timed(g: KGovernor, times: dict[int, list[float]]) -> None:
    for k, seconds in times.items():
        for s in seconds:
            g.observe_time(k, s)


def test_measured_rule_drafts_the_k_with_least_time_per_expected_token():
    """After ``measured_after`` windows each window drafts the measured K with the least window time over
    E[tokens](K); a K seen in fewer than ``min_arm`` windows is not trusted, however fast it looked."""
    g = KGovernor(alpha=0.9, prior=1e6, decay=1.0, measured_after=2, explore_every=0, min_arm=1.5, extrapolate=False)
    # E = 1.9, 2.71, 4.10 tokens: 5.3, 4.4 and 7.3 s a token
    _timed(g, {1: [10.0] * 3, 2: [12.0] * 3, 4: [30.0] * 3, 3: [1.0]})
    targets = []
    for _ in range(4):
        g.begin_window()
        targets.append(g.target)
    assert targets == [None, None, 2, 2]  # the first two windows are priced
    assert [g.early(j) for j in (1, 2)] == [True, False]  # the window drafts exactly its K
    _timed(g, {3: [1.0]})  # now measured twice, and cheapest by far
    g.begin_window()
    assert g.target == 3


def test_measured_rule_explores_the_neighbours_in_turn_and_follows_a_change():
    g = KGovernor(alpha=0.9, prior=1e6, decay=0.9, measured_after=1, explore_every=2, extrapolate=False)
    _timed(g, {1: [10.0] * 3, 2: [12.0] * 3, 3: [20.0] * 3})
    targets = []
    for _ in range(5):
        g.begin_window()
        targets.append(g.target)
    assert targets == [None, 1, 2, 3, 2]  # windows 2 and 4 explore: K - 1, then K + 1
    # the link got faster for longer windows: K = 3's recent windows are cheap, and decay lets them win
    _timed(g, {3: [8.0] * 6})
    g.begin_window()
    assert g.exploring and g.target == 2  # window 6 explores below K = 3
    g.begin_window()
    assert g.target == 3


@pytest.mark.parametrize("best, explored", [(1, [2, 2]), (16, [12, 12]), (8, [6, 10])])
def test_exploring_steps_a_quarter_of_k_and_stays_within_range(best, explored):
    """At long K a neighbour one token away differs by less than the noise, so an exploring window tries K ± K//4;
    where one side is out of [k_min, k_max] it tries the other."""
    g = KGovernor(alpha=0.9, prior=1e6, decay=1.0, measured_after=1, explore_every=2, extrapolate=False)
    _timed(g, {best: [1.0] * 3, 4: [50.0] * 3})
    seen = []
    for _ in range(5):
        g.begin_window()
        if g.exploring:
            seen.append(g.target)
        else:
            assert g._windows == 1 or g.target == best
    assert seen == explored


def test_extrapolation_jumps_to_the_long_k_the_measured_ones_point_to():
    """Windows of 2 and 4 drafts took 10 and 12 s (8 s a window plus 1 s a draft token) and the draft is nearly
    always right: on that line a 16-token window gives the least time per token, so the next window drafts 16,
    unmeasured, instead of climbing there a neighbour at a time. Without ``extrapolate`` only 2 and 4 count."""
    times = {2: [10.0] * 2, 4: [12.0] * 2}
    g = KGovernor(alpha=0.98, prior=1e6, decay=1.0, measured_after=1, explore_every=0)
    _timed(g, times)
    ks = np.arange(2, 17)
    assert g.measured_k() == int(ks[np.argmin((8.0 + ks) / g._expected()[ks])]) == 16
    plain = KGovernor(alpha=0.98, prior=1e6, decay=1.0, measured_after=1, explore_every=0, extrapolate=False)
    _timed(plain, times)
    assert plain.measured_k() == 4
    # A line falling with K (noise, or a cache warming up) never makes a long window cheaper than the measured ones.
    falling = KGovernor(alpha=0.5, prior=1e6, decay=1.0, measured_after=1, explore_every=0)
    _timed(falling, {2: [10.0], 3: [9.0]})
    assert falling.measured_k() in (2, 3)


def test_a_replay_drafts_the_measured_k_and_plans_its_copies_for_it(monkeypatch):
    """In a run, windows time themselves on the clock; once the measured rule chooses a window's K, the window
    drafts that many tokens and the prefetcher plans its copies for that many, not for ``k_max``."""
    import specter_lab as sl
    from conftest import COPY_BOUND, bundled_routing
    from specter_lab.predict import LookaheadPrefetcher

    rows, config, segs = bundled_routing(1, 64)
    trace = sl.import_routing(rows, config, segs, draft_bits=4)
    planned, windows = [], []
    plan, observe = LookaheadPrefetcher.begin_window, KGovernor.observe

    def spy_plan(self, k):
        planned.append(k)
        return plan(self, k)

    def spy_observe(self, w):
        windows.append((self.target, w.drafted, w.elapsed))
        return observe(self, w)

    monkeypatch.setattr(LookaheadPrefetcher, "begin_window", spy_plan)
    monkeypatch.setattr(KGovernor, "observe", spy_observe)
    run, = sl.replay(trace, "specter_split", **{**COPY_BOUND, "expert_budget": 0.5}, draft=sl.QuantSpec(4, 64))
    assert len(windows) == len(planned) > KGovernor().measured_after
    assert all(e is not None and e > 0 for _, _, e in windows)
    chosen = [(t, d, k) for (t, d, _), k in zip(windows, planned) if t is not None]
    assert chosen, "the measured rule never chose a window's K"
    # the last window may be cut short by max_new_tokens
    assert all(d == t and k == t for t, d, k in chosen[:-1]), chosen
    assert run.metrics["new_tokens"] > 0
