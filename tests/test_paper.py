"""Reproducing Specter's headline under its own protocol: the artifact's TPOT beside the unbiased one, the
artifact's Mixtral-Offloading baseline, the cases as data and the reproduction table."""

import pytest

import specter_lab as sl

IDS = [5, 6, 7, 8, 9]
N = 12


def _run(model, strategy, **kw):
    kw.setdefault("hardware", "a100-40g-pcie4")
    kw.setdefault("cost_shape", "deepseek-v2-lite@full")
    return sl.Engine(model, None, strategy, cache_slots=kw.pop("cache_slots", 4), **kw).generate(IDS, N)


def test_artifact_tpot_equals_unbiased_for_an_autoregressive_run(model):
    """An autoregressive loop commits its first token at the prefill: both metrics start the clock there."""
    m = _run(model, "lru").metrics
    assert m["first_commit_tokens"] == 1
    assert m["tpot_ms_artifact"] == m["tpot_ms"] > 0


def test_artifact_tpot_drops_the_first_window_of_a_speculative_run(model):
    """A speculative loop's first commit is its first window's: the artifact's TPOT leaves that window's time out
    but still divides by N - 1, so it is lower than the unbiased one by exactly that time over N - 1."""
    r = _run(model, "specter", k=4)
    m, st, tok = r.metrics, r.frames()["steps"], r.frames()["tokens"]
    committed = tok[tok.committed]
    n = len(committed)
    first_window = st[st.kind == "window"].iloc[0]
    t_prefill = committed.time.iloc[0]
    t_w1 = committed[committed.step == first_window.step].time.max()
    assert m["tpot_ms_artifact"] < m["tpot_ms"]
    assert m["tpot_ms"] - m["tpot_ms_artifact"] == pytest.approx((t_w1 - t_prefill) / (n - 1))
    assert m["first_commit_tokens"] == 1 + first_window.committed
