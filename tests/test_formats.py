"""Routing from the engines users run, in and out: vLLM's routed_experts arrays, llama.cpp's moe-trace CSV (long
and wide forms), JSONL and SGLang's base64 routed_experts responses. A recorded trace written in each and imported
back holds the same routing and replays the same schedule; each malformed file is refused at load naming the line
or array."""

import base64
import json

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.traces.formats import FORMATS, SUFFIX, detect_format
from specter_lab.traces.trace_file import TraceError

from same_run import assert_same_run

PROMPTS = [[5, 6, 7, 8, 9, 10], [17, 3, 99, 42]]
N = 8


@pytest.fixture(scope="module")
def recorded(model):
    return sl.record(model, None, PROMPTS, max_new_tokens=N, k_max=0, progress=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_written_and_read_back_the_routing_is_the_same(model, recorded, tmp_path, fmt):
    path = recorded.export(tmp_path / f"r{SUFFIX[fmt]}")
    assert detect_format(path) == fmt
    imported = sl.import_routing(path, model.config, k_max=0)
    assert len(imported.sequences) == len(recorded.sequences)
    for rec, imp in zip(recorded.sequences, imported.sequences):
        np.testing.assert_array_equal(rec.prefill, imp.prefill)
        np.testing.assert_array_equal(rec.decode, imp.decode)
    kw = dict(cache_slots=3, hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite")
    for a, b in zip(sl.replay(recorded, "lru", **kw), sl.replay(imported, "lru", **kw)):
        assert_same_run(a, b, fmt, ("tpot_ms", "hit_rate", "h2d_bytes_per_token"), ("cache_events", "transfers"),
                        ("cache", "transfers"), tokens=False)


def test_one_sequence_uses_the_engines_own_names(model, recorded, tmp_path):
    one = sl.RoutingTrace(recorded.config, recorded.sequences[:1], 0, None, "one", {})
    with np.load(one.export(tmp_path / "v.npz")) as z:
        assert sorted(z.files) == ["prompt_routed_experts", "routed_experts"]
        assert z["routed_experts"].dtype == np.int16 and z["routed_experts"].shape == one.sequences[0].decode.shape
    head = one.export(tmp_path / "one.csv").read_text().splitlines()[0]
    assert head == "phase,token,layer,rank,expert"
    first = json.loads(one.export(tmp_path / "one.jsonl").read_text().splitlines()[0])
    assert set(first) == {"t", "layer", "experts", "phase"} and first["phase"] == "prefill"


def test_the_wide_csv_with_negative_prompt_positions_and_decoder_layer_numbers(model, tmp_path):
    """``pos,layer,id0,..`` (a fork's moe-trace): prompt rows at pos -P..-1, decode from 0; layers numbered as
    decoder layers (here 3 and 7) map in order to the MoE layers."""
    rows = [(-2, 3, 0, 1), (-2, 7, 2, 3), (-1, 3, 4, 5), (-1, 7, 6, 7), (0, 3, 1, 0), (0, 7, 3, 2)]
    path = tmp_path / "wide.csv"
    path.write_text("".join(",".join(map(str, r)) + "\n" for r in rows))
    trace = sl.import_routing(path, model.config, k_max=0)
    s = trace.sequences[0]
    assert s.prefill.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert s.decode.tolist() == [[[1, 0], [3, 2]]]


def test_a_vllm_npy_of_generated_routing_alone(model, tmp_path):
    rng = np.random.default_rng(0)
    gen = np.argsort(rng.random((9, 2, 8)), axis=-1)[..., :2].astype(np.int16)
    np.save(tmp_path / "routed_experts.npy", gen)
    trace = sl.import_routing(tmp_path / "routed_experts.npy", model.config, k_max=0)
    s = trace.sequences[0]
    assert len(s.prompt) == 1 and np.array_equal(np.concatenate([s.prefill, s.decode]), gen)


def _sglang(ids: np.ndarray, prompt: int, completion: int) -> dict:
    """A /generate response as SGLang writes it with return_routed_experts=True."""
    b64 = base64.b64encode(np.ascontiguousarray(ids, dtype="<i4").tobytes()).decode()
    meta = {"routed_experts": b64, "prompt_tokens": prompt, "completion_tokens": completion}
    return {"text": "...", "meta_info": meta}


def test_sglang_responses_number_every_decoder_layer_and_a_dense_ones_rows_are_dropped(model, tmp_path):
    """SGLang sizes its buffer by num_hidden_layers: with decoder layer 0 dense (``mlp_only_layers``), the file has
    3 layers a row, and the import keeps layers 1 and 2. Rows: P prompt forwards, then C - 1 decode forwards."""
    cfg = model.config.to_dict()
    cfg.update(num_hidden_layers=3, mlp_only_layers=[0], layer_types=["full_attention"] * 3)
    rng = np.random.default_rng(0)
    p, c = 3, 5
    ids = np.argsort(rng.random((p + c - 1, 3, 8)), axis=-1)[..., :2]
    ids[:, 0] = 0  # a dense layer's rows: never written
    other = np.argsort(rng.random((2 + 4 - 1, 3, 8)), axis=-1)[..., :2]
    path = tmp_path / "sglang.json"
    path.write_text(json.dumps([_sglang(ids, p, c), _sglang(other, 2, 4)]))
    trace = sl.import_routing(path, cfg, k_max=0)
    a, b = trace.sequences
    assert a.prefill.tolist() == ids[:p, 1:].tolist() and a.decode.tolist() == ids[p:, 1:].tolist()
    assert len(b.prefill) == 2 and b.decode.tolist() == other[2:, 1:].tolist()
    assert "SGLang" in trace.source


def test_one_sglang_response_is_written_as_an_object_and_several_as_a_list(model, recorded, tmp_path):
    one = sl.RoutingTrace(recorded.config, recorded.sequences[:1], 0, None, "one", {})
    body = json.loads(one.export(tmp_path / "one.json").read_text())
    s = one.sequences[0]
    assert body["meta_info"]["prompt_tokens"] == len(s.prefill)
    assert body["meta_info"]["completion_tokens"] == len(s.decode) + 1
    assert len(json.loads(recorded.export(tmp_path / "all.json").read_text())) == len(recorded.sequences)


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("name, text, match", [
    ("a.csv", "layer,expert\n0,1\n0,2\n", "no token column"),
    ("b.csv", "phase,token,layer,rank,expert\nprefill,0,0,0,1\nprefill,0,1,0,2\ndecode,2,0,0,1\ndecode,2,1,0,3\n",
     "without gaps"),
    ("c.csv", "phase,token,layer,rank,expert\nprefill,0,0,0,1\nprefill,0,1,0,2\nprefill,0,2,0,3\n",
     "3 distinct layers"),
    ("d.csv", "phase,token,layer,rank,expert\nprefill,0,0,5,1\nprefill,0,1,0,2\n", "routes 6 experts"),
    ("e.csv", "phase,token,layer,rank,expert\nwarmup,0,0,0,1\nprefill,0,1,0,2\n", "phase 'warmup'"),
    ("f.csv", "phase,token,layer,rank,expert\nprefill,0,0,0,x\nprefill,0,1,0,2\n", "column 'expert'"),
    ("g.csv", "phase,token,layer,rank,expert\ndecode,0,0,0,1\ndecode,0,1,0,2\nprefill,1,0,0,1\nprefill,1,1,0,2\n",
     "prompt \\(prefill\\) tokens come first"),
    ("h.jsonl", '{"t": 0, "layer": 0, "experts": [1]}\n{"t": 0, "layer": 0, "experts": [2]}\n'
     '{"t": 1, "layer": 1, "experts": [1]}\n{"t": 1, "layer": 1, "experts": [3]}\n', "twice"),
    ("i.jsonl", '{"t": -1, "layer": 0, "experts": [1]}\n', "field 't'"),
    ("j.jsonl", '{"t": 0, "layer": 0, "experts": "1,2"}\n', "field 'experts'"),
    ("k.jsonl", '{"t": 0, "layer": 0, "experts": [1]\n', "line 1: not JSON"),
    ("l.jsonl", '{"t": 0, "layer": 0, "experts": [8]}\n{"t": 0, "layer": 1, "experts": [1]}\n', "8 experts"),
])
def test_a_malformed_engine_file_is_refused_naming_the_field(model, tmp_path, name, text, match):
    with pytest.raises(TraceError, match=match):
        sl.import_routing(_write(tmp_path / name, text), model.config, k_max=0)


GOOD = np.tile(np.array([0, 1]), (4, 2, 1))  # 2 prompt + 3 completion tokens: 4 rows, 2 MoE layers, top-2


@pytest.mark.parametrize("body, match", [
    ({"text": "x"}, "no 'meta_info'"),
    ({"meta_info": {"routed_experts": [1, 2], "prompt_tokens": 2, "completion_tokens": 3}}, "'routed_experts' is list"),
    ({"meta_info": {**_sglang(GOOD, 2, 3)["meta_info"], "prompt_tokens": 0}}, "'prompt_tokens' is 0"),
    ({"meta_info": {**_sglang(GOOD, 2, 3)["meta_info"], "completion_tokens": True}}, "'completion_tokens' is True"),
    (_sglang(GOOD[1:], 2, 3), "routed_experts_start_len 0"),
    ({"meta_info": {**_sglang(GOOD, 2, 3)["meta_info"],
                    "routed_experts": "!" + _sglang(GOOD, 2, 3)["meta_info"]["routed_experts"][1:]}}, "not base64"),
    ({"meta_info": {**_sglang(GOOD, 2, 3)["meta_info"], "routed_experts": "abc"}}, "not a multiple of 4"),
    (_sglang(np.where(GOOD == 1, -7, GOOD), 2, 3), "expert id -7"),
    (_sglang(np.where(GOOD == 1, 8, GOOD), 2, 3), "8"),
    ([], "empty list"),
])
def test_a_malformed_sglang_response_is_refused_naming_the_field(model, tmp_path, body, match):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(body))
    with pytest.raises(TraceError, match=match):
        sl.import_routing(path, model.config, k_max=0)
    path.write_text('{"meta_info": ')
    with pytest.raises(TraceError, match="not JSON"):
        sl.import_routing(path, model.config, k_max=0)


def test_vllm_arrays_that_do_not_fit_the_config(model, tmp_path):
    np.savez(tmp_path / "a.npz", routed_experts=np.zeros((4, 3, 2), np.int16))
    with pytest.raises(TraceError, match="routed_experts: shape \\(4, 3, 2\\).*2 MoE layers"):
        sl.import_routing(tmp_path / "a.npz", model.config, k_max=0)
    np.savez(tmp_path / "b.npz", prompt_routed_experts=np.zeros((4, 2, 2), np.int16))
    with pytest.raises(TraceError, match="no routed_experts"):
        sl.import_routing(tmp_path / "b.npz", model.config, k_max=0)
    np.savez(tmp_path / "c.npz", routed_experts=np.zeros((4, 2, 2), np.float32))
    with pytest.raises(TraceError, match="dtype float32"):
        sl.import_routing(tmp_path / "c.npz", model.config, k_max=0)
    np.savez(tmp_path / "d.npz", routed_experts=np.tile(np.array([0, 1], np.int16), (3, 2, 1)))
    with pytest.raises(ValueError, match="defines its own prefill and decode rows"):
        sl.import_routing(tmp_path / "d.npz", model.config, segments=[(0, 3, "decode")], k_max=0)
    imported = sl.import_routing(tmp_path / "d.npz", model.config, k_max=0)
    with pytest.raises(ValueError, match="format='csv'"):
        imported.export(tmp_path / "x.txt", "csv")
