"""Published batch-1 decode measurements, reproduced by the simulator (``sl.bench.published()``).

Every row is one GPU, batch 1, every expert resident: no offloading, so the row tests the compute side of the
cost model alone: host dispatch (aten ops × per-op host cost) against device time (kernels, bytes, FLOPs). For
each row a tiny random model of the real family *at the real depth and routing arity* (24 MoE layers, 60
experts top-4 for Qwen1.5-MoE; 1 dense + 26 MoE layers, 64 experts top-6 for DeepSeek-V2-Lite) runs HF
``generate`` under an aten op counter with the row's experts implementation; the real model's sizes come from
its cost shape. Sources are in ``../shared/research/routing_locality.md`` §3 and issue #18.

Two profile constants are derived from these rows (and a test checks they still match):
``HOST_OP_COST`` from the four host-bound rows (one parameter for four rows: their spread is the test, and the
``loo_ratio`` column prices each row with the constant fitted on the *other* three), ``KERNEL_TIME`` from the
Qwen compiled row (so that row is a fit, ratio ≈ 1 by construction; the H100 vLLM row is the independent check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import pandas as pd

from .cost import piece_time
from .opcount import RegionCount, count_model, counting_model
from .profiles import PROFILES, HardwareProfile
from .shapes import COST_SHAPES, CostShape

__all__ = ["PublishedRow", "PUBLISHED_ROWS", "published", "derive_host_op_cost", "derive_kernel_time",
           "simulate_row", "TOLERANCE"]

TOLERANCE = 0.30  # the target: every row within ±30 %


@dataclass(frozen=True)
class PublishedRow:
    """One published measurement and what the simulator needs to reproduce it."""

    model: str
    gpu: str  # the published GPU
    implementation: str  # as published
    published_ms: float  # ms per decode token
    shape: str  # cost shape (sizes of the real model)
    profile: str  # the simulated profile that stands for the GPU
    execution: str  # eager | compiled
    counted: str  # the experts implementation whose ops are counted (see hostops.IMPLEMENTATIONS)
    context: int  # mean tokens in the KV cache over the measured decode
    expert_traffic: float  # bytes read per routed expert / its weight bytes (batched_mm gathers: 3x)
    source: str
    role: str  # host fit | kernel fit | check
    note: str = ""

    @property
    def split(self) -> str:
        """``fit`` (a constant is derived from it) or ``check`` (never fitted: the test)."""
        return "fit" if self.role.endswith("fit") else "check"


PUBLISHED_ROWS: tuple[PublishedRow, ...] = (
    PublishedRow("Qwen1.5-MoE-A2.7B bf16", "A100", 'transformers experts_implementation="eager"', 57.7,
                 "qwen1.5-moe-a2.7b", "a100-40g-pcie4", "eager", "eager", 24, 1.0,
                 "HF dataset docs-benchmarks/experts-backends, experts_benchmark_bs1_seq16.csv (transformers "
                 "PR #42697); prompt 16, 16 new", "host fit"),
    PublishedRow("Qwen1.5-MoE-A2.7B bf16", "A100", 'transformers "grouped_mm"', 46.9,
                 "qwen1.5-moe-a2.7b", "a100-40g-pcie4", "eager", "grouped_mm_fallback", 24, 1.0,
                 "same", "host fit",
                 "counted on transformers' grouped_mm fallback (a .tolist() of the offsets, then one mm per active "
                 "expert): the path of an A100 without torch._grouped_mm for sm80 (torch <= 2.8)"),
    PublishedRow("Qwen1.5-MoE-A2.7B bf16", "A100", 'transformers "batched_mm"', 30.2,
                 "qwen1.5-moe-a2.7b", "a100-40g-pcie4", "eager", "batched_mm", 24, 3.0,
                 "same", "host fit", "batched_mm gathers the k experts' weights per token: read, write, read"),
    PublishedRow("Qwen1.5-MoE-A2.7B bf16", "A100", '"batched_mm" + torch.compile max-autotune', 5.75,
                 "qwen1.5-moe-a2.7b", "a100-40g-pcie4", "compiled", "batched_mm", 24, 1.0,
                 "same", "kernel fit",
                 "assumes max-autotune fuses batched_mm's weight gather into the bmm (a Triton template with the "
                 "index as prologue): with the gather materialised (3x expert bytes) the bytes floor alone on "
                 "this profile's 1.3 TB/s would exceed the published time"),
    PublishedRow("DeepSeek-V2-Lite bf16", "A100", "HF modeling code (most likely the original remote code)", 52.0,
                 "deepseek-v2-lite", "a100-40g-pcie4", "eager", "deepseek_remote", 192, 1.0,
                 "huggingface/optimum-habana PR #1475: 19.24 tok/s, in 128 / out 128", "host fit",
                 "experts block counted on an ops-equivalent replica of the remote code's moe_infer; attention, "
                 "router and shared experts on transformers' DeepSeek-V2 port"),
    PublishedRow("DeepSeek-Coder-V2-Lite (V2-Lite arch.)", "H100", "vLLM, batch 1", 6.28,
                 "deepseek-v2-lite", "h100-pcie5", "compiled", "grouped_mm", 384, 1.0,
                 "vllm-project/vllm PR #12637: 154.8-163.8 tok/s, in 128 / out 512 (midpoint)", "check",
                 "vLLM = CUDA graphs (compiled); its fused MoE kernels read only the k experts, counted with "
                 "transformers' grouped_mm structure (2 matmuls per experts block)"),
)


# ---------------------------------------------------------------------------------------------------- counting
@lru_cache(maxsize=None)
def _row_counts(shape_name: str, counted: str) -> dict[str, RegionCount]:
    """aten ops per decode token of a tiny model of the shape's family at its real depth and routing arity."""
    s = COST_SHAPES[shape_name]
    model = counting_model(s.family, s.top_k, s.num_experts, layers=s.num_layers, dense_first=s.dense_layers)
    return count_model(model, counted)


