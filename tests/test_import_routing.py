"""Routing recorded elsewhere, imported: non-speculative strategies replay exactly what a live run over that
routing does (checked against the recorded trace of the same routing); speculative ones run a modeled draft whose
recall and acceptance are what was asked; -1 slots are no lookup anywhere; bad input names the field and the fix."""

import json

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.traces.importing import MEASURED_DRAFT, import_routing
from specter_lab.model import inspect_model
from specter_lab.traces.trace_file import TraceError

from same_run import assert_same_run

PROMPTS = [[5, 6, 7, 8, 9, 10], [17, 3, 99, 42, 42, 7, 200, 11]]
N = 12
NON_SPECULATIVE = ("lru", "fiddler", "global_lru", "host_lru", "static_split", "on_demand")
RECORDS = ("cache_events", "transfers", "compute", "steps")  # token ids are placeholders in an import


@pytest.fixture(scope="module")
def recorded(model):
    return sl.record(model, None, PROMPTS, max_new_tokens=N, k_max=0, progress=False)


def _as_source(trace):
    """The recorded target routing as one int64 array with its segments (prefill, then decode, per sequence)."""
    rows, segs = trace.target_rows()
    return rows.astype(np.int64), segs


def _random_routing(model, T, seed=0, holes=0.0):
    info = inspect_model(model)
    rng = np.random.default_rng(seed)
    E, L, k = info.num_experts, info.num_layers, info.top_k
    a = np.argsort(rng.random((T, L, E)), axis=-1)[..., :k]
    a[rng.random(a.shape) < holes] = -1
    return a


def _same_schedule(a, b, what):
    assert_same_run(a, b, what, ("tpot_ms", "hit_rate", "stall_ms_per_token", "h2d_bytes_per_token", "tokens_per_s"),
                    RECORDS, ("routing", "cache", "transfers", "compute", "steps"), tokens=False)


# ------------------------------------------------------------------------------------------- exact replay

@pytest.mark.parametrize("strategy", NON_SPECULATIVE)
def test_an_imported_recording_replays_like_the_recorded_trace(model, recorded, strategy):
    src, segs = _as_source(recorded)
    imported = import_routing(src, model.config, segs)
    assert [len(s.tokens) for s in imported.sequences] == [len(s.tokens) for s in recorded.sequences]
    budgets = (dict(expert_budget=0.5),) if sl.STRATEGIES[strategy].static else (dict(expert_budget=0.5),
                                                                                 dict(cache_slots=3))
    for kw in budgets:
        kw.update(hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite")
        for rec, imp in zip(sl.replay(recorded, strategy, **kw), sl.replay(imported, strategy, **kw)):
            _same_schedule(rec, imp, f"{strategy} {kw}")
            assert imp.metrics["routing_source"].startswith("imported")


def test_one_text_without_segments_is_decoded_token_by_token(model):
    """A one-token prompt's recording is one text: the import's default reading gives the same run."""
    rec = sl.record(model, None, [[42]], max_new_tokens=N, k_max=0, progress=False)
    s = rec.sequences[0]
    imp = import_routing(np.concatenate([s.prefill, s.decode]), model.config.to_dict())
    assert len(imp.sequences[0].prompt) == 1 and len(imp.sequences[0].tokens) == len(s.tokens)
    eos = set(inspect_model(model).eos_token_ids)
    assert not eos & set(imp.sequences[0].tokens.tolist()), "a placeholder id is an EOS id"
    for strategy in ("lru", "host_lru"):
        _same_schedule(sl.replay(rec, strategy, cache_slots=3)[0], sl.replay(imp, strategy, cache_slots=3)[0],
                       strategy)


def test_config_forms_and_a_saved_import(model, recorded, tmp_path):
    src, segs = _as_source(recorded)
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))
    np.savez(tmp_path / "routing.npz", experts=src, num_experts=np.array([8]), top_k=np.array([2]),
             segment_starts=np.array([s[0] for s in segs]), segment_lengths=np.array([s[1] for s in segs]),
             segment_phases=np.array([s[2] for s in segs]))
    a = import_routing(src, model.config, segs)
    b = import_routing(tmp_path / "routing.npz", tmp_path / "config.json")
    c = sl.load_trace(b.save(tmp_path / "imported.npz"))
    for t in (b, c):
        assert t.config == a.config and t.draft == a.draft and t.meta == a.meta
        for x, y in zip(a.sequences, t.sequences):
            for name in ("prompt", "tokens", "prefill", "decode", "draft_tokens", "draft_routing",
                         "verify_routing", "verify_tokens"):
                assert np.array_equal(getattr(x, name), getattr(y, name)), name
    _same_schedule(sl.replay(a, "lru", cache_slots=3)[1], sl.replay(c, "lru", cache_slots=3)[1], "saved import")


