"""Reliability: an interrupted run (KeyboardInterrupt from the step callback or from inside an experts forward), a
failed host→device copy (CopyFault) and a long generation leave nothing broken: the error reaches the caller, the
model is a plain HF model again, no slot is marked ready with stale data, and the same Engine's next run is
lossless."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

import specter_lab as sl
from conftest import hf_greedy
from specter_lab.offload.store import CopyFault

IDS = [17, 3, 99, 42, 42, 7, 200, 11]
N = 24
ROOT = Path(__file__).resolve().parents[1]


def prepared(engine, layer_hook=None, **generate_kw):
    """One run's parts (Engine.prepare), with ``layer_hook`` on the runtime's "moe.routing" hook point: the
    test runs it with ``run.execute()`` and inspects ``run.store`` / ``run.runtime`` however it ended."""
    run = engine.prepare(IDS, max_new_tokens=N, **generate_kw)
    if layer_hook is not None:
        run.runtime.hooks["moe.routing"].append(layer_hook)
    return run


def assert_store_clean(store):
    """Residency table consistent, and every slot marked ready holds exactly its expert's host weights."""
    store.check_invariants()
    for layer, s in enumerate(store.slots):
        for slot, e in enumerate(s.expert):
            if e < 0:
                assert s.ready[slot] is None, f"layer {layer} slot {slot}: empty but marked ready"
                continue
            assert s.ready[slot] is not None, f"layer {layer} slot {slot}: holds {e} but was never marked ready"
            for name, buf in ((n, store.weights(layer, slot)[n]) for n in store.host[layer]):
                assert torch.equal(buf, store.host[layer][name][e]), \
                    f"layer {layer} slot {slot} marked ready for expert {e} holds stale {name}"


def assert_model_plain(model, impl_before="grouped_mm"):
    assert model.config._experts_implementation == impl_before
    for layer in sl.inspect_model(model).layers:
        assert "_specter_runtime" not in layer.experts.__dict__
        assert "_specter_layer" not in layer.experts.__dict__


def assert_recovers(engine, model, ref):
    assert_model_plain(model)
    assert engine.generate(IDS, max_new_tokens=N).token_ids == ref
    assert hf_greedy(model, IDS, N) == ref
    assert_model_plain(model)


# --------------------------------------------------------------------------------------------- interrupts

@pytest.mark.parametrize("strategy", ["lru", "specter", "gate_lookahead", "oracle"])
def test_keyboard_interrupt_from_step_callback(model, ref, strategy):
    assert model.config._experts_implementation == "grouped_mm"
    engine = sl.Engine(model, None, strategy, cache_slots=3)
    seen = []

    def callback(info):
        seen.append(info.step)
        if info.step == 2:
            raise KeyboardInterrupt

    run = prepared(engine, callback=callback)
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    assert seen == [0, 1, 2]
    assert run.runtime.fwd is None  # no forward left in progress (draft mode cannot leak into the next run)
    assert_store_clean(run.store)
    assert_recovers(engine, model, ref)


@pytest.mark.parametrize("strategy,mode,layer", [("lru", "target", 1), ("specter", "target", 1),
                                                 ("specter", "draft", 1), ("specter", "target", 0)])
def test_keyboard_interrupt_inside_experts_forward(model, ref, strategy, mode, layer):
    """Raised from a runtime layer hook: mid-forward, after the layers before it ran their experts."""
    engine = sl.Engine(model, None, strategy, cache_slots=3)
    fired = []

    def hook(fwd, l, idx):
        if fwd.step == 2 and fwd.mode == mode and l == layer and not fired:
            fired.append((fwd.step, fwd.mode, l))
            raise KeyboardInterrupt

    run = prepared(engine, hook)
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    assert fired
    assert run.runtime.fwd is None
    assert_store_clean(run.store)
    assert_recovers(engine, model, ref)


@pytest.mark.parametrize("strategy", ["lru", "specter"])
def test_keyboard_interrupt_during_a_copy_leaves_the_slot_empty(model, ref, strategy):
    engine = sl.Engine(model, None, strategy, cache_slots=3)
    calls = []

    def fault(layer, expert):
        calls.append((layer, expert))
        if len(calls) == 12:
            raise KeyboardInterrupt

    engine.fault_hook = fault
    run = prepared(engine)
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    store = run.store
    layer, expert = calls[-1]
    assert store.lookup(layer, expert) is None
    assert_store_clean(store)
    engine.fault_hook = None
    assert_recovers(engine, model, ref)


