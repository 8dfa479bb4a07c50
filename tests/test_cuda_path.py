"""The CUDA code path, run on the CPU under a fake CUDA runtime.

No GPU here, so ``torch.cuda``'s stream and event calls are replaced by recorders (``FakeCuda``) and the tensors
stay on the CPU. What this can check, and does: that ``hardware="cuda"`` takes the CUDA clock and the offloading
placement (F2), that the output is still HF's greedy output on that path, how many events and synchronisations a
token costs at each trace level (F4, F8), and the bad-input errors. What it cannot check: real stream ordering
and timings; ``scripts/gpu_check.py`` does that on a GPU.
"""

import itertools
import weakref
from contextlib import contextmanager

import pytest
import torch

import specter_lab as sl
import specter_lab.run.engine as engine_mod
import specter_lab.run.quant as quant_mod
from specter_lab.model.placement import layout_action
from specter_lab.run.quant import QuantSpec

from conftest import hf_greedy

IDS = [3, 17, 42, 7, 99, 5]
N = 24


class FakeEvent:
    """A CUDA event: a position on a fake timeline (one tick per event). Like the real one, an event made with
    ``enable_timing=False`` cannot be timed: reading its time is a bug this test must catch."""

    ticks = itertools.count()

    def __init__(self, enable_timing: bool = False) -> None:
        self.timing = enable_timing
        self.t = None

    def record(self, stream=None) -> None:
        self.t = next(FakeEvent.ticks)
        FakeCuda.current.events.append(self)

    def query(self) -> bool:
        return self.t is not None  # recorded: the fake device finishes work as soon as it is queued

    def elapsed_time(self, other: "FakeEvent") -> float:
        if not (self.timing and other.timing):
            raise RuntimeError("elapsed_time on an event created without enable_timing")
        return 0.01 * (other.t - self.t)


class FakeStream:
    def __init__(self, device=None) -> None:
        self.waits = 0

    def wait_event(self, ev: FakeEvent) -> None:
        FakeCuda.current.waits += 1


class FakeCuda:
    """Records what the CUDA clock asks of the runtime: events (timed or not), stream waits, device syncs."""

    current: "FakeCuda"

    def __init__(self) -> None:
        self.events: list[FakeEvent] = []
        self.waits = 0
        self.syncs = 0
        self.default = FakeStream()

    def install(self, mp: pytest.MonkeyPatch) -> None:
        FakeCuda.current = self

        @contextmanager
        def stream(s):
            yield

        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "Event", FakeEvent)
        mp.setattr(torch.cuda, "Stream", FakeStream)
        mp.setattr(torch.cuda, "current_stream", lambda device=None: self.default)
        mp.setattr(torch.cuda, "stream", stream)
        mp.setattr(torch.cuda, "get_device_name", lambda device=None: "FakeGPU")
        mp.setattr(torch.cuda, "synchronize", lambda device=None: setattr(self, "syncs", self.syncs + 1))

    def reset(self) -> None:
        self.events.clear()
        self.waits = self.syncs = 0