# ------------------------------------------------------------------------------------------- modeled draft

def test_the_modeled_draft_has_the_recall_and_acceptance_asked_for(model):
    src = _random_routing(model, 400, seed=1)
    trace = import_routing(src, model.config, recall=0.7, acceptance=0.6, k_max=8, seed=3)
    s = trace.sequences[0]
    L = s.decode.shape[1]
    # recall: the share of the target's experts (verification rows) the draft names, over rows inside the text
    inside = s.verify_routing[:, :8] >= 0
    named = [len(set(v) & set(d)) for v, d in zip(s.verify_routing[:, :8][inside.all(-1)].reshape(-1, 2),
                                                   s.draft_routing[inside.all(-1)].reshape(-1, 2))]
    assert abs(np.sum(named) / (2 * len(named)) - 0.7) < 0.02
    d = s.draft_routing[inside.all(-1)].reshape(-1, 2)
    assert (d[:, 0] != d[:, 1]).all(), "a draft token names an expert twice"
    # acceptance: the replayed loop accepts runs whose lengths follow the per-token Bernoulli model
    res = sl.replay(trace, "spec_lru", cache_slots=3, k=4)[0]
    acc = res.trace.frames()["steps"]
    acc = acc[acc.kind == "window"]
    full = acc[acc.drafted == 4]
    want = sum(0.6 ** j for j in range(1, 5))
    assert abs(full.accepted.mean() - want) < 0.15, (full.accepted.mean(), want)
    assert res.token_ids == s.tokens.tolist()  # the text is what commits
    for where in (trace.source, res.metrics["routing_source"]):
        assert "modeled draft" in where and "recall 0.700" in where and "acceptance 0.600" in where
    assert trace.draft["modeled"] == {"recall": 0.7, "acceptance": 0.6, "seed": 3, "bits": 4, "defaults": False}
    assert L == inspect_model(model).num_layers


def test_replace_fraction_is_recall_and_acceptance_does_not_move_with_it(model):
    src = _random_routing(model, 60, seed=2)
    a = import_routing(src, model.config, replace_fraction=0.25, acceptance=0.5, k_max=4)
    b = import_routing(src, model.config, recall=0.75, acceptance=0.5, k_max=4)
    c = import_routing(src, model.config, recall=0.0, acceptance=0.5, k_max=4)
    assert np.array_equal(a.sequences[0].draft_routing, b.sequences[0].draft_routing)
    assert np.array_equal(a.sequences[0].draft_tokens, c.sequences[0].draft_tokens)
    v, d = c.sequences[0].verify_routing[:, :4], c.sequences[0].draft_routing
    ok = (v >= 0).all(-1)
    assert not any(set(x) & set(y) for x, y in zip(v[ok].reshape(-1, 2), d[ok].reshape(-1, 2)))


def test_defaults_are_the_measured_table_and_every_speculative_strategy_replays(model):
    trace = import_routing(_random_routing(model, 30), model.config, draft_bits=3)
    m = trace.draft["modeled"]
    assert (m["recall"], m["acceptance"], m["defaults"]) == (MEASURED_DRAFT[3].recall, MEASURED_DRAFT[3].acceptance,
                                                             True)
    assert trace.draft["bits"] == 3 and "measured on the bundled model" in trace.source
    for name, st in sl.STRATEGIES.items():
        if st.speculative and name != "auto":
            for k in (8, "auto"):
                (res,) = sl.replay(trace, name, cache_slots=3, k=k)
                assert res.token_ids == trace.sequences[0].tokens.tolist()
    with pytest.raises(ValueError, match="int3-g64-rtn"):
        sl.replay(trace, "specter", draft=sl.QuantSpec(4, 64))


def test_not_recorded_slots_are_no_lookup_on_every_path(model):
    src = _random_routing(model, 40, seed=4, holes=0.3)
    trace = import_routing(src, model.config, acceptance=0.6, gate_recall=0.7)  # gate rows replay too
    for name, st in sl.STRATEGIES.items():
        kw = dict(expert_budget=0.5) if st.static else dict(cache_slots=3)
        for k in ((8, "auto") if st.speculative else (None,)):
            res = sl.replay(trace, name, **kw, **({"k": k} if k else {}))[0]
            frames = res.frames()
            for f in ("routing", "forecast", "cache", "transfers"):
                assert not (frames[f].expert < 0).any(), f"{name} k={k}: expert -1 in the {f} frame"
            if name == "lru":  # one lookup per recorded id of a decode forward, none for -1
                ce = frames["cache"]
                decode = ce[(ce.step >= 1) & ce.event.isin(["hit", "miss"])]
                assert len(decode) == int((trace.sequences[0].decode >= 0).sum())