def test_other_errors_from_the_callback_also_leave_the_engine_usable(model, ref):
    engine = sl.Engine(model, None, "specter", cache_slots=3)

    def callback(info):
        if info.step == 1:
            raise ValueError("user callback failed")

    with pytest.raises(ValueError, match="user callback failed"):
        engine.generate(IDS, max_new_tokens=N, callback=callback)
    assert_recovers(engine, model, ref)


@pytest.mark.parametrize("strategy", ["lru", "specter"])
def test_stop_generation_is_a_clean_stop(model, ref, strategy):
    engine = sl.Engine(model, None, strategy, cache_slots=3)

    def callback(info):
        if info.step == 2:
            raise sl.decode.StopGeneration

    r = engine.generate(IDS, max_new_tokens=N, callback=callback)
    assert r.metrics["stopped"] is True
    assert 0 < len(r.token_ids) < N and r.token_ids == ref[: len(r.token_ids)]
    assert_recovers(engine, model, ref)


# --------------------------------------------------------------------------------------------- failed copies

def _fail_at(index, message="link down"):
    calls = []

    def fault(layer, expert):
        calls.append((layer, expert))
        if len(calls) == index + 1:
            raise RuntimeError(message)

    return fault, calls


@pytest.mark.parametrize("strategy", ["on_demand", "lru", "gate_lookahead", "specter"])
@pytest.mark.parametrize("reason", ["demand", "prefetch"])
def test_copy_fault_names_layer_and_expert_and_leaves_slot_empty(model, ref, strategy, reason):
    engine = sl.Engine(model, None, strategy, cache_slots=3)
    # A clean run says which copy (in issue order) is the first decode-time copy of this kind.
    clean = engine.generate(IDS, max_new_tokens=N)
    kinds = [(t.step, t.reason) for t in clean.trace.transfers]
    index = next((i for i, (step, r) in enumerate(kinds) if step >= 1 and r == reason), None)
    if index is None:
        assert reason == "prefetch" and strategy in ("on_demand", "lru")  # these never prefetch
        return
    engine.fault_hook, calls = _fail_at(index)
    run = prepared(engine)
    with pytest.raises(CopyFault) as err:
        run.execute()
    layer, expert = calls[-1]
    assert len(calls) == index + 1
    assert f"layer {layer} expert {expert} " in str(err.value) and "link down" in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError)
    store = run.store
    assert store.lookup(layer, expert) is None
    assert sum(e < 0 for e in store.slots[layer].expert) >= 1  # the slot it targeted is left empty
    assert_store_clean(store)
    engine.fault_hook = None
    assert_recovers(engine, model, ref)


def test_copy_fault_in_prefill(model, ref):
    engine = sl.Engine(model, None, "specter", cache_slots=2)
    engine.fault_hook, calls = _fail_at(0, "DMA error")
    run = prepared(engine)
    with pytest.raises(CopyFault, match=r"copy of layer 0 expert \d+ into slot 0 failed: DMA"):
        run.execute()
    assert run.store.resident_count() == 0
    engine.fault_hook = None
    assert_recovers(engine, model, ref)


# --------------------------------------------------------------------------------------------- long runs

def test_long_generation_short_variant(tmp_path):
    """scripts/long_run.py at 300 tokens on a tiny random model: lossless against HF greedy with EOS disabled,
    and the process does not balloon between the 100-token checkpoint and the end."""
    out = tmp_path / "long.json"
    argv = ["long_run.py", "--tokens", "300", "--checkpoint", "100", "--model", "random", "--json", str(out)]
    old = sys.argv
    sys.argv = argv
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(ROOT / "scripts" / "long_run.py"), run_name="__main__")
    finally:
        sys.argv = old
    assert done.value.code == 0
    res = json.loads(out.read_text())
    assert res["tokens"] == 300 and res["lossless"] is True
    mem = res["memory"]
    assert mem["end"]["committed"] == 300 and mem["checkpoint"]["committed"] >= 100
    assert mem["end"]["rss_mb"] - mem["checkpoint"]["rss_mb"] < 64, mem
    rec = res["trace_records"]
    assert rec["end"]["tokens"] >= 300
