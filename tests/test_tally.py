"""A run's metrics come from its tally, kept at every trace level: ``trace="steps"`` (what sweeps and speed runs
use) gives exactly the metrics of ``trace="full"``, and the tally agrees with the per-op frames it replaces."""

import math

import pytest

import specter_lab as sl

IDS = [5, 6, 7, 8, 9, 10, 11]
N = 12
STRATEGIES = [s for s in sl.STRATEGIES if s != "auto"]


def _frames_metrics(frames, decode_tokens):
    """The metrics the tally replaces, recomputed from the full trace's frames (pandas)."""
    ce, tr, co = frames["cache"], frames["transfers"], frames["compute"]
    dec, trd, cod = ce[ce.step >= 1], tr[tr.step >= 1], co[co.step >= 1]
    hits, misses = int((dec.event == "hit").sum()), int((dec.event == "miss").sum())
    out = {"hit_rate": hits / (hits + misses) if hits + misses else math.nan,
           "h2d_bytes_per_token": float(trd[trd.reason != "writeback"].bytes.sum()) / decode_tokens,
           "demand_bytes_per_token": float(trd[trd.reason == "demand"].bytes.sum()) / decode_tokens,
           "stall_ms_per_token": float(cod.stall.sum()) / decode_tokens,
           "host_experts_per_token": int((dec.event == "host").sum()) / decode_tokens,
           "host_ms_per_token": float((cod[cod.lane == "host"].end - cod[cod.lane == "host"].start).sum())
           / decode_tokens}
    fc, ro = frames["forecast"], frames["routing"]
    if len(fc):
        cols = ["step", "layer", "expert"]
        used = ro[(ro.source == "target") & ro.step.isin(fc.step.unique())][cols].drop_duplicates()
        pred = fc[cols].drop_duplicates()
        both = used.merge(pred, on=cols)
        out["recall"], out["precision"] = len(both) / len(used), len(both) / len(pred)
    return out


def _same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_metrics_do_not_depend_on_the_trace_level(model, strategy):
    kw = dict(expert_budget=0.45, hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite")
    full = sl.Engine(model, None, strategy, **kw).generate(IDS, max_new_tokens=N)
    steps = sl.Engine(model, None, strategy, trace="steps", **kw).generate(IDS, max_new_tokens=N)
    assert steps.token_ids == full.token_ids
    assert len(steps.trace.compute) == 0 and len(steps.trace.cache_events) == 0  # the per-op records stay empty
    differ = {k: (full.metrics[k], steps.metrics.get(k)) for k in full.metrics
              if not _same(full.metrics[k], steps.metrics.get(k))}
    assert not differ, f"{strategy}: metrics change with the trace level: {differ}"
    want = _frames_metrics(full.frames(), max(full.metrics["new_tokens"] - 1, 1))
    for key, value in want.items():
        got = full.metrics[key]
        assert _same(got, value) or math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-12), \
            f"{strategy}: {key} tally {got} vs frames {value}"


def test_a_tally_sees_evictions_and_misses(model):
    m = sl.Engine(model, None, "lru", cache_slots=2, trace="steps").generate(IDS, max_new_tokens=N).metrics
    assert m["demand_misses"] > 0 and 0 < m["hit_rate"] < 1 and m["demand_bytes_per_token"] > 0