def test_gate_lookahead_is_refused_on_an_import_without_modelled_gates(model):
    trace = import_routing(_random_routing(model, 10), model.config, k_max=0)
    for name in ("gate_lookahead", "pregate_split"):
        with pytest.raises(ValueError, match="next layer's router.*gate_recall="):
            sl.replay(trace, name, cache_slots=3)
    assert trace.draft is None and not trace.speculative and "modeled" not in trace.source
    table = sl.plan(None, None, expert_budget=0.5, trace=trace, progress=False).table.set_index("candidate")
    assert not table.loc["gate_lookahead", "feasible"] and "no gate predictions" in table.loc["gate_lookahead", "why"]
    assert table.loc["lru", "feasible"]


# ------------------------------------------------------------------------------------------- bad input

def _npz(tmp_path, **arrays):
    path = tmp_path / "r.npz"
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("make, kwargs, error, match", [
    (lambda m, p: _random_routing(m, 5).astype(np.float32), {}, TraceError, "experts: dtype float32.*astype"),
    (lambda m, p: _random_routing(m, 5) + 8, {}, TraceError, "id 1[0-5] at token 0, MoE layer 0.*8 experts"),
    (lambda m, p: _random_routing(m, 5)[:, :1], {}, TraceError, "1 layers.*2 MoE layers"),
    (lambda m, p: np.zeros((0, 2, 2), np.int64), {}, TraceError, "holds no routing"),
    (lambda m, p: np.zeros((4, 2), np.int64), {}, TraceError, "3 dims"),
    (lambda m, p: np.full((3, 2, 2), 1), {}, TraceError, "names expert 1 twice"),
    (lambda m, p: np.full((3, 2, 3), -1), {}, TraceError, "3 ids per token.*top-2"),
    (lambda m, p: np.full((3, 2, 2), -2), {}, TraceError, "-2 < -1"),
    (lambda m, p: _random_routing(m, 5), dict(recall=0.5, replace_fraction=0.5), ValueError, "give one of them"),
    (lambda m, p: _random_routing(m, 5), dict(acceptance=1.5), ValueError, "acceptance=1.5"),
    (lambda m, p: _random_routing(m, 5), dict(draft_bits=5), ValueError, "draft_bits=5"),
    (lambda m, p: _random_routing(m, 5), dict(k_max=-1), ValueError, "k_max=-1"),
    (lambda m, p: _random_routing(m, 5), dict(segments=[(0, 3), (2, 3)]), ValueError, "not overlapping"),
    (lambda m, p: _random_routing(m, 5), dict(segments=[(0, 6, "prefill")]), ValueError, "not inside"),
    (lambda m, p: _random_routing(m, 5), dict(segments=[(0, 5, "train")]), ValueError, "phase 'train'"),
    (lambda m, p: _npz(p, routing=_random_routing(m, 5)), {}, TraceError, "no 'experts' array"),
    (lambda m, p: _npz(p, experts=_random_routing(m, 5), num_experts=np.array([64])), {}, TraceError,
     "num_experts.*another model"),
    (lambda m, p: _npz(p, experts=_random_routing(m, 5), segment_starts=np.array([0])), {}, TraceError,
     "come together"),
    (lambda m, p: _npz(p, experts=_random_routing(m, 5), segment_starts=np.array([0]),
                       segment_lengths=np.array([5]), segment_phases=np.array([{"a": 1}], dtype=object)), {},
     TraceError, "truncated or corrupt, or holds pickled"),
])
def test_bad_input_names_the_field(model, tmp_path, make, kwargs, error, match):
    with pytest.raises(error, match=match):
        import_routing(make(model, tmp_path), model.config, **kwargs)


def test_a_truncated_or_corrupt_npz_and_configs_of_no_moe_model(model, tmp_path):
    path = _npz(tmp_path, experts=_random_routing(model, 50))
    raw = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all" * 10)
    for bad in ("cut.npz", "junk.npz"):
        with pytest.raises(TraceError, match="truncated or corrupt"):
            import_routing(tmp_path / bad, model.config)
    with pytest.raises(FileNotFoundError, match="no such file"):
        import_routing(tmp_path / "missing.npz", model.config)
    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100}
    with pytest.raises(TraceError, match="not a mixture-of-experts model"):
        import_routing(_random_routing(model, 5), llama)
    with pytest.raises(TraceError, match="model_type"):
        import_routing(_random_routing(model, 5), {"hidden_size": 64})
    with pytest.raises(TypeError, match="config.json path"):
        import_routing(_random_routing(model, 5), 42)
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        import_routing(_random_routing(model, 5), tmp_path / "config.json")


