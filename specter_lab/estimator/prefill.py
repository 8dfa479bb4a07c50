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

from ..analysis.pool import cores, install, installed, process_pool
from ..analysis.replay import replay
from .workload import workload

__all__ = ["prefill_table", "UBATCH"]

UBATCH = 512


def prefill_table(e, prompt: int, progress: bool = False) -> pd.DataFrame:  # e: an estimate.core.Estimate
    """TTFT and prefill tokens/s of every row of ``e`` at a ``prompt``-token prompt, beside its decode tokens/s (what
    each row trades). The user's row uses its own ``-ub``. The rows are replayed on a local process pool when there
    is more than one core (the figures are the same)."""
    if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 1:
        raise ValueError(f"prompt={prompt!r}: give the prompt length in tokens, an integer >= 1 (e.g. 2048).")
    wl, names = e.workload, list(e.table.strategy)
    batch = {name: min(prompt, _ubatch(e, name)) for name in names}
    # one micro-batch of routing per size (2 decode rows: the replay needs a decode to start)
    traces = {b: workload(e.model, wl.trace.config, wl.draft_bits, None, prompt=b, tokens=2).trace
              for b in sorted(set(batch.values()))}
    tasks = [(batch[name], e.replayed_strategy(name), e.replay_options(name)) for name in names]
    rows = []
    for name, prefill_ms in zip(names, _replay_all(traces, tasks, progress)):
        ttft = prefill_ms * (prompt / batch[name]) / 1e3  # whole and partial micro-batches, each priced as the first
        rows.append({"strategy": name, "ttft_s": ttft, "prefill_tok_s": prompt / ttft if ttft else math.inf,
                     "micro_batch": batch[name], "decode_tok_s": float(e.row(name).tokens_per_s)})
    return pd.DataFrame(rows).sort_values("ttft_s", kind="stable").reset_index(drop=True)


def _ubatch(e, name: str) -> int:
    yours = e._inputs.get("yours") if name == "yours" else None
    return yours.ubatch if yours is not None and yours.ubatch else UBATCH


def _replay_all(traces: dict, tasks: list[tuple[int, str, dict]], progress: bool) -> list[float]:
    """Each (micro-batch, strategy, options)'s prefill ms, here or on a pool (each worker holds ``traces``)."""
    n = min(len(tasks), cores())
    bar = dict(total=len(tasks), desc="estimate: prefill", unit="row", disable=not progress)
    if n <= 1 or installed() is not None:
        return list(tqdm((_prefill_ms(traces, *task) for task in tasks), **bar))
    with process_pool(n, install, (traces,)) as pool:
        return list(tqdm(pool.map(_prefill_installed, tasks, chunksize=1), **bar))


def _prefill_installed(task: tuple[int, str, dict]) -> float:
    return _prefill_ms(installed(), *task)


def _prefill_ms(traces: dict, batch: int, strategy: str, options: dict) -> float:
    (r,) = replay(traces[batch], strategy, **options)
    return r.metrics["prefill_ms"]
