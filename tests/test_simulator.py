"""The simulated clock's compute side (#18): host dispatch counted per aten op, eager vs compiled, the full-depth
projection, and the published batch-1 table it must reproduce. No timing: every figure here is the cost model's."""

from dataclasses import replace

import pytest

import specter_lab as sl
from specter_lab.pricing.cost import piece_time, sync_time
from specter_lab.pricing.engines import build_cost_model
from specter_lab.pricing.opcount import op_counts
from specter_lab.pricing.profiles import HOST_OP_COST, KERNEL_TIME, PROFILES, get_profile
from specter_lab.pricing.shapes import get_cost_shape
from specter_lab.pricing.published import PUBLISHED_ROWS, TOLERANCE, derive_host_op_cost, derive_kernel_time, published


@pytest.fixture(scope="module")
def bundled():
    return sl.load_model("tiny")


@pytest.fixture(scope="module")
def table():
    return published()


def test_host_time_scales_with_op_count():
    p = PROFILES["a100-40g-pcie4"]
    one = piece_time(p, 1e6, 1e6, (100, 50, 2))
    two = piece_time(p, 1e6, 1e6, (200, 50, 2))
    assert one == pytest.approx(100 * p.host_op_cost)  # host-bound: tiny bytes and FLOPs
    assert two == pytest.approx(2 * one)
    # the counted model: a MoE layer's price is its counted ops times the per-op cost, when host-bound
    info = sl.inspect_model(sl.load_model("tiny")[0])
    cost = build_cost_model(info, p)
    ops = cost.ops.moe_layer[0] + cost.ops.experts_fixed[0]
    # plus its counted host syncs (the routing read-back), each priced as one sync_time
    syncs = (cost.ops.syncs["moe_layer"] + cost.ops.syncs["experts_fixed"]) * sync_time(p)
    assert syncs > 0
    assert cost.dense_layer_time(1, 8) == pytest.approx(ops * p.host_op_cost + syncs)
    doubled = replace(cost, ops=replace(cost.ops, moe_layer=tuple(2 * c for c in cost.ops.moe_layer),
                                        experts_fixed=tuple(2 * c for c in cost.ops.experts_fixed)))
    assert doubled.dense_layer_time(1, 8) == pytest.approx(2 * ops * p.host_op_cost + syncs)


def test_compiled_is_cheaper_than_eager_and_tokens_do_not_change(bundled):
    model, tok = bundled
    runs = {m: sl.Engine(model, tok, "lru", expert_budget=0.5, hardware=f"a100-40g-pcie4@{m}",
                         cost_shape="deepseek-v2-lite@full").generate("def fib(n):", max_new_tokens=12)
            for m in ("eager", "compiled")}
    assert runs["eager"].token_ids == runs["compiled"].token_ids
    assert runs["compiled"].metrics["tpot_ms"] < runs["eager"].metrics["tpot_ms"]
    assert runs["eager"].metrics["clock"] == "simulated:a100-40g-pcie4 (eager)"
    assert runs["compiled"].metrics["clock"] == "simulated:a100-40g-pcie4 (compiled)"


def test_counted_ops_follow_the_implementation():
    eager, batched = op_counts("qwen2_moe", "eager", 4), op_counts("qwen2_moe", "batched_mm", 4)
    assert eager.per_expert[0] > 0 and batched.per_expert[0] == 0  # a loop over experts vs one batched call
    assert eager.per_token(24, 0)["ops"] > batched.per_token(24, 0)["ops"]
    assert op_counts("qwen2_moe", "specter", 1).per_expert == op_counts("qwen2_moe", "specter", 4).per_expert
    ds = op_counts("deepseek_v2", "specter", 6)
    assert ds.dense_layer[0] > 0  # DeepSeek-V2's dense first layer is counted as its own kind


def test_full_depth_prices_the_real_layer_count(bundled):
    info = sl.inspect_model(bundled[0])
    p = PROFILES["a100-40g-pcie4"]
    per_layer = build_cost_model(info, p, "deepseek-v2-lite")
    full = build_cost_model(info, p, "deepseek-v2-lite@full")
    assert full.depth_scale == pytest.approx(26 / info.num_layers)
    assert full.dense_layer_time(1, 8) == pytest.approx(full.depth_scale * per_layer.dense_layer_time(1, 8))
    assert full.copy_time(1e6) == pytest.approx(full.depth_scale * per_layer.copy_time(1e6))
    assert full.head_time(1) > per_layer.head_time(1)  # whole LM head + the dense first layer
    assert "@full" in full.projection_label and "26 MoE + 1 dense" in full.projection_label
    assert "pro rata" in per_layer.projection_label


def test_projection_and_execution_are_in_every_compare_row(bundled):
    model, tok = bundled
    df = sl.compare(model, tok, strategies=["lru"], prompts=[[3, 4, 5]], max_new_tokens=4,
                    hardware=["rtx4090-pcie4", "rtx4090-pcie4@compiled"], cost_shape="deepseek-v2-lite@full",
                    progress=False)
    assert set(df.execution) == {"eager", "compiled"}
    assert df.projection.str.contains("deepseek-v2-lite@full").all()
    assert (df.cost_shape == "deepseek-v2-lite@full").all()


def test_unknown_execution_or_projection_is_a_clear_error():
    with pytest.raises(ValueError, match="execution='jit'"):
        replace(PROFILES["a100-40g-pcie4"], execution="jit")
    with pytest.raises(ValueError, match="execution='jit'"):
        get_profile("a100-40g-pcie4@jit")
    with pytest.raises(ValueError, match="projection 'deep'"):
        get_cost_shape("deepseek-v2-lite@deep")
    assert get_profile("a100-40g-pcie4@compiled").execution == "compiled"


def test_published_rows_are_reproduced(table):
    bad = table[(table.ratio - 1).abs() > TOLERANCE]
    assert bad.empty, f"rows outside ±{TOLERANCE:.0%}:\n{bad[['model', 'implementation', 'published_ms', 'simulated_ms']]}"
    fit = table[table.role == "host fit"]
    assert ((fit.loo_ratio - 1).abs() <= TOLERANCE).all(), "a host row only fits when it is in its own fit"
    qwen = table[table.model.str.startswith("Qwen")]
    assert list(qwen.sort_values("simulated_ms", ascending=False).implementation) == list(
        qwen.sort_values("published_ms", ascending=False).implementation)
    assert (table.aten_ops_per_token > 0).all() and "host_op_cost_us" in table.columns


def test_profile_defaults_are_what_the_published_rows_derive(table):
    assert derive_host_op_cost() == pytest.approx(HOST_OP_COST, rel=0.05)
    assert derive_kernel_time() == pytest.approx(KERNEL_TIME, rel=0.05)
    assert len(table) == len(PUBLISHED_ROWS)


def test_host_op_cost_measurement_needs_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from specter_lab.pricing.calibrate import measure_host_op_cost

    with pytest.raises(RuntimeError, match="needs CUDA"):
        measure_host_op_cost()