@pytest.mark.parametrize("recall", [0.0, 0.6, 1.0])
def test_modelled_gate_predictions_name_the_next_layer_at_the_recall_asked(model, recall):
    """gate_recall=r: row l of a token's gate names each of its layer-l+1 experts with probability r (the others
    are experts the token does not use there), the last layer's row names nothing; the trace says so, and the gate
    rows replay. A perfect forecast is what gate lookahead would prefetch from the true routing."""
    src = _random_routing(model, 2000, seed=5)
    trace = import_routing(src, model.config, k_max=0, gate_recall=recall, seed=3)
    s = trace.sequences[0]
    rows = np.concatenate([s.prefill, s.decode])
    assert s.gate.shape == rows.shape and (s.gate[:, -1] == -1).all()
    named = [len(set(g) & set(t)) for g, t in zip(s.gate[:, :-1].reshape(-1, rows.shape[2]).tolist(),
                                                  rows[:, 1:].reshape(-1, rows.shape[2]).tolist())]
    share = np.sum(named) / (len(named) * rows.shape[2])
    assert share == pytest.approx(recall, abs=0.03)  # >= 3.8 standard errors: >= 4000 slots
    assert all(len(set(g)) == len(g) for g in s.gate[:, :-1].reshape(-1, rows.shape[2]).tolist())
    assert f"gate predictions modeled (recall {recall:g}, seed 3)" in trace.source
    assert trace.meta["imported"]["gate"] == f"modeled (recall {recall:g}, seed 3)"
    sl.replay(trace, "gate_lookahead", cache_slots=3)
    plan = sl.plan(None, None, expert_budget=0.5, trace=trace, progress=False)
    assert plan.table.set_index("candidate").loc["pregate_split", "feasible"]


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.5", True])
def test_a_bad_gate_recall_is_refused(model, bad):
    with pytest.raises(ValueError, match="gate_recall="):
        import_routing(_random_routing(model, 10), model.config, gate_recall=bad)


def test_gate_recall_measures_what_import_routing_models(model, recorded):
    """sl.gate_recall reads a recorded trace's gate lookahead against the next layer's routing (the number to pass
    as gate_recall=), gives back the recall an import modelled, and refuses a trace without gate predictions."""
    per = sl.gate_recall(recorded, per_layer=True)
    assert per.shape == (inspect_model(model).num_layers - 1,) and ((0 <= per) & (per <= 1)).all()
    s = recorded.sequences[0]
    p = len(s.prefill)
    by_hand = np.mean([len(set(s.gate[p + i, 0]) & set(s.decode[i, 1])) / len(s.decode[i, 1])
                       for i in range(len(s.decode))])
    assert sl.gate_recall(sl.RoutingTrace(recorded.config, [s], 0), per_layer=True)[0] == pytest.approx(by_hand)
    src = _random_routing(model, 2000, seed=6)
    assert sl.gate_recall(import_routing(src, model.config, k_max=0, gate_recall=0.6)) == pytest.approx(0.6, abs=0.03)
    with pytest.raises(ValueError, match="no gate predictions"):
        sl.gate_recall(import_routing(src, model.config, k_max=0))


def test_gate_recall_per_layer_pair(model):
    """gate_recall=[r0, r1, …]: one recall per layer pair l → l+1 (the bundled predictor's is uneven), read back per
    pair by sl.gate_recall and named in the trace's source; a list of the wrong length is refused before reading."""
    info = inspect_model(model)
    cfg = {k: v for k, v in model.config.to_dict().items() if k != "layer_types"}
    cfg["num_hidden_layers"] = 4  # three layer pairs
    rng = np.random.default_rng(7)
    src = np.argsort(rng.random((3000, 4, info.num_experts)), axis=-1)[..., : info.top_k]
    want = [0.1, 0.5, 0.9]
    trace = import_routing(src, cfg, k_max=0, gate_recall=want, seed=2)
    assert sl.gate_recall(trace, per_layer=True) == pytest.approx(want, abs=0.04)
    assert "recall 0.1/0.5/0.9 per layer pair" in trace.source
    flat = import_routing(src, cfg, k_max=0, gate_recall=[0.6] * 3, seed=2)
    same = import_routing(src, cfg, k_max=0, gate_recall=0.6, seed=2)
    assert all((a.gate == b.gate).all() for a, b in zip(flat.sequences, same.sequences))  # one draw per slot
    with pytest.raises(ValueError, match="gate_recall: 2 recalls .* one per layer pair"):
        import_routing("no-such-file.npz", cfg, gate_recall=[0.5, 0.5])
    with pytest.raises(ValueError, match="gate_recall="):
        import_routing(src, cfg, gate_recall=[0.5, 1.5, 0.5])
