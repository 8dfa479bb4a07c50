"""How well a quantized draft imitates the target, without any caching in the way: routing recall, next-token
agreement, speculative acceptance, size and reconstruction error, teacher-forced on the target's own text."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..run.engine import Engine
from ..model import attached, inspect_model
from ..model.experts import exact_forward
from .prompts import heldout_prompts
from ..run.quant import DraftExperts, QuantSpec
from .runs import run_prompts

__all__ = ["fidelity", "teacher_forced"]


class _Probe:
    """A minimal runtime for teacher-forced passes: target (exact) or draft experts; records routing."""

    def __init__(self, info, draft: DraftExperts | None) -> None:
        self.info = info
        self.draft = draft
        self.routing: dict[int, np.ndarray] = {}

    def experts_forward(self, layer, mod, x, idx, w):
        self.routing[layer] = idx.detach().cpu().numpy()
        names = self.info.layers[layer].param_names
        if self.draft is None:
            return exact_forward(mod, x, idx, w, lambda e: {n: getattr(mod, n)[e].to(x.device) for n in names},
                                 self.routing[layer])
        return exact_forward(mod, x, idx, w, lambda e: self.draft.weights(layer, e), self.routing[layer])


def teacher_forced(model, info, ids: list[int], draft: DraftExperts | None):
    """(next-token argmax per position, routing per layer) of the target (``draft=None``) or the draft on ids."""
    probe = _Probe(info, draft)
    device = model.get_input_embeddings().weight.device
    with attached(model, info, probe), torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0]
    return logits.argmax(-1).cpu(), probe.routing


def _agreement(seqs, targets, model, info, draft) -> tuple[float, float]:
    """(routing recall, token agreement) of ``draft`` over the generated part of each sequence."""
    inter = total = agree = n_tok = 0
    for (n_prompt, seq), (t_next, t_route) in zip(seqs, targets):
        d_next, d_route = teacher_forced(model, info, seq, draft)
        sl = slice(n_prompt - 1, len(seq) - 1)  # predictions of the generated tokens
        agree += int((d_next[sl] == t_next[sl]).sum())
        n_tok += sl.stop - sl.start
        for layer, t_idx in t_route.items():
            for a, b in zip(t_idx[n_prompt - 1:], d_route[layer][n_prompt - 1:]):
                inter += len(set(a.tolist()) & set(b.tolist()))
                total += len(a)
    return inter / total, agree / n_tok


def fidelity(model, tokenizer, prompts: Sequence | None = None, specs: Sequence[QuantSpec] | None = None,
             max_new_tokens: int = 32, acceptance: bool = True, k: int = 8, progress: bool = True) -> pd.DataFrame:
    """How well each quantized draft imitates the target: routing recall (|draft top-k ∩ target top-k| / k per
    token and layer), next-token agreement, speculative acceptance, draft bytes and reconstruction error.

    Teacher-forced on the target's own greedy continuation of each prompt, so both see the same tokens."""
    info = inspect_model(model)
    if specs is None:
        specs = [QuantSpec(b, g, m) for m in ("rtn", "hqq") for b in (2, 3, 4, 8) for g in (32, 64, 128)]
    for s in specs:
        if not isinstance(s, QuantSpec):
            raise TypeError(f"specs must hold sl.QuantSpec, got {s!r}")
    prompts = list(prompts) if prompts is not None else heldout_prompts(4)
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt.")
    ref = Engine(model, tokenizer, "lru", expert_budget=1.0)
    seqs = []
    for p in prompts:
        ids = ref.encode(p)
        seqs.append((len(ids), ids + ref.generate(ids, max_new_tokens=max_new_tokens).token_ids))
    targets = [teacher_forced(model, info, seq, None) for _, seq in seqs]
    rows = []
    for spec in tqdm(specs, desc="fidelity", disable=not progress):
        t0 = time.perf_counter()
        draft = DraftExperts(info, spec)
        q_time = time.perf_counter() - t0
        recall, agreement = _agreement(seqs, targets, model, info, draft)
        row = {"bits": spec.bits, "group_size": spec.group_size, "method": spec.method,
               "routing_recall": recall, "token_agreement": agreement,
               "draft_bytes": draft.packed_bytes, "fp16_fraction": draft.fp16_ratio,
               "rel_error": draft.rel_error, "quantize_s": q_time}
        if acceptance:
            eng = Engine(model, tokenizer, "spec_lru", expert_budget=1.0, draft=spec, k=k)
            eng.use_draft(draft)  # the experts measured above: not quantized twice
            row["acceptance_rate"] = run_prompts(eng, prompts, max_new_tokens).mean("acceptance_rate")
        rows.append(row)
    return pd.DataFrame(rows)
