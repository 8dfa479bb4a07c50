"""Routing recorded on demand (analysis/lazy_record.py) is what ``sl.record`` writes, whatever order the window
starts and lengths are asked in; and a live sweep whose cells replay it (studies/calibration.py, the planner's
calibration) gives every cell's metrics exactly as running the cell live does."""

import random

import numpy as np
import pandas as pd
import pytest
import torch

import specter_lab as sl
from specter_lab.analysis.lazy_record import _Drafter as LazyDrafter
from specter_lab.analysis.lazy_record import record_on_demand
from specter_lab.studies.calibration import ReplayedLiveSource
from specter_lab.studies.runs import Cell, LiveSource, run_prompts

PROMPTS = [[5, 6, 7, 8, 9, 10], [17, 3, 99, 42, 42, 7, 200, 11]]
N = 12
SPEC = sl.QuantSpec(4, 64)


def test_chains_drafted_on_demand_are_the_recorded_ones(model):
    full = sl.record(model, None, PROMPTS, max_new_tokens=N, k_max=16, draft=SPEC, progress=False)
    base, traces = record_on_demand(model, None, PROMPTS, max_new_tokens=N, drafts=[SPEC], k_max=16)
    lazy = traces[SPEC]
    assert lazy.speculative and lazy.gated and not base.speculative
    rng = random.Random(0)
    for fs, ls in zip(full.sequences, lazy.sequences):
        for name in ("prompt", "tokens", "prefill", "decode", "gate"):
            assert np.array_equal(getattr(fs, name), getattr(ls, name)), name
        W = len(fs.tokens) - 1
        # window starts out of order, chains extended and shortened, verifications of every length
        for w, n in [(rng.randrange(W), rng.randint(1, 16)) for _ in range(60)] + [(0, 16), (W - 1, 3)]:
            d, r = ls.drafts(w, n)
            assert np.array_equal(d[:n], fs.draft_tokens[w, :n]) and np.array_equal(r[:n], fs.draft_routing[w, :n])
            vr, vt = ls.verification(w, n + 1)
            assert np.array_equal(vr[: n + 1], fs.verify_routing[w, : n + 1])
            assert np.array_equal(vt[: n + 1], fs.verify_tokens[w, : n + 1])


