"""Sweeps on recorded routing: compare, plan and the regime map replay every cell from a trace with the live
answer, in a fraction of the time, and on any Executor with the serial run's rows."""

from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest

import specter_lab as sl
from specter_lab.analysis.bound import trace_bound
from specter_lab.studies.planner import default_candidates

PROMPTS = [[5, 6, 7, 8, 9, 10], [17, 3, 99, 42, 42, 7, 200, 11]]
N = 8
KW = dict(hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite")


@pytest.fixture(scope="module")
def recorded(model):
    return sl.record(model, None, PROMPTS, max_new_tokens=N, k_max=16, progress=False)


def _numbers(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["routing", "wall_s"]).reset_index(drop=True)  # wall time: this machine's, not the model's


def test_compare_on_a_trace_equals_compare_live(model, recorded):
    strategies = [s for s in sl.STRATEGIES if s != "auto"]
    live = sl.compare(model, None, strategies, PROMPTS, max_new_tokens=N, expert_budget=[0.5, 0.35], progress=False,
                      **KW)
    rep = sl.compare(None, None, strategies, expert_budget=[0.5, 0.35], progress=False, trace=recorded, **KW)
    pd.testing.assert_frame_equal(_numbers(live), _numbers(rep))
    assert set(rep.routing) == {recorded.source} and set(live.routing) == {"live"}


def test_an_executor_gives_the_serial_rows(recorded):
    strategies = ["lru", "global_lru", "host_lru", "specter", "specter_plus"]
    serial = sl.compare(None, None, strategies, expert_budget=[0.5, 0.35], progress=False, trace=recorded, **KW)
    with ProcessPoolExecutor(2) as pool:
        pooled = sl.compare(None, None, strategies, expert_budget=[0.5, 0.35], progress=False, trace=recorded,
                            executor=pool, **KW)
    pd.testing.assert_frame_equal(serial.drop(columns="wall_s"), pooled.drop(columns="wall_s"))


def test_plan_on_a_trace_predicts_what_live_planning_does(model, recorded):
    live = sl.plan(model, None, expert_budget=0.6, prompts=PROMPTS, max_new_tokens=N, progress=False, **KW)
    rep = sl.plan(None, None, expert_budget=0.6, trace=recorded, progress=False, **KW)
    feasible = rep.table[rep.table.feasible]
    merged = feasible.merge(live.table, on="candidate", suffixes=("", "_live"))
    assert len(merged) == len(feasible) >= 10  # the plain strategies and the int4 draft at every K
    assert np.allclose(merged.predicted_tpot_ms, merged.predicted_tpot_ms_live, rtol=0, atol=0)
    # each candidate read against the autoregressive bound of the same trace at the same memory
    bound = np.mean([b.tpot_ms for b in trace_bound(recorded, "lru", expert_budget=0.6, **KW)])
    np.testing.assert_allclose(feasible.x_of_bound, bound / feasible.predicted_tpot_ms, rtol=1e-12)
    plain = feasible[~feasible.candidate.str.startswith("spec")]
    assert (plain.x_of_bound <= 1 + 1e-9).all() and "x_of_bound" not in live.table  # no trace, no bound
    skipped = rep.table[~rep.table.feasible]
    # every speculative candidate whose draft is not the recorded int4 one (int3, int2, resident, hybrid)
    other_drafts = [c for c in default_candidates(sl.inspect_model(model).num_experts)
                    if c[0].startswith("spec") and " int4 " not in c[0]]
    assert skipped.why.str.contains("not replayable").all() and len(skipped) == len(other_drafts) >= 12
    if live.label in set(feasible.candidate):
        assert rep.label == live.label


def test_regime_map_on_a_trace(recorded):
    df = sl.regime_map(None, None, None, budgets=(0.35, 0.5), hardware=("rtx4090-pcie4",),
                       cost_shapes=("deepseek-v2-lite",), progress=False, trace=recorded)
    assert len(df) == 2 and (df.routing == recorded.source).all()
    assert (df.best_baseline_tpot > 0).all() and df.auto_choice.notna().all()


def test_sweep_arguments_are_checked(model, recorded):
    with pytest.raises(ValueError, match="drop prompts"):
        sl.compare(model, None, ["lru"], PROMPTS, trace=recorded, progress=False)
    with pytest.raises(TypeError, match="RoutingTrace"):
        sl.compare(None, None, ["lru"], trace="t.npz", progress=False)
    with pytest.raises(ValueError, match="model is None"):
        sl.compare(None, None, ["lru"], PROMPTS, progress=False)


def test_what_a_trace_cannot_replay_is_a_row_that_says_why(model):
    ar_only = sl.record(model, None, PROMPTS[:1], max_new_tokens=4, k_max=0, progress=False)
    df = sl.compare(None, None, ["lru", "specter", "auto"], trace=ar_only, expert_budget=0.5, progress=False)
    rows = df.set_index("strategy")
    assert rows.loc["lru", "fits"] == "yes" and rows.loc["auto", "fits"] == "yes"  # auto plans on the trace
    assert "no draft chains" in rows.loc["specter", "fits"] and np.isnan(rows.loc["specter", "tpot_ms"])


def test_a_replayed_sweep_of_many_cells_runs_on_a_local_pool_by_default(recorded, monkeypatch):
    from specter_lab.studies import runs

    monkeypatch.setattr(runs, "cores", lambda: 2)  # the default is for machines with more than one core
    source = runs.TraceSource(recorded)
    with runs.sweep_executor(source, runs.POOL_MIN_CELLS, "auto") as ex:
        assert isinstance(ex, runs.TracePool) and ex.serves(source)
    with runs.sweep_executor(source, runs.POOL_MIN_CELLS - 1, "auto") as ex:
        assert ex is None  # a few cells: here
    with runs.sweep_executor(runs.LiveSource(None, None, [], 1), 100, "auto") as ex:
        assert ex is None  # live cells would each need the model: here
    strategies = ["lru", "global_lru", "specter", "specter_plus", "fiddler"]
    serial = sl.compare(None, None, strategies, expert_budget=[0.5, 0.35], progress=False, trace=recorded,
                        executor=None, **KW)
    pooled = sl.compare(None, None, strategies, expert_budget=[0.5, 0.35], progress=False, trace=recorded, **KW)
    pd.testing.assert_frame_equal(serial.drop(columns="wall_s"), pooled.drop(columns="wall_s"))
    with pytest.raises(ValueError, match="executor="):
        sl.compare(None, None, ["lru"], progress=False, trace=recorded, executor="dask")


def test_a_spawned_pool_gives_the_same_rows(recorded):
    """The start method of platforms without fork (macOS, Windows) and of Python >= 3.12 (forkserver)."""
    from specter_lab.studies import runs

    cells = [runs.Cell.of(s, expert_budget=0.5, **KW) for s in ("lru", "specter")]
    source = runs.TraceSource(recorded)
    with runs.trace_pool(recorded, workers=1, start_method="spawn") as pool:
        pooled = runs.run_cells(source, cells, pool)
    serial = runs.run_cells(source, cells, None)
    nan_is_nan = lambda runs_: [[{k: ("nan" if v != v else v) for k, v in m.items()} for m in r.metrics] for r in runs_]
    assert nan_is_nan(pooled) == nan_is_nan(serial)
