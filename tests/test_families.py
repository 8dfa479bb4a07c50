"""Every transformers family whose experts use the experts interface, enumerated from the installed transformers:
a plain and a speculative strategy against HF generate, or a refusal with its reason. Hybrid recurrent families:
every strategy. The sweep, with its counts, is `python scripts/check_families.py`."""

import pytest
import torch

import specter_lab as sl
from specter_lab.errors import NotExact
from specter_lab.model.families import UNBUILDABLE, VARIANTS, experts_interface_families, tiny_family_model

FAMILIES = [t for t, _ in experts_interface_families()] + list(VARIANTS)
HYBRIDS = ["qwen3_next", "minimax", "minimax_linear_first", "nemotron_h", "bailing_hybrid", "kimi_linear"]
NEW = 40


def _prompt(model) -> list[int]:
    vocab = model.config.get_text_config().vocab_size
    return [(7 * i + 5) % vocab for i in range(6)]


def _reference(model, ids) -> list[int]:
    return model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)[0, len(ids):].tolist()


def test_the_enumeration_finds_the_families_we_know():
    assert {"mixtral", "qwen2_moe", "qwen3_next", "minimax", "deepseek_v3", "gpt_oss"} <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_is_lossless_or_refused(family):
    if family in UNBUILDABLE:
        with pytest.raises(Exception):  # still unbuildable: else the entry must go
            tiny_family_model(family, seed=1)
        pytest.skip(f"{family} cannot be built tiny: {UNBUILDABLE[family]}")
    model = tiny_family_model(family, seed=1)
    ids = _prompt(model)
    ref = _reference(model, ids)
    slots = sl.inspect_model(model).top_k + 1
    got = sl.Engine(model, None, "lru", cache_slots=slots).generate(ids, max_new_tokens=NEW)
    assert got.token_ids == ref, f"{family}/lru diverged from HF generate"
    frames = got.frames()
    used = frames["routing"].groupby("layer").expert.nunique().max()  # a degenerate random router may pick few
    assert (frames["cache"].event == "evict").any() or used <= slots, "the budget did not force evictions"
    try:
        engine = sl.Engine(model, None, "specter", cache_slots=slots, k=3)
    except NotExact as exc:
        assert family in str(exc) and "non-speculative" in str(exc)  # names the family and what does work
        return
    assert engine.generate(ids, max_new_tokens=NEW).token_ids == ref, f"{family}/specter diverged"


@pytest.mark.parametrize("family", HYBRIDS)
def test_hybrid_every_strategy_is_lossless(family):
    model = tiny_family_model(family, seed=1)
    ids = _prompt(model)
    ref = _reference(model, ids)
    assert len(ref) >= NEW, "the reference stopped early: too short to test rewinds"
    slots = sl.inspect_model(model).top_k + 1
    for strategy in sl.STRATEGIES:
        whole = strategy == "auto" or sl.STRATEGIES[strategy].static  # these size from a byte budget
        kw = dict(expert_budget=0.5) if whole else dict(cache_slots=slots)
        result = sl.Engine(model, None, strategy, k=3, **kw).generate(ids, max_new_tokens=NEW)
        assert result.token_ids == ref, f"{family}/{strategy} diverged from HF generate"


def test_hybrid_recompute_is_on_the_clock_and_in_the_trace():
    model = tiny_family_model("qwen3_next", seed=1)
    result = sl.Engine(model, None, "specter", k=3, cache_slots=3).generate(_prompt(model), max_new_tokens=NEW)
    m = result.metrics
    assert m["recompute_tokens"] > 0 and m["recompute_ms_per_token"] > 0 and m["snapshot_ms_per_token"] > 0
    phases = set(result.frames()["compute"].phase)
    assert {"recompute", "snapshot"} <= phases


def test_a_family_whose_verification_pass_is_not_exact_is_refused_before_any_work():
    # transformers' sparse-attention indexer picks other keys in a multi-token pass than in a decoding step
    model = tiny_family_model("deepseek_v32", seed=1)
    with pytest.raises(NotExact, match="deepseek_v32.*verification pass"):
        sl.Engine(model, None, "specter")
    assert model.config._experts_implementation != "specter"  # nothing half-applied
