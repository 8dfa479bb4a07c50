"""Speculative decoding: rejection sampling is distribution-exact, sampling is reproducible, the draft and the
budget are what they claim, and the timeline obeys the clock's rules."""

import math

import pytest
import torch

import specter_lab as sl
from specter_lab.decode import Sampling, verify_sampling


class _Dec:
    def __init__(self, seed, temperature=1.0):
        self.sampling = Sampling(True, temperature, 1.0, seed)
        self.gen = torch.Generator().manual_seed(seed)


def _tv(counts, p):
    emp = counts / counts.sum()
    return 0.5 * float((emp - p).abs().sum())


def _first_token_counts(p_logits, q, n, accept_all=False):
    dec = _Dec(1234)
    counts = torch.zeros(len(q))
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=dec.gen))
        if accept_all:
            counts[d] += 1
            continue
        acc, nxt, _ = verify_sampling(dec.sampling, dec.gen, torch.stack([p_logits, p_logits]), [d], [q])
        counts[d if acc == 1 else nxt] += 1
    return counts


def test_rejection_sampling_matches_target_distribution():
    # A draft distribution q far from the target p: the accepted-or-corrected token must follow p exactly.
    p_logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5, -0.5, 0.2])
    p = p_logits.softmax(-1)
    q = torch.tensor([0.02, 0.3, 0.3, 0.1, 0.2, 0.02, 0.03, 0.03])
    n = 30000
    counts = _first_token_counts(p_logits, q, n)
    # Sampling noise of TV over 8 outcomes at n=30000 is ~0.006; 0.02 cannot be reached by a wrong sampler
    # by luck: the draft's own distribution is at TV 0.5 from p (checked below, the test has power).
    assert _tv(counts, p) < 0.02
    broken = _first_token_counts(p_logits, q, 5000, accept_all=True)
    assert _tv(broken, p) > 0.3
    # chi-square with 7 dof: 99.9th percentile is 24.3
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3


def test_sampling_is_reproducible_and_seed_dependent():
    model = sl.tiny_random_model("qwen2_moe", seed=3)
    for strategy in ("lru", "specter"):
        e = sl.Engine(model, None, strategy, cache_slots=3)
        a = e.generate([5, 6, 7], max_new_tokens=16, do_sample=True, temperature=1.3, seed=7).token_ids
        b = e.generate([5, 6, 7], max_new_tokens=16, do_sample=True, temperature=1.3, seed=7).token_ids
        c = e.generate([5, 6, 7], max_new_tokens=16, do_sample=True, temperature=1.3, seed=8).token_ids
        assert a == b
        assert a != c
        assert len(a) == 16


def test_top_p_filters_like_nucleus():
    s = Sampling(True, 1.0, 0.5, 0)
    logits = torch.tensor([3.0, 2.0, 0.0, -1.0])
    p = s.probs(logits)
    assert p[0] > 0 and p[2] == 0 and p[3] == 0
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("method", ["rtn", "hqq"])
def test_quantizer_error_and_size(bits, method):
    torch.manual_seed(0)
    w = torch.randn(4, 24, 100)  # 100 is not a multiple of 64: padded, not refused
    spec = sl.QuantSpec(bits=bits, group_size=64, method=method)
    from specter_lab.run.quant import quantize_tensor

    qt = quantize_tensor(w, spec)
    deq = qt.dequantize()
    assert deq.shape == w.shape
    err = float((deq - w).norm() / w.norm())
    assert err == pytest.approx(qt.rel_error, rel=1e-5)
    bound = {2: 0.6, 3: 0.3, 4: 0.15, 8: 0.01}[bits]
    assert err < bound
    # codes as stored (HQQ packs 3 bits ten to a 32-bit word) + fp16 scale/zero per group (2 groups of 64 per
    # row of 100)
    rows = 4 * 24
    assert qt.packed_bytes == math.ceil(rows * 128 * {3: 3.2}.get(bits, bits) / 8) + rows * 2 * 4


def test_more_bits_less_error():
    torch.manual_seed(1)
    w = torch.randn(2, 16, 128)
    from specter_lab.run.quant import quantize_tensor

    errs = [quantize_tensor(w, sl.QuantSpec(b, 32)).rel_error for b in (2, 3, 4, 8)]
    assert errs == sorted(errs, reverse=True)


