"""Every reader under property-based fuzz (Hypothesis): a corrupted trace file, engine routing file, routing array
or config is either refused at load with the project's error (``TraceError`` / ``ConfigError``, naming a field,
leaving no file open) or accepted and then replayed with ``lru`` / estimated without error, within a time bound.

Seeds are fixed (``derandomize=True``) and the example counts small, so CI runs the same cases in about a minute;
``SPECTER_LAB_FUZZ=N`` runs N examples per property with fresh seeds (``scripts/fuzz_readers.py`` is the
large run, with counts)."""

import io
import json
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import specter_lab as sl
from specter_lab.errors import ConfigError, TraceError
from specter_lab.model.geometry import BUNDLED_CONFIGS, CONFIG_DIR
from specter_lab.traces.formats import FORMATS, SUFFIX

LARGE = int(os.environ.get("SPECTER_LAB_FUZZ", "0"))
BOUND_S = 30.0  # per example, load + replay/estimate; a shared 2-core CPU runs one in well under a second


def _settings(ci_examples: int):
    return settings(max_examples=LARGE or ci_examples, derandomize=not LARGE, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


ODD = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.sampled_from([10**12, -(10**12), 2**31, 2**15]),
                st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
                st.lists(st.integers(-2, 40), max_size=3),
                st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


@pytest.fixture(scope="module")
def seed_file(model, tmp_path_factory):
    trace = sl.record(model, None, [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=5, k_max=2, progress=False)
    path = trace.save(tmp_path_factory.mktemp("fuzz") / "seed.npz")
    with np.load(path, allow_pickle=False) as z:
        arrays = {n: z[n] for n in z.files}
    return trace, path.read_bytes(), arrays


def _npz(arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _outcome(load, use, what):
    """Run ``load``; a project error there is a refusal (the file closed), anything else must then ``use`` fine."""
    fds, t0 = _fds(), time.perf_counter()
    try:
        obj = load()
    except (TraceError, ConfigError) as exc:
        assert str(exc), what
        assert _fds() == fds, f"{what}: a refused load left a file open"
        return "refused"
    use(obj)  # accepted: the replay / estimate must not refuse it late nor crash
    assert time.perf_counter() - t0 < BOUND_S, f"{what}: over {BOUND_S} s"
    return "accepted"


@st.composite
def trace_mutation(draw, arrays, raw):
    kind = draw(st.sampled_from(["truncate", "flip", "header", "config", "drop", "retype", "reshape", "ids"]))
    if kind == "truncate":
        return kind, raw[: draw(st.integers(0, len(raw) - 1))]
    if kind == "flip":
        b = bytearray(raw)
        for i, x in draw(st.lists(st.tuples(st.integers(0, len(b) - 1), st.integers(1, 255)), min_size=1, max_size=6)):
            b[i] ^= x
        return kind, bytes(b)
    a = {k: v.copy() for k, v in arrays.items()}
    header = json.loads(a["header"].tobytes().decode())
    names = sorted(n for n in a if n != "header")
    if kind in ("header", "config"):
        target = header if kind == "header" else header["config"]
        keys = ["version", "config", "k_max", "draft", "source", "meta", "sequences"] if kind == "header" else \
            sorted(target) + ["num_experts", "num_experts_per_tok", "vocab_size"]
        for _ in range(draw(st.integers(1, 3))):
            target[draw(st.sampled_from(keys))] = draw(ODD)
        a["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        return kind, _npz(a)
    name = draw(st.sampled_from(names))
    if kind == "drop":
        del a[name]
    elif kind == "retype":
        a[name] = a[name].astype(draw(st.sampled_from(["float32", "int8", "uint64", "bool", "int64"])))
    elif kind == "reshape":
        a[name] = draw(st.sampled_from([a[name].reshape(-1), a[name][None], a[name][:-1], np.swapaxes(a[name], 0, -1)]))
    else:
        flat = a[name].astype(np.int64).reshape(-1)
        if flat.size:
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from([8, 9, 4096, 10**6, -2, -1, 0]))
        a[name] = flat.reshape(a[name].shape).astype(a[name].dtype if kind != "ids" else np.int64)
    return kind, _npz(a)


def test_load_trace_refuses_at_load_or_replays(seed_file, tmp_path):
    trace, raw, arrays = seed_file

    @_settings(40)
    @given(trace_mutation(arrays, raw))
    def prop(case):
        kind, data = case
        path = tmp_path / "case.npz"
        path.write_bytes(data)
        _outcome(lambda: sl.load_trace(path), lambda t: sl.replay(t, "lru", cache_slots=3, trace_level="steps"), kind)

    prop()


@st.composite
def engine_file(draw, trace, tmp_path):
    fmt = draw(st.sampled_from(FORMATS))
    path = trace.export(tmp_path / f"e{SUFFIX[fmt]}")
    raw = path.read_bytes()
    how = draw(st.sampled_from(["truncate", "bytes", "lines"]))
    if how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif how == "bytes":
        b = bytearray(raw)
        for i, c in draw(st.lists(st.tuples(st.integers(0, len(b) - 1), st.sampled_from(b"0129-,[]{}\"\nx ")),
                                  min_size=1, max_size=4)):
            b[i] = c
        raw = bytes(b)
    elif fmt != "vllm":
        lines = raw.split(b"\n")
        i = draw(st.integers(0, len(lines) - 1))
        middle = draw(st.sampled_from([[], [lines[i], lines[i]], [b"1,2,3"], [b'{"t": 99}']]))
        lines = lines[:i] + middle + lines[i + 1:]
        raw = b"\n".join(lines)
    out = tmp_path / f"case{path.suffix}"
    out.write_bytes(raw)
    return f"{fmt} {how}", out


def test_import_routing_of_engine_files_refuses_at_load_or_replays(model, seed_file, tmp_path):
    trace = seed_file[0]

    @_settings(30)
    @given(engine_file(trace, tmp_path))
    def prop(case):
        what, path = case
        _outcome(lambda: sl.import_routing(path, model.config, k_max=2),
                 lambda t: sl.replay(t, "lru", cache_slots=3, trace_level="steps"), what)

    prop()


def test_import_routing_of_arrays_refuses_at_load_or_replays(model):
    ids = st.tuples(hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6),
                               elements=st.integers(-3, 9)),
                    st.sampled_from([np.int8, np.int16, np.int64, np.uint8, np.float32]))
    ids = ids.map(lambda t: t[0].astype(t[1]))

    @_settings(40)
    @given(ids)
    def prop(a):
        _outcome(lambda: sl.import_routing(a, model.config, k_max=2),
                 lambda t: sl.replay(t, "lru", cache_slots=3, trace_level="steps"), f"array {a.shape} {a.dtype}")

    prop()


CONFIGS = {n: json.loads((CONFIG_DIR / f"{n}.json").read_text()) for n in BUNDLED_CONFIGS}


@st.composite
def config_mutation(draw):
    name = draw(st.sampled_from(sorted(CONFIGS)))
    cfg = json.loads(json.dumps(CONFIGS[name]))
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(sorted(cfg) + ["torch_dtype", "rope_theta", "num_experts", "head_dim"]))
        old = cfg.get(field)
        scaled = [old * 2, old // 2, -old, str(old), float(old)] if isinstance(old, int) and not isinstance(old, bool) \
            else [old]
        cfg[field] = draw(st.one_of(ODD, st.sampled_from(scaled)))
    return name, cfg


def test_estimate_refuses_a_config_at_load_or_estimates():
    from specter_lab.model.geometry import geometry_from_config

    @_settings(12)
    @given(config_mutation())
    def prop(case):
        name, cfg = case
        # a few tokens a row: what is fuzzed is the config, and an accepted one must estimate (any length)
        _outcome(lambda: geometry_from_config(cfg), lambda g: sl.estimate(cfg, tokens=4), name)

    prop()


@pytest.mark.parametrize("field, value", [("torch_dtype", 5), ("num_attention_heads", 0), ("hidden_size", -8),
                                          ("hidden_act", "swishy"), ("num_experts", 0), ("rope_theta", "1e6"),
                                          ("num_experts_per_tok", 10**12), ("num_hidden_layers", 10**12),
                                          ("vocab_size", "big"), ("use_cache", 3)])
def test_the_issues_config_crashes_are_refused_naming_the_field(field, value):
    cfg = {**CONFIGS["qwen3-30b-a3b"], field: value}
    with pytest.raises(ConfigError, match=rf"config\.{field}") as err:
        sl.estimate(cfg)
    assert err.value.field == field and isinstance(err.value, ValueError)