@pytest.mark.parametrize("strategy, opts", [
    ("lru", {}), ("pregate_split", {}), ("split_lfu", {}),
    ("specter", {"draft": sl.QuantSpec(4, 64), "k": 4}), ("specter_split", {"draft": sl.QuantSpec(4, 64), "k": "auto"}),
    ("specter_plus", {"draft": sl.QuantSpec(3, 64), "k": 2}),
    ("specter_plus", {"draft": "resident", "k": 4}),  # cache-dependent: live
])
def test_replayed_calibration_gives_the_live_metrics(model, strategy, opts):
    cell = Cell.of(strategy, expert_budget=0.5, hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite", **opts)
    live = LiveSource(model, None, PROMPTS, N).run(cell)
    source = ReplayedLiveSource(model, None, PROMPTS, N)
    replayed = source.run(cell)
    assert source.replays(source.engine(cell)) == (opts.get("draft") != "resident")
    for a, b in zip(live.metrics, replayed.metrics):
        for key in ("tpot_ms", "hit_rate", "stall_ms_per_token", "acceptance_rate", "recall", "mean_k",
                    "h2d_bytes_per_token", "slots_per_layer", "draft_bytes"):
            x, y = a.get(key), b.get(key)
            assert x == y or (isinstance(x, float) and np.isnan(x) and np.isnan(y)), (key, x, y)


@pytest.mark.parametrize("strategy", ["mixtral_offloading", "specter"])
def test_an_engine_that_ignores_eos_replays_its_fixed_length(model, strategy):
    """The paper benches' engines (a fixed output length, EOS ignored; studies/reproduce.py): replayed from a
    recording that runs past EOS, the live figures."""
    eng = sl.Engine(model, None, strategy, cache_slots=3, k=8 if strategy == "specter" else None, ignore_eos=True,
                    hardware="a100-40g-pcie4", cost_shape="deepseek-v2-lite@full")
    source = ReplayedLiveSource(model, None, PROMPTS, N)
    assert source.replays(eng)
    replayed = source.run_engine(eng)
    for a, b in zip(run_prompts(eng, PROMPTS, N).metrics, replayed.metrics):
        assert a["new_tokens"] == b["new_tokens"] == N
        for key in ("tpot_ms", "tpot_ms_artifact", "hit_rate", "acceptance_rate", "first_commit_tokens"):
            x, y = a[key], b[key]
            assert x == y or (isinstance(x, float) and np.isnan(x) and np.isnan(y)), (key, x, y)


def test_chains_kept_by_one_drafter_are_read_and_extended_by_the_next_as_recorded(model):
    """A later sweep's drafters start from the chains an earlier one drafted (studies/calibration.py keeps them):
    what is held costs no forward, and what is asked beyond it is drafted again from the window's start, the same
    tokens and routing ``sl.record`` writes."""
    prompts = [[9, 8, 7, 6, 5], [31, 4, 15, 9, 26, 5]]
    full = sl.record(model, None, prompts, max_new_tokens=N, k_max=16, draft=SPEC, progress=False)
    kept: dict = {}
    base, first = record_on_demand(model, None, prompts, max_new_tokens=N, drafts=[SPEC], k_max=16, chains=kept)
    asked = [(0, 4), (3, 2), (5, 6)]
    for ls in first[SPEC].sequences:
        for w, n in asked:
            ls.drafts(w, n), ls.verification(w, n + 1)
    _, second = record_on_demand(model, None, prompts, max_new_tokens=N, drafts=[SPEC], k_max=16, base=base,
                                 chains=kept)
    for fs, ls in zip(full.sequences, second[SPEC].sequences):
        for w, n in asked:  # held: read, no forward
            d, r = ls.drafts(w, n)
            assert np.array_equal(d[:n], fs.draft_tokens[w, :n]) and np.array_equal(r[:n], fs.draft_routing[w, :n])
            assert np.array_equal(ls.verification(w, n + 1)[0][: n + 1], fs.verify_routing[w, : n + 1])
        assert ls.drafter.forwards == 0 and ls.drafter._step is None  # no cache made either
        for w, n in [(0, 16), (3, 9), (7, 5)]:  # beyond what was held: drafted, as recorded
            d, r = ls.drafts(w, n)
            assert np.array_equal(d[:n], fs.draft_tokens[w, :n]) and np.array_equal(r[:n], fs.draft_routing[w, :n])
            vr, vt = ls.verification(w, n + 1)
            assert np.array_equal(vr[: n + 1], fs.verify_routing[w, : n + 1])
            assert np.array_equal(vt[: n + 1], fs.verify_tokens[w, : n + 1])
        assert ls.drafter.forwards > 0


def test_a_second_sweep_on_the_same_model_drafts_nothing_again_unless_its_weights_changed(model, monkeypatch):
    """What one sweep recorded is kept with the model (the next ``sl.plan`` at another budget replays it); a
    change to the weights (here one value the fingerprint samples) is a new model: recorded again."""
    prompts = [[12, 13, 14, 15, 16, 17], [40, 41, 2, 43]]
    forwards = []
    forward = LazyDrafter._forward

    def counted(self, *args, **kwargs):
        forwards.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(LazyDrafter, "_forward", counted)
    cell = Cell.of("specter", expert_budget=0.5, hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite",
                   draft=SPEC, k=4)
    runs, drafted = [], []
    for _ in range(2):
        forwards.clear()
        runs.append(ReplayedLiveSource(model, None, prompts, N).run(cell))
        drafted.append(len(forwards))
    assert drafted[0] > 0 and drafted[1] == 0
    assert [m["tpot_ms"] for m in runs[0].metrics] == [m["tpot_ms"] for m in runs[1].metrics]
    w = model.lm_head.weight
    before = w.detach().reshape(-1)[0].item()
    try:
        with torch.no_grad():
            w.reshape(-1)[0] += 1.0
        forwards.clear()
        ReplayedLiveSource(model, None, prompts, N).run(cell)
        assert len(forwards) > 0
    finally:
        with torch.no_grad():
            w.reshape(-1)[0] = before


def test_compare_on_a_model_replays_its_cells_and_gives_the_live_table(model, monkeypatch):
    """``sl.compare`` on a loaded model replays every cell a replay is the live run of (the routing recorded once,
    chains on demand): the table is the one running every cell live gives, row for row."""
    from specter_lab.studies import bench

    kw = dict(strategies=["lru", "pregate_split", "fiddler", "specter", "specter_split", "oracle"], prompts=PROMPTS,
              max_new_tokens=N, expert_budget=0.6, hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite",
              progress=False)
    from specter_lab.studies import calibration

    replays = []
    replay_runs = calibration.replay_runs
    monkeypatch.setattr(calibration, "replay_runs", lambda *a, **k: replays.append(1) or replay_runs(*a, **k))
    replayed = sl.compare(model, None, **kw).drop(columns="wall_s")
    assert len(replays) == 6  # every cell (the oracle's look is the verification pass a chain holds)
    assert replayed.fits.eq("yes").all()
    sources = []
    monkeypatch.setattr(bench, "as_source", lambda m, t, p, n, tr: sources.append(LiveSource(m, t, list(p), n))
                        or sources[-1])
    live = sl.compare(model, None, **kw).drop(columns="wall_s")
    assert sources and type(sources[0]) is LiveSource
    pd.testing.assert_frame_equal(replayed, live)
