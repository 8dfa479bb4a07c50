"""Record a run's routing once, replay every strategy from it: the replay is the live run (greedy, simulated
clock): same tokens, metrics and trace records. Bad traces fail with the field named, nothing half-loaded."""

import copy
import dataclasses
import gc
import json
import zipfile

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.traces.trace_file import TRACE_VERSION, TraceError

from same_run import assert_same_run

PROMPTS = [[5, 6, 7, 8, 9, 10], [17, 3, 99, 42, 42, 7, 200, 11]]
N = 10
RECORDS = ("cache_events", "transfers", "compute", "steps", "tokens", "forecast")


@pytest.fixture(scope="module")
def recorded(model):
    return sl.record(model, None, PROMPTS, max_new_tokens=N, k_max=16, progress=False)


def _same_run(live, rep, what):
    assert_same_run(live, rep, what, ("tpot_ms", "hit_rate", "stall_ms_per_token", "h2d_bytes_per_token",
                                      "acceptance_rate"),
                    RECORDS, ("routing", "cache", "transfers", "compute", "tokens", "steps"))


@pytest.mark.parametrize("strategy", [s for s in sl.STRATEGIES if s != "auto"])
def test_replay_equals_the_live_run_for_every_strategy(model, recorded, strategy):
    st = sl.STRATEGIES[strategy]
    for kw in (dict(expert_budget=0.5), dict(cache_slots=3)) if not st.static else (dict(expert_budget=0.5),):
        kw.update(hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite")
        eng = sl.Engine(model, None, strategy, **kw)
        reps = sl.replay(recorded, strategy, **kw)
        for ids, rep in zip(PROMPTS, reps):
            _same_run(eng.generate(ids, max_new_tokens=N), rep, f"{strategy} {kw}")


@pytest.mark.parametrize("strategy", ["lru", "specter", "pregate_split", "specter_split"])
def test_a_finished_replay_is_freed_without_the_cycle_collector(recorded, strategy):
    """A replay's run (schedule, store, trace) holds no reference cycle: dropping the result frees its records at
    once. One cycle (a memo holding the schedule's bound method) left every replay's records to the collector's
    oldest-generation passes, the largest cost of a sweep of replays."""
    kw = dict(expert_budget=0.5, hardware="rtx4090-pcie4")
    sl.replay(recorded, strategy, **kw)  # first use: imports, caches
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        results = sl.replay(recorded, strategy, **kw)
        del results
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


def test_a_replay_leaves_what_the_caller_froze_frozen(recorded):
    """A server that froze its objects before forking (gc.freeze) finds them still frozen after a replay."""
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        sl.replay(recorded, "lru", expert_budget=0.5)
        assert gc.get_freeze_count() > 0.9 * frozen  # (a frozen object that dies leaves the count)
    finally:
        gc.unfreeze()


def test_replay_of_a_saved_trace_and_with_every_k(model, recorded, tmp_path):
    path = recorded.save(tmp_path / "t.npz")
    loaded = sl.load_trace(path)
    for k in (1, 3, 16, "auto"):
        live = sl.Engine(model, None, "specter", cache_slots=3, k=k).generate(PROMPTS[1], max_new_tokens=N)
        _same_run(live, sl.replay(loaded, "specter", cache_slots=3, k=k, sequences=[1])[0], f"k={k}")
    assert "recorded" in loaded.source


def test_replay_of_the_bundled_model_with_a_tokenizer():
    model, tok = sl.load_model("tiny")
    trace = sl.record(model, tok, ["def fib(n):"], max_new_tokens=16, k_max=8, progress=False)
    for strategy in ("lru", "specter"):
        kw = dict(expert_budget=0.35, hardware="a100-40g-pcie4@compiled", cost_shape="deepseek-v2-lite@full")
        live = sl.Engine(model, tok, strategy, **kw).generate("def fib(n):", max_new_tokens=16)
        rep = sl.replay(trace, strategy, tokenizer=tok, **kw)[0]
        _same_run(live, rep, strategy)
        assert rep.text == live.text and rep.metrics["routing_source"].startswith("recorded")


# --------------------------------------------------------------------------------------------- what it refuses

def test_replay_refuses_what_the_trace_cannot_answer(model, recorded):
    ar_only = sl.record(model, None, PROMPTS[:1], max_new_tokens=4, k_max=0, progress=False)
    with pytest.raises(ValueError, match="no draft chains"):
        sl.replay(ar_only, "specter")
    with pytest.raises(ValueError, match="k <= 16"):
        sl.replay(recorded, "specter", k=17)
    with pytest.raises(ValueError, match="int4-g64-rtn"):
        sl.replay(recorded, "specter", draft=sl.QuantSpec(2, 64))
    with pytest.raises(ValueError, match="cannot be recorded apart"):
        sl.replay(recorded, "specter", draft="resident")
    with pytest.raises(ValueError, match="simulated profile"):
        sl.replay(recorded, "lru", hardware="cuda")
    with pytest.raises(TypeError, match="RoutingTrace"):
        sl.replay({"not": "a trace"}, "lru")
    assert ar_only.sequences[0].draft_tokens is None


def _broken(recorded, tmp_path, mutate) -> str:
    path = recorded.save(tmp_path / "ok.npz")
    with np.load(path) as z:
        data = {n: z[n] for n in z.files}
    mutate(data)
    bad = tmp_path / "bad.npz"
    with open(bad, "wb") as f:
        np.savez(f, **data)
    return str(bad)


def _header(data, **changes):
    h = json.loads(data["header"].tobytes().decode())
    h.update(changes)
    data["header"] = np.frombuffer(json.dumps(h).encode(), dtype=np.uint8)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: _header(d, version=TRACE_VERSION + 1), "version"),
    (lambda d: d.update({"s0.prefill": d["s0.prefill"] + 100}), "experts"),
    (lambda d: d.update({"s0.decode": d["s0.decode"][:, :1]}), "sequence 0.decode"),
    (lambda d: d.update({"s0.tokens": d["s0.tokens"].astype(np.float32)}), "integer"),
    (lambda d: d.pop("s1.prefill"), "prefill"),
    (lambda d: _header(d, sequences=0), "no sequences"),
    (lambda d: d.pop("s0.verify_tokens"), "come together"),
    (lambda d: d.pop("header"), "header"),
])
def test_a_bad_trace_file_fails_naming_the_field(recorded, tmp_path, mutate, match):
    path = _broken(recorded, tmp_path, mutate)
    with pytest.raises(TraceError, match=match):
        trace = sl.load_trace(path)
        sl.replay(trace, "lru")  # a config mismatch is found when the trace meets its model