@pytest.fixture
def fake_cuda(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    placed = []
    # The model stays on the CPU (there is no GPU to place it on); record what placement would have done.
    monkeypatch.setattr(engine_mod, "ensure_offload_layout",
                        lambda model, info: placed.append(layout_action(
                            model.get_input_embeddings().weight.device.type,
                            {getattr(l.experts, n).device.type for l in info.layers for n in l.param_names})))
    cuda.placed = placed
    return cuda


def _cuda_engine(model, strategy, trace="full", **kw):
    eng = sl.Engine(model, None, strategy, hardware="cuda", expert_budget=0.5, trace=trace, **kw)
    eng.info.eos_token_ids = []  # fixed-length runs: per-token counts by difference
    return eng


@pytest.mark.parametrize("strategy", ["lru", "mixtral_offloading", "specter", "fiddler", "specter_host",
                                      "specter_plus"])
def test_cuda_path_is_lossless_and_placed(model, ref, fake_cuda, strategy):
    eng = _cuda_engine(model, strategy)
    assert fake_cuda.placed == ["place"], "a CPU-loaded model must be placed for offloading, not run as is"
    assert eng.clocks.measured
    r = eng.generate(IDS, max_new_tokens=N)
    assert r.token_ids == ref
    assert r.trace.meta["clock"] == "cuda:FakeGPU" and not r.trace.meta["simulated"]
    assert fake_cuda.syncs >= 1  # copies in flight land before the trace is read


def test_mixtral_offloading_copies_on_the_compute_stream(model, fake_cuda):
    """The artifact's Mixtral-Offloading has no copy stream: its clock's copies go on the compute stream."""
    for strategy, single in (("mixtral_offloading", True), ("lru", False)):
        run = _cuda_engine(model, strategy).prepare(IDS, max_new_tokens=4)
        assert (run.clock.copy_stream is fake_cuda.default) == single
        run.execute()


def _per_token(cuda: FakeCuda, eng, what) -> float:
    counts = []
    for n in (8, 8 + N):
        cuda.reset()
        eng.generate(IDS, max_new_tokens=n)
        counts.append(what(cuda))
    return (counts[1] - counts[0]) / N


def test_trace_steps_records_no_per_op_timing(model, fake_cuda):
    full, steps = _cuda_engine(model, "lru"), _cuda_engine(model, "lru", trace="steps")
    timed = lambda c: sum(e.timing for e in c.events)
    timed_full, timed_steps = _per_token(fake_cuda, full, timed), _per_token(fake_cuda, steps, timed)
    all_steps = _per_token(fake_cuda, steps, lambda c: len(c.events))
    all_full = _per_token(fake_cuda, full, lambda c: len(c.events))
    moe_layers = len(steps.info.layers)
    # steps: a timed event at each step boundary and token only; every per-op handle is untimed
    assert timed_steps <= 3, f"trace='steps' still times {timed_steps:.1f} events per token"
    assert timed_full >= 3 * moe_layers, "trace='full' should time every compute span"
    assert all_steps < all_full / 2, f"steps {all_steps:.1f} vs full {all_full:.1f} events per token"
    r = steps.generate(IDS, max_new_tokens=N)
    assert r.metrics["tpot_ms"] > 0 and len(r.trace.frames()["compute"]) == 0
    assert r.token_ids == full.generate(IDS, max_new_tokens=N).token_ids


def test_cuda_path_never_synchronizes_the_device_per_token(model, fake_cuda):
    for strategy in ("lru", "specter"):
        eng = _cuda_engine(model, strategy, trace="steps")
        per_token = _per_token(fake_cuda, eng, lambda c: c.syncs)
        assert per_token == 0, f"{strategy}: {per_token} torch.cuda.synchronize per token"


def test_layout_actions():
    assert layout_action("cpu", {"cpu"}) == "place"
    assert layout_action("cuda", {"cpu"}) == "ok"
    assert layout_action("cuda", {"cuda"}) == "offload"
    with pytest.raises(ValueError, match="place_for_offload"):
        layout_action("cpu", {"cuda"})


def test_bad_cuda_arguments(model, fake_cuda):
    with pytest.raises(ValueError, match="cost_shape="):
        sl.Engine(model, None, "lru", hardware="cuda", cost_shape="deepseek-v2-lite")
    with pytest.raises(ValueError, match="trace="):
        sl.Engine(model, None, "lru", trace="everything")
    assert fake_cuda.placed == []  # rejected before anything was moved


def test_one_device_draft_per_model(model, monkeypatch):
    """On a GPU, building a second draft drops the first from the device (F5): nothing but the engines' own
    current draft stays alive."""
    built = []

    class FakeDraft:
        def __init__(self, info, spec, device=None):
            self.spec = spec
            built.append(weakref.ref(self))

    monkeypatch.setattr(quant_mod, "DraftExperts", FakeDraft)  # what shared_draft builds
    eng = sl.Engine(model, None, "specter", expert_budget=0.5)
    eng.device = torch.device("cuda")  # only the bookkeeping runs: FakeDraft allocates nothing
    first = eng.draft
    assert first.spec == eng.draft_spec
    del first
    eng.set_draft(QuantSpec(bits=2, group_size=32))
    assert eng.draft.spec.bits == 2
    assert len(built) == 2 and built[0]() is None, "the first draft is still alive on the device"


def test_device_bytes_held_are_the_budget(model, fake_cuda):
    """What the device really holds during a CUDA-path run (slot pools + the bit-packed draft, as allocated) is
    the expert budget, within 2 %: every byte of the budget is counted where it is spent (F5)."""
    from specter_lab.run.quant import DraftExperts

    for strategy in ("lru", "specter"):
        eng = _cuda_engine(model, strategy)
        if eng.strategy.speculative:
            eng._draft = DraftExperts(eng.info, eng.draft_spec, pack=True)  # the layout a GPU holds
        run = eng.prepare(IDS, max_new_tokens=4)
        pools = sum(t.numel() * t.element_size() for pool in run.store.pools for t in pool.values())
        draft = eng._draft.stored_bytes() if eng.strategy.speculative else 0
        held, budget = pools + draft, eng.split.budget_bytes
        assert held <= 1.02 * budget, f"{strategy}: holds {held:,} B for a budget of {budget:,} B"
        run.execute()
        run.store.release()
        assert sum(t.numel() for pool in run.store.pools for t in pool.values()) == 0  # nothing outlives the run


def test_calibrated_profile_is_still_labelled_simulated(model):
    prof = sl.HardwareProfile(**{**vars(sl.PROFILES["rtx4090-pcie4"]), "name": "my-gpu", "measured": True})
    r = sl.Engine(model, None, "lru", hardware=prof).generate(IDS, max_new_tokens=3)
    assert r.trace.meta["simulated"] and r.trace.meta["clock"] == "simulated:my-gpu (eager, calibrated)"


def test_dense_and_head_spans_have_width_on_cuda(model, fake_cuda):
    """HF runs attention, norms and the LM head before the runtime hears of them: their spans are measured
    between events (the last MoE layer's end → this layer's experts), not stamped afterwards with no width.
    Here every attention and LM-head call moves the fake GPU's clock on by 1 ms (100 ticks)."""
    def busy(*_):
        for _ in range(100):
            next(FakeEvent.ticks)

    mods = [m for n, m in model.named_modules() if n.endswith("self_attn") or n.endswith("lm_head")]
    handles = [m.register_forward_hook(busy) for m in mods]
    try:
        r = _cuda_engine(model, "lru").generate(IDS, max_new_tokens=6)
    finally:
        for h in handles:
            h.remove()
    co = r.frames()["compute"]
    dense = co[(co.expert == -1)]  # every layer's dense part (layer >= 0) and the head (layer == -1)
    assert len(dense) and ((dense.end - dense.start) >= 1.0).all(), dense[(dense.end - dense.start) < 1.0]


def test_resident_draft_skips_copies_still_landing_on_cuda(model, fake_cuda, monkeypatch):
    """The `resident` draft uses an fp expert only once its copy has landed: on CUDA it asks the copy's event
    (query, no sync), it does not assume every assigned slot is ready."""
    asked = []
    orig = FakeEvent.query
    monkeypatch.setattr(FakeEvent, "query", lambda self: asked.append(1) or orig(self))
    eng = _cuda_engine(model, "specter_plus", draft="resident")
    r = eng.generate(IDS, max_new_tokens=N)
    assert r.token_ids == hf_greedy(model, IDS, N) and asked


def test_oracle_shadow_pass_is_cut_out_of_the_cuda_timeline(model, fake_cuda):
    """On CUDA the oracle's look at the true routing is a real forward; it is cut out of the timeline (F7), so
    no committed token's time falls inside it and TPOT does not pay for it."""
    def busy(*_):
        for _ in range(100):
            next(FakeEvent.ticks)

    handles = [m.register_forward_hook(busy) for n, m in model.named_modules() if n.endswith("self_attn")]
    try:
        with pytest.warns(UserWarning, match="cut out of the timeline"):
            eng = _cuda_engine(model, "oracle")
        r = eng.generate(IDS, max_new_tokens=N)
    finally:
        for h in handles:
            h.remove()
    assert r.token_ids == hf_greedy(model, IDS, N)
    cuts = r.trace.excluded
    assert len(cuts) == len(r.frames()["steps"]) - 1  # one shadow pass per window
    # every window's shadow forward ran attention (1 ms a layer on the fake GPU): a cut holds at least that
    assert all(b.t - a.t >= 100 * len(eng.info.layers) for a, b in cuts)
    tok = r.frames()["tokens"]
    steps = r.frames()["steps"]
    assert (steps.end >= steps.start).all() and tok.time.is_monotonic_increasing


def test_cut_intervals_shift_later_times_back():
    from specter_lab.records.trace import _cutting

    ms = _cutting(lambda h: h, [(10.0, 14.0), (2.0, 3.0)])
    assert [ms(t) for t in (1.0, 2.5, 5.0, 12.0, 20.0)] == [1.0, 2.0, 4.0, 9.0, 15.0]
