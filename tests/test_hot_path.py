"""The hot path, counted on the CPU: host synchronisations and aten ops per committed token.

A host sync is any call that makes the host wait for the device: ``.item()``, ``.tolist()``, ``.cpu()``,
``int(t)`` / ``bool(t)`` / ``float(t)``, a ``torch.cuda.synchronize``. On the CPU they cost nothing, but they are
the same calls on the CUDA code path (the engine's code does not branch on the device there), so counting them
here counts them there. Ops are counted with a dispatch mode, as the audit did (``../shared/research``)."""

from collections import Counter

import pytest
import torch
import specter_lab as sl
from specter_lab.pricing import opcount as hostops
from specter_lab.run.quant import DraftExperts

PROMPT = "def fib(n):"
NEW = 24
CountSyncs = hostops.CountSyncs


class CountOps(hostops.CountOps):
    """The package's op counter (what the cost model prices host dispatch from), read as a Counter of ops."""

    @property
    def n(self) -> Counter:
        return self.funcs


@pytest.fixture(scope="module")
def bundled():
    return sl.load_model("tiny")


def _per_token(mode_cls, run) -> float:
    """Counted calls per generated token, prefill excluded: the difference of a long and a short run."""
    counts = []
    for n in (8, 8 + NEW):
        mode = mode_cls()
        with mode:
            run(n)
        counts.append(mode.n if isinstance(mode.n, int) else sum(mode.n.values()))
    return (counts[1] - counts[0]) / NEW


def _hf(model, tok):
    ids = torch.tensor([tok.encode(PROMPT)])
    return lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)


def _engine(engine):
    engine.info.eos_token_ids = []  # every run generates exactly n tokens, as HF's min_new_tokens does
    engine.generate(PROMPT, max_new_tokens=4)  # warm: slot views and pools are built once, not per token
    return lambda n: engine.generate(PROMPT, max_new_tokens=n)


def test_host_syncs_per_token_are_the_routing_plus_one_token(bundled, monkeypatch):
    model, tok = bundled
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append(1))
    moe_layers = len(sl.inspect_model(model).layers)
    hf = _per_token(CountSyncs, _hf(model, tok))
    for strategy, budget in (("lru", 1.0), ("lru", 0.5), ("specter", 0.5)):
        engine = sl.Engine(model, tok, strategy, expert_budget=budget)
        per_token = _per_token(CountSyncs, _engine(engine))
        # per forward: one routing readback per MoE layer and one readback of the chosen ids; a speculative
        # token costs less than a forward's worth when drafts are accepted, more when rejected: allow 1.5 forwards
        bound = (moe_layers + 1) * (1.5 if strategy == "specter" else 1.0) + hf
        assert per_token <= bound, f"{strategy}@{budget}: {per_token:.1f} host syncs per token > {bound:.1f}"
    assert not calls, "a device-wide synchronize on the decode path"


def test_aten_ops_per_token_stay_near_hf_generate(bundled):
    model, tok = bundled
    hf = _per_token(CountOps, _hf(model, tok))
    lru = _per_token(CountOps, _engine(sl.Engine(model, tok, "lru", expert_budget=1.0)))
    assert lru <= 1.1 * hf, f"lru at full budget: {lru:.0f} aten ops per token vs HF generate {hf:.0f}"
    packed = sl.Engine(model, tok, "specter", expert_budget=0.5, k=8, draft=sl.QuantSpec(bits=4, group_size=64))
    packed._draft = DraftExperts(packed.info, packed.draft_spec, pack=True)  # the device layout, on the CPU
    assert packed._draft.layout == "int4mm"
    spec = _per_token(CountOps, _engine(packed))
    assert spec <= 1.6 * hf, f"specter, packed int4 draft: {spec:.0f} aten ops per committed token vs HF {hf:.0f}"
