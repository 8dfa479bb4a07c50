"""Every strategy the assembly accepts is lossless: a property-based sweep (Hypothesis) over the mechanism fields
of :class:`~specter_lab.run.strategies.Strategy` (speculation, prefetch source, eviction, pool, miss rule, refresh,
and one of the other switches). Each combination is either refused where it is built (a ``ValueError`` naming the
field), refused by the engine before generating, or generates exactly what HF ``generate`` does at a budget that
forces evictions, and replays its own recording without error.

The rows of ``STRATEGIES`` are a few points of this space; a combination nobody named is where a mechanism meets
another it was not written with (a global pool under pre-gated prefetch once moved a slot the layer was about to
compute). Seeds are fixed (``derandomize=True``); ``SPECTER_LAB_FUZZ=N`` runs N examples with fresh seeds."""

import functools
import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import specter_lab as sl
from conftest import hf_greedy
from specter_lab.run.strategies import EVICTION, MISS, POOL, PREFETCH, Strategy

LARGE = int(os.environ.get("SPECTER_LAB_FUZZ", "0"))
TOKENS, SLOTS = 12, 5  # 5 of the bundled model's 8 experts per layer: every run evicts
OTHER = [{}, dict(shared_slots=True), dict(static=True), dict(keep=False), dict(writeback=True),
         dict(single_stream=True), dict(chunking="stall"), dict(k="auto"), dict(cpu_share=0.3), dict(reuse=2),
         dict(protect=False), dict(k=1)]


@st.composite
def strategies(draw) -> "Strategy | str":
    fields = dict(speculative=draw(st.booleans()), prefetch=draw(st.sampled_from(PREFETCH)),
                  eviction=draw(st.sampled_from(EVICTION)), pool=draw(st.sampled_from(POOL)),
                  miss=draw(st.sampled_from(MISS)), refresh=draw(st.booleans()), **draw(st.sampled_from(OTHER)))
    try:
        return Strategy("sampled", **fields)
    except ValueError as e:
        return str(e)


@functools.lru_cache(maxsize=1)
def bundled():
    """The bundled model, a prompt and HF's greedy continuation (a function, not a fixture: a failing example then
    prints the strategy, not the model)."""
    model, tok = sl.load_model("tiny")
    ids = tok("def fib(n):", return_tensors="pt").input_ids[0].tolist()
    return model, tok, ids, hf_greedy(model, ids, TOKENS)


@settings(max_examples=LARGE or 40, derandomize=not LARGE, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(strategy=strategies())
@example(strategy=Strategy("sampled", prefetch="gate", eviction="lfu_decay", pool="global", miss="balance"))
def test_every_accepted_strategy_is_lossless_and_replays(strategy):
    model, tok, ids, ref = bundled()
    if isinstance(strategy, str):  # refused where it was built: the message names the strategy and a field
        assert strategy.startswith("Strategy 'sampled'") and "=" in strategy
        return
    try:
        engine = sl.Engine(model, tok, strategy, cache_slots=SLOTS)
    except ValueError as e:  # refused before anything is generated (e.g. static places layers, not slots)
        assert "sampled" in str(e)
        return
    r = engine.generate(ids, max_new_tokens=TOKENS)
    assert r.token_ids == ref, strategy
    if strategy.keep and not strategy.static:
        assert (r.frames()["cache"].event == "evict").any(), "the budget was meant to force evictions"
    rec = sl.record(model, tok, [ids], max_new_tokens=TOKENS, k_max=16 if strategy.speculative else 0,
                    progress=False)
    (run,) = sl.replay(rec, strategy, cache_slots=SLOTS)
    assert run.metrics["new_tokens"] == TOKENS
