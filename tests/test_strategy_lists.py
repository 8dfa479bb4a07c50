"""Strategies are named once: every list of strategies elsewhere is derived from ``STRATEGIES`` or leaves a row out
with a stated reason, so a new strategy cannot be silently missing from the estimator, the planner or the paper's
equal-memory table. And a replay or a bound is set up without a model: no Engine, no exactness probe."""

from __future__ import annotations

import pytest

import specter_lab as sl
from specter_lab.estimator import NOT_A_DEPLOYMENT
from specter_lab.run.strategies import AUTO, BASELINES, ROLES, STRATEGIES, Strategy, describe, get_strategy
from specter_lab.run.strategies import NOT_CANDIDATES
from specter_lab.studies.planner import candidate_strategies, default_candidates
from specter_lab.studies.reproduce import LEAN_EXCLUDED, LEAN_STRATEGIES


def test_auto_is_the_planner_not_a_row():
    assert AUTO not in STRATEGIES
    with pytest.raises(ValueError, match="planner"):
        get_strategy(AUTO)
    assert "planner" in describe(AUTO)


def test_the_estimate_leaves_out_only_what_is_not_a_deployment_by_its_role():
    """The estimate replays every row; it leaves out a row only by its role (tests/test_estimate.py checks which),
    so a new strategy is in the estimate with no other edit."""
    assert set(NOT_A_DEPLOYMENT) < set(ROLES)
    assert all(isinstance(why, str) and len(why) > 20 for why in NOT_A_DEPLOYMENT.values())
    left_out = {n for n, s in STRATEGIES.items() if s.role in NOT_A_DEPLOYMENT}
    assert left_out == {"mixtral_offloading", "oracle"}


def test_every_row_is_a_planner_candidate_or_excluded_with_a_reason():
    plain, searched = candidate_strategies()
    for name in STRATEGIES:
        assert (name in plain or name in searched) != (name in NOT_CANDIDATES), name
    used = {s for _, s, _ in default_candidates(8)}
    assert used == set(plain) | set(searched)
    assert all(len(why) > 20 for why in NOT_CANDIDATES.values())


def test_baselines_and_the_equal_memory_table_follow_the_roles():
    assert BASELINES == tuple(n for n, s in STRATEGIES.items() if s.role == "baseline")
    assert "specter" not in BASELINES and "oracle" not in BASELINES and "mixtral_offloading" not in BASELINES
    assert set(LEAN_STRATEGIES) == (set(BASELINES) - set(LEAN_EXCLUDED)) | {"specter", AUTO}
    with pytest.raises(ValueError, match="role"):
        Strategy("x", role="winner")


def test_a_new_row_joins_every_list_unless_excluded(monkeypatch):
    """A throwaway baseline is a planner candidate and a row the estimate prices, with no other edit."""
    row = Strategy("throwaway_lfu", eviction="lfu")
    monkeypatch.setitem(STRATEGIES, row.name, row)
    plain, _ = candidate_strategies()
    assert row.name in plain
    e = sl.estimate("gpt-oss-20b", gpu="rtx2080", vram="8GiB", host="i9-10900x", tokens=4)
    assert row.name in set(e.table.strategy)


@pytest.fixture(scope="module")
def recorded(model):
    return sl.record(model, None, [[1, 5, 9, 13, 2]], max_new_tokens=12, k_max=4, progress=False)


def test_replay_and_the_bound_need_no_engine_and_no_exactness_probe(recorded, monkeypatch):
    """The set-up alone: a replay runs no model, so the family's speculation probe and the Engine stay unused."""
    import specter_lab.run.engine as engine_mod

    def boom(*a, **k):
        raise AssertionError("a replay must not build an Engine or run the exactness probe")

    monkeypatch.setattr(engine_mod.Engine, "__init__", boom)
    monkeypatch.setattr(engine_mod, "model_speculation_check", boom)
    monkeypatch.setattr(engine_mod, "_check_rewindable", boom)
    for strategy in ("lru", "specter"):
        (r,) = sl.replay(recorded, strategy, k=4, expert_budget=0.5) if strategy == "specter" else \
            sl.replay(recorded, strategy, expert_budget=0.5)
        assert r.token_ids == recorded.sequences[0].tokens.tolist()
    (b,) = sl.analysis.bound.trace_bound(recorded, "lru", expert_budget=0.5)
    assert b.tpot_ms > 0


def test_a_setup_prints_what_it_resolved(model):
    from specter_lab.run.setup import resolve

    setup = resolve(sl.inspect_model(model), "specter", expert_budget=0.5, hardware="a100-40g-pcie4")
    text = str(setup)
    assert "specter (k=8)" in text and "a100-40g-pcie4" in text and "slots/layer" in text
    assert setup.split.draft_bytes > 0 and not setup.measured
