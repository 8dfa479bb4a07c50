"""The planner: pick the fastest lossless configuration for *this* model, budget and link, and say why.

``plan`` calibrates on a few prompts that are not the evaluation prompts: it simulates every candidate
(no speculation; and speculation with each draft variant, bit width and K) on the cost model of the chosen
hardware, under the same expert budget, and records what decides the outcome — hit rate for the slots left,
acceptance, routing recall, mean draft length, stall per token. It returns its choice with the whole table of
predicted TPOT, so the choice can be read, not just trusted. ``strategy="auto"`` uses it.

The predictions are the simulator's, on calibration prompts: the evaluated TPOT can differ (other prompts), which
the regime map measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import warnings

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .drafts import DraftSpec, as_draft_spec
from .quant import QuantSpec
from .strategies import get_strategy

__all__ = ["Plan", "plan", "default_candidates", "calibration_prompts", "regime_map"]


@dataclass
class Plan:
    """The planner's choice and the table it chose from (one row per candidate, sorted by predicted TPOT)."""

    strategy: str
    options: dict[str, Any]
    predicted_tpot_ms: float
    table: pd.DataFrame = field(repr=False)
    label: str = ""

    def engine_kwargs(self) -> dict[str, Any]:
        return {"strategy": self.strategy, **self.options}

    def _repr_html_(self) -> str:
        head = f"<b>plan:</b> {self.label} — predicted TPOT {self.predicted_tpot_ms:.3f} ms"
        return head + self.table.to_html(index=False, float_format=lambda v: f"{v:.3f}")


def default_candidates(num_experts: int, draft=None, k: "int | str | None" = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, strategy, engine options). No speculation, then speculation with each draft variant × K.

    ``draft`` / ``k`` pin the speculative candidates to the caller's draft and draft length (the planner then
    only decides *whether* to speculate, and with what split)."""
    cands: list[tuple[str, str, dict[str, Any]]] = [
        ("lru", "lru", {}),
        ("gate_lookahead", "gate_lookahead", {}),
    ]
    drafts = [
        ("int4", DraftSpec("quantized", QuantSpec(4, 64))),
        ("int2", DraftSpec("quantized", QuantSpec(2, 64))),
        ("resident", DraftSpec("resident")),
        ("hybrid-int2", DraftSpec("hybrid", QuantSpec(2, 64), max(1, num_experts // 8))),
    ]
    if draft is not None:
        d = as_draft_spec(draft)
        drafts = [(d.label, d)]
    # k=1 wins when copies dominate; 8 is the paper's; "auto" (the governor) went to K≈10 on the bundled model.
    ks = (1, 4, 8, "auto") if k is None else (k,)
    for dname, d in drafts:
        for kk in ks:
            cands.append((f"spec {dname} k={kk}", "specter_plus", {"draft": d, "k": kk}))
    return cands


def calibration_prompts(tokenizer, n: int = 2, vocab: int = 256) -> list:
    """Held-out prompts the benchmark does not use (the last ones of the shipped set); ids without tokenizer."""
    from .bench import heldout_prompts

    if tokenizer is None:
        rng = np.random.default_rng(0)
        return [rng.integers(3, vocab, size=12).tolist() for _ in range(n)]
    return heldout_prompts()[-n:]


def plan(model, tokenizer, hardware="rtx4090-pcie4", expert_budget=0.5, prompts: Sequence | None = None,
         cost_shape: str | None = None, max_new_tokens: int = 32, candidates=None, progress: bool = True,
         margin: float = 0.1, draft=None, k: "int | str | None" = None) -> Plan:
    """Choose strategy, draft variant, bits, K and slot split for this model, budget and hardware.

    ``draft=`` / ``k=`` fix the speculative candidates' draft and K (see :func:`default_candidates`); they
    cannot be combined with ``candidates=``.

    A speculative candidate is chosen only if its predicted TPOT beats the best non-speculative one by
    ``margin`` (10 %): calibration is a few short runs, and a near-tie does not survive other prompts."""
    from .engine import Engine
    from .model import inspect_model

    info = inspect_model(model)
    prompts = list(prompts) if prompts is not None else calibration_prompts(tokenizer, vocab=info.vocab)
    if not prompts:
        raise ValueError("prompts is empty: the planner needs at least one calibration prompt.")
    if candidates is not None and (draft is not None or k is not None):
        raise ValueError("draft=/k= pin the default candidates; with candidates= put them in each candidate's options.")
    candidates = candidates or default_candidates(info.num_experts, draft=draft, k=k)
    rows = []
    for label, strategy, opts in tqdm(candidates, desc="plan", disable=not progress):
        try:
            eng = Engine(model, tokenizer, strategy, expert_budget=expert_budget, hardware=hardware,
                         cost_shape=cost_shape, **opts)
        except ValueError as e:  # e.g. the budget cannot hold this draft: not a candidate here
            rows.append({"candidate": label, "feasible": False, "why": str(e).split(":")[0]})
            continue
        ms = [eng.generate(p, max_new_tokens=max_new_tokens).metrics for p in prompts]
        rows.append(_row(label, strategy, opts, ms))
    table = pd.DataFrame(rows)
    feas = table[table.feasible]
    if feas.empty:
        raise ValueError(f"expert_budget={expert_budget!r} is too small for every candidate; give more memory.")
    ranked = feas.sort_values("predicted_tpot_ms")
    best = ranked.iloc[0]
    plain = ranked[~ranked._strategy.map(lambda s: get_strategy(s).speculative)]
    if len(plain) and best._strategy != plain.iloc[0]._strategy and \
            best.predicted_tpot_ms > (1 - margin) * plain.iloc[0].predicted_tpot_ms:
        # Speculation must win by a margin on the calibration prompts: a few short calibration runs are noisy,
        # and a near-tie there became a loss on other prompts in the regime map.
        best = plain.iloc[0]
    shown = table.drop(columns=[c for c in ("_strategy", "_opts") if c in table]).sort_values(
        "predicted_tpot_ms", na_position="last").reset_index(drop=True)
    return Plan(best["_strategy"], dict(best["_opts"]), float(best.predicted_tpot_ms), shown, best.candidate)


def _row(label: str, strategy: str, opts: dict, ms: list[dict]) -> dict[str, Any]:
    """One candidate's line in the plan table: its predicted TPOT and what explains it."""

    def mean(key: str) -> float:
        vals = [m.get(key, np.nan) for m in ms]
        with warnings.catch_warnings():  # all-NaN columns (e.g. acceptance without speculation) stay NaN quietly
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(np.nanmean(vals))

    return {"candidate": label, "feasible": True, "predicted_tpot_ms": mean("tpot_ms"),
            "slots_per_layer": ms[0]["slots_per_layer"], "draft_bytes": ms[0]["draft_bytes"],
            "hit_rate": mean("hit_rate"), "acceptance_rate": mean("acceptance_rate"), "recall": mean("recall"),
            "mean_k": mean("mean_k"), "stall_ms_per_token": mean("stall_ms_per_token"),
            "_strategy": strategy, "_opts": opts}