def _region(counts: dict[str, RegionCount], name: str) -> tuple[float, float, float]:
    r = counts.get(name, RegionCount())
    return (r.ops, r.kernels, r.matmuls)


# ---------------------------------------------------------------------------------------------------- pricing
@dataclass(frozen=True)
class RowPrice:
    """The simulated ms/token of one row and where it comes from."""

    ms: float
    host_ms: float  # what host dispatch alone would take (eager)
    device_ms: float  # what the device alone would take
    ops: float  # aten ops per token
    kernels: float  # kernels per token in the row's execution mode


def _pieces(row: PublishedRow, s: CostShape, counts) -> list[tuple[float, float, tuple[float, float, float]]]:
    """(flops, bytes, count) per forward piece, per token: each MoE layer's non-expert part, its experts block,
    the dense first layers, the head (LM head + embeddings + the decode loop's step)."""
    wb, L = 2.0, s.moe_layers
    per_layer = lambda name, n: tuple(c / n for c in _region(counts, name)) if n else (0.0, 0.0, 0.0)
    attn = (2.0 * s.dense_params, s.dense_params * wb + row.context * s.kv_bytes_per_token_per_layer)
    experts = (2.0 * s.top_k * s.expert_params, s.top_k * s.expert_params * wb * row.expert_traffic)
    pieces = [(*attn, per_layer("moe_layer", L)), (*experts, per_layer("experts", L))] * L
    if s.dense_layers:
        dense = (2.0 * s.dense_layer_params, s.dense_layer_params * wb + row.context * s.kv_bytes_per_token_per_layer)
        pieces += [(*dense, per_layer("dense_layer", s.dense_layers))] * s.dense_layers
    head = s.vocab * s.hidden
    pieces.append((2.0 * head, head * wb, _region(counts, "head")))
    return pieces


def simulate_row(row: PublishedRow, profile: HardwareProfile | None = None) -> RowPrice:
    """Price one row: Σ over its forward pieces of max(device, host) on the row's profile and execution mode."""
    p = (profile or PROFILES[row.profile]).with_execution(row.execution)
    s = COST_SHAPES[row.shape]
    pieces = _pieces(row, s, _row_counts(row.shape, row.counted))
    host = replace(p, peak_flops=1e30, hbm_bandwidth=1e30, kernel_time=0.0)  # host dispatch only
    device = replace(p, host_op_cost=0.0)
    ms = lambda prof: 1e3 * sum(piece_time(prof, f, b, c) for f, b, c in pieces)
    ops = sum(c[0] for _, _, c in pieces)
    kernels = sum((max(1.0, 2 * c[2]) if p.execution == "compiled" else c[1]) for _, _, c in pieces)
    return RowPrice(ms(p), ms(host) if p.execution == "eager" else 0.0, ms(device), ops, kernels)


# ---------------------------------------------------------------------------------------------------- derivation
def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def derive_host_op_cost(rows: tuple[PublishedRow, ...] = PUBLISHED_ROWS, exclude: int | None = None) -> float:
    """Host seconds per aten op: the geometric mean over the host-bound rows of published time ÷ counted ops
    (in those rows the device alone takes under half the published time, so host dispatch is what is measured).
    ``exclude``: leave that row index out (the leave-one-out check)."""
    fits = [r.published_ms / 1e3 / simulate_row(r).ops for i, r in enumerate(rows)
            if r.role == "host fit" and i != exclude]
    return _geomean(fits)


def derive_kernel_time(rows: tuple[PublishedRow, ...] = PUBLISHED_ROWS) -> float:
    """Device seconds per kernel: (published compiled time − its bytes/FLOPs floor) ÷ its kernels."""
    r = next(r for r in rows if r.role == "kernel fit")
    floor = replace(PROFILES[r.profile].with_execution("compiled"), kernel_time=0.0)
    price = simulate_row(r, floor)
    return (r.published_ms - price.device_ms) / 1e3 / price.kernels


def published(rows: tuple[PublishedRow, ...] = PUBLISHED_ROWS) -> pd.DataFrame:
    """Published batch-1 decode ms/token vs the simulator's, one row per measurement, with the per-op host cost,
    the op and kernel counts, the host-only and device-only times behind each figure, and the assumptions."""
    out = []
    for i, r in enumerate(rows):
        p = PROFILES[r.profile].with_execution(r.execution)
        price = simulate_row(r, p)
        loo = None
        if r.role == "host fit":
            loo_price = simulate_row(r, replace(p, host_op_cost=derive_host_op_cost(rows, exclude=i)))
            loo = loo_price.ms / r.published_ms
        ratio = price.ms / r.published_ms
        out.append({
            "model": r.model, "gpu": r.gpu, "implementation": r.implementation, "published_ms": r.published_ms,
            "simulated_ms": price.ms, "ratio": ratio, "within_30pct": abs(ratio - 1) <= TOLERANCE,
            "loo_ratio": loo, "role": r.role, "split": r.split, "aten_ops_per_token": price.ops, "kernels_per_token": price.kernels,
            "host_op_cost_us": p.host_op_cost * 1e6 if r.execution == "eager" else 0.0,
            "host_only_ms": price.host_ms, "device_only_ms": price.device_ms, "profile": p.name,
            "execution": r.execution, "counted": r.counted,
            "projection": f"{r.shape}@full (tiny {COST_SHAPES[r.shape].family} at the real depth, real sizes)",
            "source": r.source, "note": r.note,
        })
    return pd.DataFrame(out)
