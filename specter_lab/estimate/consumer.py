"""Published offloaded decode measurements on consumer machines, reproduced by the estimator
(``sl.bench.consumer_anchors()``, ``specter-lab bench --consumer``).

Each row is one published tokens/s of llama.cpp or ktransformers on a named GPU + host with a named placement
(sources: ``../shared/research/field_2026.md`` §3.2 and the threads named per row). The row is priced on the
llama.cpp-class clock every estimate replays on (:mod:`specter_lab.pricing.llamacpp`), from the model's config
(bundled in ``specter_lab/data/configs``), the weights' format, the GPU profile and host CPU, and the placement:
every published placement is static (each expert always in the same place), where the clock's closed form
(:func:`.lanes.price_token`) is the replay's time (``tests/test_estimate.py`` holds them equal). One constant is
fitted from the rows: the fraction of the host's delivered DRAM bandwidth a batch-1 expert matvec reaches
(``HOST_DECODE_EFFICIENCY``), the geometric mean of each ``fit`` row's own value; ``loo_ratio`` prices each of
those rows with the constant fitted on the others. Rows tagged ``check`` are never in the fit: they are the test
(:func:`consumer_summary` reports the two groups' errors and band coverage apart). A row's band is the estimate's
(:mod:`.bands`): what is not known about its machine, each unknown at its ends, combined in quadrature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from .bands import Scenario, combine, unknowns
from .lanes import Counts, Machine, price_token, resident, static_layers, uniform_hot_set
from .vram import vram_budget
from ..model.geometry import ModelGeometry, geometry_from_config
from ..pricing.precision import get_precision
from ..pricing.profiles import HOST_DECODE_EFFICIENCY, get_host, resolve_gpu

__all__ = ["ConsumerRow", "CONSUMER_ROWS", "consumer_anchors", "consumer_summary", "derive_host_efficiency",
           "simulate_consumer_row", "row_band", "TOLERANCE"]

TOLERANCE = 0.30
GiB = 2**30
_QP_LADDER = "FedericoTs/quantprobe MACHINE_LADDER.md@0040d61 (llama.cpp f113e02, tg128 r=2)"


@dataclass(frozen=True)
class ConsumerRow:
    """One published measurement and the placement that reproduces it."""

    model: str
    config: str  # bundled config name
    weights: str
    gpu: str  # profile name or catalog name (specter_lab.pricing.gpus)
    host: str | None  # HOSTS name or memory description; None: not published (a row with no host work)
    vram_gib: float
    engine: str  # engine and placement, as published
    strategy: str  # the placement as our strategy ("whole layers": llama.cpp -ngl short of every layer)
    placement: dict  # static_split: layers_on_gpu; fiddler: gpu_experts; whole layers: gpu_layers (llama.cpp -ngl)
    published_tok_s: tuple[float, float]  # (low, high) as published
    context: int  # mean tokens in the KV cache over the measured decode
    source: str
    role: str  # fit (the host efficiency is fitted on it) | check (never fitted: the test)
    note: str = ""

    @property
    def split(self) -> str:
        return "fit" if self.role == "fit" else "check"

    @property
    def published_mid(self) -> float:
        return sum(self.published_tok_s) / 2


CONSUMER_ROWS: tuple[ConsumerRow, ...] = (
    ConsumerRow("DeepSeek-V2-Lite Q4_K_M", "deepseek-v2-lite", "q4_k_m", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp expert split (-ot, --no-mmap)", "static_split", {"rule": "vram", "context": 4096},
                (22.87, 22.87), 64, _QP_LADDER, "fit",
                "the split's layer list is not published: placed by the estimator's VRAM rule at 6 GiB (dense + KV "
                "at 4096 + 0.6 GiB overhead, then as many expert layers as fit)"),
    ConsumerRow("DeepSeek-V2-Lite Q4_K_M", "deepseek-v2-lite", "q4_k_m", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp -ngl 13 (whole layers)", "whole layers", {"gpu_layers": 13},
                (18.21, 18.21), 64, _QP_LADDER, "fit",
                "'-ngl 13 / -ngl 20 for the two big models': the last 13 of 27 decoder layers on the GPU, the first "
                "14 and the LM head on the host (llama.cpp offloads from the last layer back)"),
    ConsumerRow("DeepSeek-V2-Lite Q4_K_M", "deepseek-v2-lite", "q4_k_m", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp CPU only (-ngl 0, mmap on)", "whole layers", {"gpu_layers": 0},
                (6.84 - 5.13, 6.84 + 5.13), 64, _QP_LADDER, "check",
                "published as 6.84 +/- 5.13, bimodal: mmap pages the file from disk on the first pass; the model "
                "prices a warm --no-mmap run, so only the upper half of the range can be reproduced"),
    ConsumerRow("Qwen3-30B-A3B Q2_K", "qwen3-30b-a3b", "q2_k", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp split, 34 % of experts in VRAM", "static_split", {"layers_on_gpu": 16},
                (20.4, 22.2), 64, "FedericoTs/quantprobe README.md@0040d61 (preregs #60/#61)", "fit",
                "the emitted command: -ngl 99 -ot 'blk\\.(16|...|47)\\.ffn_.*_exps\\.=CPU' (16 of 48 expert layers "
                "on the GPU)"),
    ConsumerRow("Qwen3-30B-A3B-2507 BF16", "qwen3-30b-a3b", "bf16", "rtx5090-pcie5", "epyc-9355-ddr5-6400", 32.0,
                "ktransformers 0.5.2 + SGLang, 28 GPU experts per layer", "fiddler",
                {"gpu_experts": 28, "by": "index", "overlap": True}, (44.0, 52.0), 64,
                "kvcache-ai/ktransformers#1914", "fit",
                "28 fixed experts per layer on the GPU chosen without a routing profile (a uniform 28/128 of "
                "routed experts served there), the host's experts overlapped with the GPU's (ktransformers runs "
                "them concurrently); the host's delivered bandwidth is 0.78 x peak, the published desktop "
                "measurements' geometric mean (not measured on this box)"),
    ConsumerRow("gpt-oss-20B MXFP4", "gpt-oss-20b", "mxfp4+q8_0", "rtx2080-pcie3", "i9-10900x-ddr4-2933", 8.0,
                "llama.cpp --n-cpu-moe 12", "static_split", {"layers_on_gpu": 12}, (36.4, 36.4), 64,
                "AlexsJones/llmfit#775", "fit",
                "dense tensors at q8_0: inferred from the size of ggml-org's gpt-oss-20b GGUF (about 12 GB: 10.2 GB "
                "of MXFP4 experts + 1.8B other params at ~8.5 bits), not read from its tensor list"),
    ConsumerRow("gpt-oss-20B MXFP4", "gpt-oss-20b", "mxfp4+q8_0", "rtx4090-pcie4", "i9-10900x-ddr4-2933", 24.0,
                "llama.cpp, all on the GPU (tg128)", "resident", {}, (167.0, 173.0), 64,
                "ggml-org/llama.cpp#16649", "check",
                "no host work: checks the device side alone (datasheet bandwidth x format efficiency + kernels)"),
    ConsumerRow("DeepSeek-Coder-V2-Lite Q4_K_M (V2-Lite arch.)", "deepseek-v2-lite", "q4_k_m", "rtx2080-pcie3",
                "i9-10900x-ddr4-2933", 8.0, "llama.cpp --n-cpu-moe 16 (llmfit bench, warmed, context 4096)",
                "static_split", {"layers_on_gpu": 26 - 15}, (49.6, 49.6), 256,
                "AlexsJones/llmfit#778 (RTX 2080 community benchmarks, batches 2 & 3)", "check",
                "--n-cpu-moe 16 counts blocks: block 0 is DeepSeek's dense layer, so 15 of 26 expert layers on the "
                "host; same box as the gpt-oss fit row, another model and placement"),
    ConsumerRow("Qwen3-30B-A3B Q4_K_M", "qwen3-30b-a3b", "q4_k_m", "radeonprow7800", None, 48.0,
                "llama.cpp HIP (RDNA3), all on the GPU (tg128)", "resident", {}, (121.61, 122.31), 64,
                "ggml-org/llama.cpp#24546 (W7800 sweep, tg128 before/after over ubatch 512-8192)", "check",
                "an AMD card: checks the catalog's datasheet bandwidth x format efficiency (measured on NVIDIA) on "
                "RDNA3; no host work"),
    ConsumerRow("Qwen3-30B-A3B-2507 BF16", "qwen3-30b-a3b", "bf16", "rtx5090-pcie5", "epyc-9355-ddr5-6400", 32.0,
                "ktransformers 0.5.2 + SGLang, 28 GPU experts per layer, decode after a 3846-token prompt", "fiddler",
                {"gpu_experts": 28, "by": "index", "overlap": True}, (50.2, 50.2), 3846 + 64,
                "kvcache-ai/ktransformers#1914 (4K column)", "check",
                "the fit row's box and run at a deeper context: checks decode at depth (the fit row is the mean over "
                "its prompt lengths)"),
    ConsumerRow("Qwen3-30B-A3B-2507 BF16", "qwen3-30b-a3b", "bf16", "rtx5090-pcie5", "epyc-9355-ddr5-6400", 32.0,
                "ktransformers 0.5.2 + SGLang, 28 GPU experts per layer, decode after a 7678-token prompt", "fiddler",
                {"gpu_experts": 28, "by": "index", "overlap": True}, (45.8, 45.8), 7678 + 64,
                "kvcache-ai/ktransformers#1914 (8K column)", "check",
                "as above at 8K: the published decode falls 13 % from 1K to 8K; the model's KV read alone moves it "
                "less (a miss it says)"),
)


@lru_cache(maxsize=None)
def _geometry(config: str) -> ModelGeometry:
    return geometry_from_config(config)


def _layers_on_gpu(row: ConsumerRow) -> int:
    """Expert layers on the GPU of a static split: published, or the estimator's VRAM rule."""
    g, p = _geometry(row.config), row.placement
    if p.get("layers_on_gpu") is not None:
        return p["layers_on_gpu"]
    b = vram_budget(g, get_precision(row.weights), row.vram_gib * GiB, p["context"])
    return min(g.moe_layers, int(b.experts // (g.num_experts * b.expert_bytes)))


def _placement_label(row: ConsumerRow) -> str:
    g, p = _geometry(row.config), row.placement
    if row.strategy == "resident":
        return "every expert on the GPU"
    if row.strategy == "fiddler":
        return f"{p['gpu_experts']} of {g.num_experts} experts/layer on the GPU ({p['by']}), host overlapped"
    if "gpu_layers" in p:
        return f"{p['gpu_layers']} of {g.decoder_layers} whole layers on the GPU (-ngl {p['gpu_layers']})"
    return f"experts of {_layers_on_gpu(row)} of {g.moe_layers} MoE layers on the GPU"


def _machine(row: ConsumerRow) -> Machine:
    gpu, card = resolve_gpu(row.gpu)
    return Machine(gpu, row.vram_gib * GiB, get_host(row.host), card)


def _counts(row: ConsumerRow) -> tuple[Counts, dict]:
    """The row's placement as counts per layer, and the pricing options it needs."""
    g, p = _geometry(row.config), row.placement
    L, k = g.moe_layers, g.top_k
    if row.strategy == "resident" or "gpu_layers" in p:
        return resident(L, k), {"gpu_layers": p.get("gpu_layers")}
    if row.strategy == "fiddler":
        return uniform_hot_set(g, p["gpu_experts"]), {"overlap": p.get("overlap", False)}
    on_gpu = _layers_on_gpu(row)
    return static_layers([l >= L - on_gpu for l in range(L)], k), {}


def _priced(row: ConsumerRow, eta: float, scenario: Scenario | None = None) -> float:
    """Simulated ms per token of ``row`` with host efficiency ``eta`` (or at ``scenario``)."""
    g = _geometry(row.config)
    sc = scenario or Scenario(_machine(row), get_precision(row.weights), eta, row.context)
    counts, extra = _counts(row)
    cost = sc.cost(g, extra.get("gpu_layers"))
    return price_token(cost, counts, g.top_k, sc.depth, extra.get("overlap", False)).total_ms


def row_band(row: ConsumerRow, eta: float = HOST_DECODE_EFFICIENCY) -> tuple[float, float, str]:
    """(low, high, dominant unknown) tokens/s of ``row``: the estimate's band on the row's machine, its depth
    known (the row's context)."""
    central = Scenario(_machine(row), get_precision(row.weights), eta, row.context)
    mid = 1e3 / _priced(row, eta, central)
    swings = {u.name: (1e3 / _priced(row, eta, u.slow), 1e3 / _priced(row, eta, u.fast))
              for u in unknowns(central, row.context, depth_given=True)}
    return combine(mid, swings)


def _row_eta(row: ConsumerRow) -> float:
    """The host efficiency at which ``row`` is reproduced exactly (bisection: time falls as eta grows)."""
    target = 1e3 / row.published_mid
    lo, hi = 1e-3, 20.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _priced(row, mid) > target else (lo, mid)
    return math.sqrt(lo * hi)


def derive_host_efficiency(rows: tuple[ConsumerRow, ...] = CONSUMER_ROWS, exclude: int | None = None) -> float:
    """Geometric mean over the ``fit`` rows of the host efficiency each reproduces exactly; ``exclude`` leaves
    that row index out (the leave-one-out check)."""
    etas = [_row_eta(r) for i, r in enumerate(rows) if r.split == "fit" and i != exclude]
    return math.exp(sum(math.log(e) for e in etas) / len(etas))


def simulate_consumer_row(row: ConsumerRow, eta: float = HOST_DECODE_EFFICIENCY) -> float:
    """Simulated tokens/s of one row."""
    return 1e3 / _priced(row, eta)


def consumer_anchors(rows: tuple[ConsumerRow, ...] = CONSUMER_ROWS) -> pd.DataFrame:
    """Published consumer tokens/s vs the estimator's, one row per measurement: ratio (simulated / published
    midpoint), leave-one-out ratio for the fitted rows, the row's own host efficiency, the placement and every
    assumption the row needs."""
    out = []
    for i, r in enumerate(rows):
        sim = simulate_consumer_row(r)
        loo = simulate_consumer_row(r, derive_host_efficiency(rows, exclude=i)) / r.published_mid \
            if r.split == "fit" else None
        lo, hi = r.published_tok_s
        ratio = sim / r.published_mid
        b_lo, b_hi, dominant = row_band(r)
        out.append({
            "model": r.model, "machine": f"{r.gpu} + {r.host or 'host not published'}",
            "host_known": r.host is not None, "engine": r.engine, "strategy": r.strategy,
            "placement": _placement_label(r),
            "published_tok_s": f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}", "published_mid": r.published_mid,
            "simulated_tok_s": sim, "ratio": ratio, "within_30pct": abs(ratio - 1) <= TOLERANCE,
            "in_published_range": lo * (1 - TOLERANCE) <= sim <= hi * (1 + TOLERANCE), "loo_ratio": loo,
            "band_tok_s": f"{b_lo:.3g}-{b_hi:.3g}", "band_low": b_lo, "band_high": b_hi,
            "in_band": b_lo <= hi and lo <= b_hi, "dominant_unknown": dominant, "abs_error": abs(ratio - 1),
            "row_host_efficiency": _row_eta(r) if r.split == "fit" else None, "role": r.role, "split": r.split,
            "weights": r.weights, "source": r.source, "note": r.note,
        })
    return pd.DataFrame(out)


def consumer_summary(df: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``fit`` and ``check`` rows' errors apart: rows, median |simulated / published - 1| (also over the rows
    whose host is published), the largest, and how many published figures (or ranges) meet the printed band
    (``sl.bench.consumer_anchors()`` is ``df``)."""
    df = consumer_anchors() if df is None else df
    out = []
    for split in ("fit", "check"):
        g = df[df.split == split]
        known = g[g.host_known]
        out.append({"split": split, "rows": len(g), "median_abs_error": float(g.abs_error.median()),
                    "median_abs_error_host_known": float(known.abs_error.median()) if len(known) else float("nan"),
                    "max_abs_error": float(g.abs_error.max()), "in_band": int(g.in_band.sum()),
                    "band_coverage": float(g.in_band.mean())})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------ the flags' property

PROPERTY_FAMILIES = ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b")
PROPERTY_MACHINES = (("rtx3060", "ddr4-3200x2"), ("rtx4090", "ddr5-6000x2"), ("rtx2080", "i9-10900x-ddr4-2933"),
                     ("gtx1060", "i5-7600k-ddr4-3000"))


def flag_property(n: int = 1000, seed: int = 0, weights: str = "q4_k_m") -> dict:
    """Random llama.cpp flag sets (:func:`~.flags.random_flags`) over four families and four machines, in pairs:
    where one keeps strictly more on the host than the other, it must not be priced faster on the same clock.
    Returns the pairs drawn, those ordered that way, and the violations (each a flag pair)."""
    import numpy as np

    from .flags import keeps_more_on_host, parse_placement, random_flags

    rng = np.random.default_rng(seed)
    ordered, violations = 0, []
    for i in range(n):
        family = PROPERTY_FAMILIES[i % len(PROPERTY_FAMILIES)]
        gpu, host = PROPERTY_MACHINES[(i // len(PROPERTY_FAMILIES)) % len(PROPERTY_MACHINES)]
        g = _geometry(family)
        a, b = (parse_placement(random_flags(g, rng), g) for _ in range(2))
        if keeps_more_on_host(b, a, g):
            a, b = b, a
        if not keeps_more_on_host(a, b, g):
            continue
        ordered += 1
        profile, card = resolve_gpu(gpu)
        sc = Scenario(Machine(profile, card.vram_gb * GiB, get_host(host), card), get_precision(weights),
                      HOST_DECODE_EFFICIENCY, 4096)
        price = lambda p: price_token(sc.cost(g, p.gpu_layers), static_layers([not h for h in p.host_layers],
                                                                               g.top_k), g.top_k, sc.depth).total_ms
        if price(b) < price(a):
            violations.append((family, gpu, a.flags, b.flags))
    return {"pairs": n, "ordered": ordered, "violations": violations}