def regime_map(model, tokenizer, prompts, budgets=(0.25, 0.35, 0.5, 0.75, 1.0),
               hardware=("rtx4090-pcie4", "a100-40g-pcie4"), cost_shapes=("deepseek-v2-lite", "mixtral-8x7b"),
               max_new_tokens: int = 32, progress: bool = True) -> pd.DataFrame:
    """Speedup of faithful ``specter`` and of ``auto`` over the best baseline, per budget × profile × shape.

    ``auto`` plans on calibration prompts (not ``prompts``), then is evaluated on ``prompts`` like the others."""
    from .bench import BASELINES
    from .engine import Engine

    rows = []
    cells = [(b, h, c) for c in cost_shapes for h in hardware for b in budgets]
    for b, h, c in tqdm(cells, desc="regimes", disable=not progress):
        tpot = {}
        for s in (*BASELINES, "specter", "auto"):
            try:
                eng = Engine(model, tokenizer, s, expert_budget=b, hardware=h, cost_shape=c)
            except ValueError:
                tpot[s] = np.nan  # budget too small for this strategy's draft
                continue
            if s == "auto":
                tpot["_auto_label"] = eng.plan.label
            tpot[s] = float(np.mean([eng.generate(p, max_new_tokens=max_new_tokens).metrics["tpot_ms"]
                                     for p in prompts]))
        base = {k: v for k, v in tpot.items() if k in BASELINES and not np.isnan(v)}
        label = tpot.pop("_auto_label", None)
        best = min(base, key=base.get)
        rows.append({"cost_shape": c, "hardware": h, "expert_budget": b, "best_baseline": best,
                     "best_baseline_tpot": base[best], "specter_tpot": tpot["specter"], "auto_tpot": tpot["auto"],
                     "auto_choice": label,
                     "speedup_specter": base[best] / tpot["specter"], "speedup_auto": base[best] / tpot["auto"]})
    return pd.DataFrame(rows)
