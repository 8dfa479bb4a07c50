"""Prefill: time to first token at a stated prompt length, per row, as a replay of the prompt on the estimate's own
clock.

Why rows differ: a prompt is processed in micro-batches (``ubatch``, llama.cpp's default 512 tokens), and at that
size nearly every expert of a layer is routed by some token. The runtime copies each missing expert for the
micro-batch (as llama.cpp's scheduler offloads large-batch expert ops to the GPU, copying host-held experts per
micro-batch), so a row that keeps more experts in VRAM moves fewer bytes, and compute-bound expert matmuls run at
the clock's prefill efficiency (:data:`~specter_lab.pricing.llamacpp.PREFILL_EFFICIENCY`). Each row is replayed on
one micro-batch of synthetic routing (at the prompt's length, up to ``ubatch``) and its prefill time is scaled to
the prompt's micro-batches. This is why expert caches trade prefill for decode (field_2026b.md §0.4, llama.cpp
#21067). Modelled, not measured: the micro-batches after the first are priced as the first (their KV grows).
"""

from __future__ import annotations

import math

import pandas as pd
from tqdm.auto import tqdm

from ..analysis.replay import replay
from .workload import workload

__all__ = ["prefill_table", "UBATCH"]

UBATCH = 512


def prefill_table(e, prompt: int, progress: bool = False) -> pd.DataFrame:  # e: an estimate.core.Estimate
    """TTFT and prefill tokens/s of every row of ``e`` at a ``prompt``-token prompt, beside its decode tokens/s (what
    each row trades). The user's row uses its own ``-ub``."""
    if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 1:
        raise ValueError(f"prompt={prompt!r}: give the prompt length in tokens, an integer >= 1 (e.g. 2048).")
    wl = e.workload
    cache: dict[int, object] = {}
    rows = []
    for name in tqdm(list(e.table.strategy), desc="estimate: prefill", unit="row", disable=not progress):
        strategy = e.replayed_strategy(name)
        yours = e._inputs.get("yours") if name == "yours" else None
        ub = (yours.ubatch if yours is not None and yours.ubatch else UBATCH)
        batch = min(prompt, ub)
        if batch not in cache:  # one micro-batch of routing (2 decode rows: the replay needs a decode to start)
            cache[batch] = workload(e.model, wl.trace.config, wl.draft_bits, None, prompt=batch, tokens=2).trace
        (r,) = replay(cache[batch], strategy, **e.replay_options(name))
        batches = prompt / batch  # whole and partial micro-batches, each priced as the first
        ttft = r.metrics["prefill_ms"] * batches / 1e3
        rows.append({"strategy": name, "ttft_s": ttft, "prefill_tok_s": prompt / ttft if ttft else math.inf,
                     "micro_batch": batch, "decode_tok_s": float(e.row(name).tokens_per_s)})
    return pd.DataFrame(rows).sort_values("ttft_s", kind="stable").reset_index(drop=True)
