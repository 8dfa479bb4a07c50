"""sl.bound_gap and `bench --gap`: a non-speculative row's distance to the bound, split into eviction (Belady's
against the row's online policy) and the schedule; its parts are the bound's and the replay's own figures."""

import json
import math

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.cli import main
from specter_lab.errors import OptionError
from specter_lab.analysis.bound import trace_bound
from specter_lab.analysis.gap import cell_gaps

PROMPTS = [[5, 6, 7, 8, 9, 10], [17, 3, 99, 42, 42, 7, 200, 11]]
# a projected shape where copies dominate; 0.25 of 8 experts × 2 layers evicts at every few tokens
CELL = dict(expert_budget=0.25, hardware="a100-40g-pcie4@compiled", cost_shape="deepseek-v2-lite@full")


@pytest.fixture(scope="module")
def trace(model):
    return sl.record(model, None, PROMPTS, max_new_tokens=24, k_max=0, progress=False)


def _mean(xs):
    return float(np.mean(list(xs)))


@pytest.mark.parametrize("strategy, online", [("lru", "lru"), ("split_lfu", "lfu_decay"), ("split_arc", "arc")])
def test_its_parts_are_the_replay_and_the_bound(trace, strategy, online):
    g = sl.bound_gap(trace, strategy, **CELL)
    runs = sl.replay(trace, strategy, **CELL)
    assert g.tpot_ms == pytest.approx(_mean(r.metrics["tpot_ms"] for r in runs), rel=1e-12)
    assert g.hit_rate == pytest.approx(_mean(r.metrics["hit_rate"] for r in runs), rel=1e-12)
    bounds = trace_bound(trace, **CELL)
    assert g.bound_ms == pytest.approx(_mean(b.tpot_ms for b in bounds), rel=1e-12)
    assert g.bound_schedule in {b.schedule for b in bounds}
    assert g.eviction == online
    assert g.online_ms == pytest.approx(_mean(b.tpot_ms for b in trace_bound(trace, evict=online, **CELL)),
                                        rel=1e-12)
    assert g.bound_ms <= g.tpot_ms and g.x_of_bound == pytest.approx(g.bound_ms / g.tpot_ms)
    assert g.eviction_share + g.schedule_share == pytest.approx(1.0)
    # the schedule's part, by how far ahead the online-eviction schedule may start its copies
    for ms, lead, initial in ((g.token_ms, math.inf, "clairvoyant"), (g.router_ms, 0, "clairvoyant"),
                              (g.start_ms, 0, "prompt")):
        assert ms == pytest.approx(_mean(b.tpot_ms for b in trace_bound(trace, evict=online, lead=lead,
                                                                        initial=initial, **CELL)), rel=1e-12)
    assert g.across_tokens_share + g.within_token_share + g.initial_set_share + g.rest_share == pytest.approx(
        g.schedule_share)
    assert g.bound_ms / g.start_ms - g.bound_ms / g.tpot_ms == pytest.approx(g.rest_share * (1 - g.x_of_bound))
    assert f"{g.within_token_share:.0%} earlier in the token" in g.summary()
    assert 0 < g.bound_hit_rate <= 1 and g.hit_rate <= g.bound_hit_rate  # Belady's hits the most
    assert f"{g.x_of_bound:.2f} of the bound" in g.summary() and "simulated" in g.assumptions


def test_an_eviction_option_is_what_the_row_is_read_against(trace):
    g = sl.bound_gap(trace, "split_lfu", eviction="lru", **CELL)
    assert g.eviction == "lru"
    assert g.tpot_ms == pytest.approx(_mean(r.metrics["tpot_ms"] for r in sl.replay(trace, "split_lru", **CELL)))


def test_at_the_bound_there_is_nothing_to_split(trace):
    # every expert resident: the all-resident row is the bound (tests/test_bound.py), so there is no distance
    g = sl.bound_gap(trace, "static_split", expert_budget=1.0, hardware=CELL["hardware"],
                     cost_shape=CELL["cost_shape"])
    assert g.x_of_bound == pytest.approx(1.0)
    assert math.isnan(g.eviction_share) and "nothing to split" in g.summary()


def test_a_cell_prices_its_rows_from_given_means(trace):
    rows = {"lru": (40.0, 0.3), "split_lfu": (20.0, 0.5)}
    a, b = cell_gaps(trace, rows, **CELL)
    assert (a.strategy, a.tpot_ms, a.hit_rate, a.eviction) == ("lru", 40.0, 0.3, "lru")
    assert (b.strategy, b.eviction) == ("split_lfu", "lfu_decay") and a.bound_ms == b.bound_ms
    assert cell_gaps(trace, {}, **CELL) == []


@pytest.mark.parametrize("strategy, match", [("specter", "speculative row"), ("auto", "plan first")])
def test_rows_without_a_split_are_refused_before_any_replay(trace, monkeypatch, strategy, match):
    monkeypatch.setattr("specter_lab.analysis.gap.replay", lambda *a, **k: pytest.fail("replayed"))
    with pytest.raises(OptionError, match=match) as e:
        sl.bound_gap(trace, strategy, **CELL)
    assert e.value.argument == "strategy" and "split_lfu" in e.value.choices


def test_bench_gap(trace, tmp_path, capsys):
    path = trace.save(tmp_path / "t.npz")
    args = ["bench", "--trace", str(path), "--strategies", "lru,split_lfu,specter", "--budgets", "0.25",
            "--hardware", "a100-40g-pcie4", "--execution", "compiled", "--cost-shape", "deepseek-v2-lite@full"]
    assert main(args + ["--gap", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    gaps = {r["strategy"]: r for r in d["gap"]}
    assert set(gaps) == {"lru", "split_lfu"}  # the speculative row has no split
    g = sl.bound_gap(trace, "split_lfu", **CELL)
    assert gaps["split_lfu"]["x_of_bound"] == pytest.approx(g.x_of_bound)
    assert gaps["split_lfu"]["eviction_share"] == pytest.approx(g.eviction_share)
    assert main(args + ["--gap"]) == 0
    assert "Distance to the bound, split" in capsys.readouterr().out


def test_bench_gap_needs_a_trace(capsys):
    assert main(["bench", "--gap", "--strategies", "lru"]) == 2  # refused before the model loads
    err = capsys.readouterr().err
    assert "--gap" in err and "add --trace FILE" in err


def test_compare_gaps_one_row_per_cell_and_plain_strategy(trace):
    """sl.bench.compare_gaps reads a compare table cell by cell: every non-speculative row of every
    (hardware, budget) cell once, each the same as bound_gap at that cell."""
    df = sl.bench.compare(None, None, ["lru", "split_lfu", "specter"], expert_budget=[0.25, 0.5],
                          hardware=[CELL["hardware"]], cost_shape=CELL["cost_shape"], trace=trace, progress=False)
    gaps = sl.bench.compare_gaps(df, trace, cost_shape=CELL["cost_shape"])
    assert sorted(zip(gaps.expert_budget, gaps.strategy)) == [(0.25, "lru"), (0.25, "split_lfu"), (0.5, "lru"),
                                                              (0.5, "split_lfu")]
    row = gaps[(gaps.expert_budget == 0.5) & (gaps.strategy == "lru")].iloc[0]
    g = sl.bound_gap(trace, "lru", **{**CELL, "expert_budget": 0.5})
    assert row.x_of_bound == pytest.approx(g.x_of_bound)
    assert row.within_token_share == pytest.approx(g.within_token_share)
    assert row.rest_share == pytest.approx(g.rest_share)