def test_a_truncated_or_missing_file_fails_clearly(recorded, tmp_path):
    path = recorded.save(tmp_path / "t.npz")
    raw = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        sl.load_trace(tmp_path / "cut.npz")
    with pytest.raises(FileNotFoundError, match="record one"):
        sl.load_trace(tmp_path / "missing.npz")
    assert zipfile.is_zipfile(path)


def test_a_trace_of_another_model_is_refused(recorded):
    config = {k: v for k, v in recorded.config.items() if k != "layer_types"}
    other = dataclasses.replace(recorded, config={**config, "num_hidden_layers": 1})
    with pytest.raises(TraceError, match="MoE layers"):
        sl.replay(other, "lru")
    broken = dataclasses.replace(recorded, config={**recorded.config, "num_hidden_layers": 1})
    with pytest.raises(TraceError, match=r"trace\.config\.layer_types: .* one per decoder layer"):
        sl.replay(broken, "lru")  # the field named, as a config.json's check names it
    with pytest.raises(TraceError, match="model_type"):
        sl.replay(dataclasses.replace(recorded, config={}), "lru")


def test_a_trace_edited_after_a_replay_is_checked_again(recorded):
    """A replay checks its trace once per content (a sweep replays it many times): an id edited in place after a
    replay is still refused, naming the field."""
    trace = copy.deepcopy(recorded)
    sl.replay(trace, "lru", trace_level="steps")
    sl.replay(trace, "lru", trace_level="steps")  # the check passed once and is not made again
    trace.sequences[0].decode[1, 0, 0] = 10_000
    with pytest.raises(TraceError, match=r"sequence 0\.decode: expert id 10000"):
        sl.replay(trace, "lru", trace_level="steps")
    trace.sequences[0].decode[1, 0, 0] = recorded.sequences[0].decode[1, 0, 0]
    assert [r.token_ids for r in sl.replay(trace, "lru", trace_level="steps")] == \
        [r.token_ids for r in sl.replay(recorded, "lru", trace_level="steps")]
