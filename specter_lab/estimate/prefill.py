"""Prefill: time to first token at a stated prompt length, per placement, as a llama.cpp-class engine runs it.

Why placements differ: a prompt is processed in micro-batches (``ubatch``, llama.cpp's default 512 tokens), and at
that size every expert of a layer is routed by some token. llama.cpp then copies an expert tensor that lives in
host memory to the GPU for the micro-batch (its scheduler offloads large-batch ops to the GPU: ``--no-op-offload``
turns that off), so every micro-batch moves the host-held experts over the link once. A placement that keeps more
experts in VRAM moves fewer bytes; an expert cache holds what its slots hold and streams the rest; a placement
that computes on the host (ktransformers' GPU experts) runs those experts' FLOPs on the CPU instead. This is why
expert caches trade prefill for decode (field_2026b.md §0.4, llama.cpp #21067).

Per micro-batch of n tokens (modelled, not measured)::

    gpu     = 2 x n x (dense + top_k x expert params on the GPU path) / (peak FLOP/s x PREFILL_EFFICIENCY)
    link    = host-held expert bytes / link bandwidth        (copied for the micro-batch)
    host    = 2 x n x host-computed expert params / host FLOP/s  (placements that compute on the host)
    ubatch  = max(gpu, link) + host                          (the copy overlaps the previous layer's compute)

Attention's n x depth term is not priced: at long prompts the TTFT is a lower bound (said in the output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..model.geometry import ModelGeometry
from .bands import Scenario
from .budget import VramBudget

__all__ = ["PrefillTime", "prefill_time", "prefill_table", "PREFILL_EFFICIENCY", "PREFILL_EFFICIENCY_RANGE",
           "UBATCH"]

UBATCH = 512
# Fraction of the profile's peak FLOP/s a quantized MoE prefill reaches (small per-expert GEMMs: 512 tokens x top-8
# over 128 experts is ~32 tokens an expert). An assumption, banded wide; the W7800 check row (llama.cpp #24546:
# Qwen3-30B-A3B Q4_K_M pp512 2254-3186 tok/s) sits inside the band.
PREFILL_EFFICIENCY = 0.45
PREFILL_EFFICIENCY_RANGE = (0.25, 0.8)


@dataclass(frozen=True)
class PrefillTime:
    """Seconds to process a prompt, by where they go."""

    gpu_s: float
    link_s: float
    host_s: float
    total_s: float
    prompt: int

    @property
    def tokens_per_s(self) -> float:
        return self.prompt / self.total_s if self.total_s else math.inf


def _host_held(name: str, params: dict, geom: ModelGeometry, budget: VramBudget) -> tuple[float, float]:
    """(expert bytes in host memory copied per micro-batch, share of routed experts computed on the host)."""
    every = budget.experts_total
    if name in ("resident",):
        return 0.0, 0.0
    if name == "static_split":
        return params["n_cpu_moe"] * geom.num_experts * budget.expert_bytes, 0.0
    if name == "yours":
        cached = (params.get("cache_mib") or 0.0) * 2**20
        return max(0.0, params["n_host_layers"] * geom.num_experts * budget.expert_bytes - cached), 0.0
    if name in ("global_lru", "lru", "on_demand"):
        return max(0.0, every - (budget.experts if name != "on_demand" else 0.0)), 0.0
    if name in ("fiddler", "host_lru"):  # the GPU's slots serve their share; the rest run on the host CPU
        share = min(1.0, params.get("slots_per_layer", 0) / geom.num_experts)
        return 0.0, 1.0 - share
    return every - budget.experts, 0.0


def prefill_time(name: str, params: dict, geom: ModelGeometry, budget: VramBudget, sc: Scenario, prompt: int,
                 efficiency: float = PREFILL_EFFICIENCY, ubatch: int = UBATCH) -> PrefillTime:
    """Modelled prefill of ``prompt`` tokens for placement ``name`` (its ``params`` as the estimate placed it)."""
    m = sc.machine
    copied, on_host = _host_held(name, params, geom, budget)
    routed = geom.moe_layers * geom.top_k * geom.expert_params
    gpu = link = host = total = 0.0
    for start in range(0, prompt, ubatch):
        n = min(ubatch, prompt - start)
        gpu_n = 2.0 * n * (geom.dense_params + routed * (1 - on_host)) / (m.gpu.peak_flops * efficiency)
        link_n = copied / m.gpu.pcie_bandwidth
        host_n = 2.0 * n * routed * on_host / m.host_flops
        gpu, link, host = gpu + gpu_n, link + link_n, host + host_n
        total += max(gpu_n, link_n) + host_n  # the copy overlaps compute; the host's share follows it
    return PrefillTime(gpu, link, host, total, prompt)


def prefill_table(e, prompt: int) -> pd.DataFrame:  # e: an estimate.core.Estimate
    """TTFT and prefill tokens/s of every placement in ``e`` at a ``prompt``-token prompt, with a band over the
    prefill efficiency and the link bandwidth, and the decode tokens/s beside it (what each placement trades)."""
    if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 1:
        raise ValueError(f"prompt={prompt!r}: give the prompt length in tokens, an integer >= 1 (e.g. 2048).")
    central = e._inputs["central"]
    link_unknown = next((u for u in e._inputs["unknowns"] if u.name == "link bandwidth"), None)
    rows = []
    for name in e.table.strategy:
        params = e.placements.get(name, {})
        t = prefill_time(name, params, e.model, e.budget, central, prompt)
        slow = prefill_time(name, params, e.model, e.budget, link_unknown.slow if link_unknown else central, prompt,
                            PREFILL_EFFICIENCY_RANGE[0])
        fast = prefill_time(name, params, e.model, e.budget, link_unknown.fast if link_unknown else central, prompt,
                            PREFILL_EFFICIENCY_RANGE[1])
        rows.append({"strategy": name, "ttft_s": t.total_s, "ttft_band_s": f"{fast.total_s:.3g}-{slow.total_s:.3g}",
                     "prefill_tok_s": t.tokens_per_s, "gpu_s": t.gpu_s, "link_s": t.link_s, "host_s": t.host_s,
                     "decode_tok_s": float(e.row(name).tokens_per_s)})
    return pd.DataFrame(rows).sort_values("ttft_s", kind="stable").reset_index(drop=True)