def test_draft_shares_everything_but_routed_experts():
    model = sl.tiny_random_model("qwen2_moe", seed=2)
    params_before = {n: p.data_ptr() for n, p in model.named_parameters()}
    e = sl.Engine(model, None, "specter", cache_slots=2, draft=sl.QuantSpec(4, 32))
    d = e.draft
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == params_before  # nothing copied or replaced
    info = e.info
    for layer in (0, info.num_layers - 1):
        assert d.experts(layer) == list(range(info.layers[layer].num_experts))
        assert set(info.layers[layer].param_names) <= set(d.weights(layer, 0))
    assert d.fp16_ratio == pytest.approx(0.25 + 4 / 32 / 2)  # int4 + fp16 scale and zero per 32 weights


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packing_roundtrips_and_matches_hqq(bits):
    """Codes packed in HQQ's formats (BitPack) come back exactly, and the one-op unpack reads BitPack's layout."""
    from hqq.core.bitpack import BitPack

    from specter_lab.run.quant import pack_codes, unpack_codes

    codes = torch.randint(0, 2**bits, (3, 5, 11), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert torch.equal(unpack_codes(packed, bits, 55).reshape(codes.shape), codes)
    theirs = {2: BitPack.unpack_2bit_u8, 3: BitPack.unpack_3bit_32, 4: BitPack.unpack_4bit_u8,
              8: BitPack.unpack_8bit_u8}[bits](packed[1])
    assert torch.equal(theirs.reshape(-1)[:55].to(torch.uint8), codes[1].reshape(-1))


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_packed_draft_holds_what_the_budget_counts(bits):
    """The layout used on CUDA (pack=True, forced here on the CPU): HQQ-packed codes with fp16 scale and zero (2, 3
    bits; dequantized per expert to exactly the CPU path's weights), or the int4 matmul kernel's layout (4 bits;
    the kernel's output agrees with the dense draft to float rounding). What it stores is the packed size the
    budget charges (a bf16 model: the int4 kernel keeps scales in the compute dtype)."""
    from specter_lab.model.experts import expert_apply
    from specter_lab.run.quant import DraftExperts

    model = sl.tiny_random_model("mixtral", seed=4).to(torch.bfloat16)
    info = sl.inspect_model(model)
    spec = sl.QuantSpec(bits, 32)
    dense, packed = DraftExperts(info, spec), DraftExperts(info, spec, pack=True)
    assert packed.layout == ("int4mm" if bits == 4 else "packed") and dense.layout == "dense"
    x = torch.randn(3, info.hidden, dtype=torch.bfloat16)
    for layer in (0, info.num_layers - 1):
        mod = info.layers[layer].experts
        for expert in (0, 3):
            a, b = expert_apply(mod, x, dense.weights(layer, expert)), expert_apply(mod, x, packed.weights(layer, expert))
            if bits == 4:
                torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)
            else:
                assert torch.equal(a, b)
    stored = packed.stored_bytes()
    assert stored == pytest.approx(packed.packed_bytes, rel=0.01)
    fp_bytes = sum(getattr(l.experts, n).numel() * 2 for l in info.layers for n in l.param_names)
    assert stored < fp_bytes * (bits / 16 + 0.15)  # uint8 codes alone would be 8 / bits times larger


def test_constant_groups_quantize_without_nan():
    """A group whose weights are all equal (pruned or zero-padded rows) dequantizes to its value, not NaN."""
    from specter_lab.run.quant import quantize_tensor

    w = torch.randn(2, 4, 64)
    w[0, 1] = 0.0
    w[1, 2] = -0.3
    qt = quantize_tensor(w, sl.QuantSpec(4, 64))
    deq = qt.dequantize()
    assert not torch.isnan(deq).any() and qt.rel_error == qt.rel_error
    assert torch.equal(deq[0, 1], torch.zeros(64))
    torch.testing.assert_close(deq[1, 2], torch.full((64,), -0.3), rtol=1e-3, atol=1e-3)


def test_equal_memory_across_strategies():
    model = sl.tiny_random_model("mixtral", seed=2)
    for budget in (0.5, 0.75, 1.0):
        used = {}
        for s in sl.STRATEGIES:
            e = sl.Engine(model, None, s, expert_budget=budget)
            r = e.generate([4, 5, 6], max_new_tokens=6)
            m = r.metrics
            assert m["device_bytes"] <= m["budget_bytes"]
            assert m["device_bytes"] == m["draft_bytes"] + m["slot_bytes"]
            used[s] = m["budget_bytes"]
        assert len(set(used.values())) == 1  # every strategy was given the same bytes


def test_timeline_rules_and_metrics():
    model = sl.tiny_random_model("olmoe", seed=4)
    for strategy in ("lru", "gate_lookahead", "specter", "oracle"):
        r = sl.Engine(model, None, strategy, cache_slots=3).generate([3, 4, 5, 6], max_new_tokens=20)
        f = r.frames()
        tr = f["transfers"].sort_values("start")
        # copies on the copy stream never overlap
        assert (tr.start.values[1:] >= tr.end.values[:-1] - 1e-9).all()
        co = f["compute"]
        # every expert compute starts after the copy that brought its expert (latest one before it) finished
        for row in co[co.expert >= 0].itertuples():
            if row.phase == "draft":
                continue
            prior = tr[(tr.layer == row.layer) & (tr.expert == row.expert) & (tr.start <= row.start + 1e-9)]
            assert len(prior) and prior.end.max() <= row.start + 1e-9
        assert (co.stall >= -1e-9).all()
        m = r.metrics
        assert 0 <= m["hit_rate"] <= 1
        assert m["stall_ms_per_token"] == pytest.approx(co[co.step >= 1].stall.sum() / (len(r.token_ids) - 1))
        if strategy in ("specter", "oracle"):
            assert 0 <= m["acceptance_rate"] <= 1 and 0 <= m["recall"] <= 1
        if strategy == "oracle":
            assert m["recall"] == 1.0  # the oracle's forecast is the target's routing


def test_store_never_exceeds_slots_and_counts_add_up():
    model = sl.tiny_random_model("mixtral", seed=5)
    r = sl.Engine(model, None, "specter", cache_slots=2).generate([7, 8, 9], max_new_tokens=16)
    ce = r.frames()["cache"]
    tr = r.frames()["transfers"]
    n_demand = (tr.reason == "demand").sum()
    assert (ce.event == "miss").sum() == n_demand  # every miss is one demand copy
    assert (ce.event == "prefetch").sum() == (tr.reason == "prefetch").sum()
    assert (ce.event == "prefetch_used").sum() + (ce.event == "prefetch_wasted").sum() <= (ce.event == "prefetch").sum()
