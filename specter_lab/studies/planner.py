"""The planner: pick the fastest lossless configuration for *this* model, budget and link, and say why.

``plan`` calibrates on a few prompts that are not the evaluation prompts: it simulates every candidate
(no speculation; and speculation with each draft variant, bit width and K) on the cost model of the chosen
hardware, under the same expert budget, and records what decides the outcome — hit rate for the slots left,
acceptance, routing recall, mean draft length, stall per token. It returns its choice with the whole table of
predicted TPOT, so the choice can be read, not just trusted. ``Engine.from_plan(model, tok, plan)`` builds the
chosen engine; ``strategy="auto"`` is shorthand for both.

The predictions are the simulator's, on calibration prompts: the evaluated TPOT can differ (other prompts), which
the regime map measures. On a live model most candidates are replays of its routing over those prompts, recorded
once (draft chains as far as a candidate asks: :mod:`~specter_lab.studies.calibration`), which give every figure a
live run gives; the candidates whose draft reads the cache run live.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..run.assembly import uses_gate_predictions
from ..run.drafts import DraftSpec, as_draft_spec
from ..run.engine import register_auto_planner
from ..model import inspect_model
from .prompts import calibration_prompts
from ..predict import KGovernor
from ..run.quant import QuantSpec
from ..analysis.bound import bound_tpots
from ..analysis.replay import skeleton
from ..traces.trace_file import RoutingTrace
from .calibration import ReplayedLiveSource, as_source
from .runs import SKIPPED, Cell, PromptRuns, run_cells, sweep_executor
from ..run.strategies import (BASELINES, NOT_CANDIDATES, PLANNER_MARGIN, STRATEGIES, get_strategy,
                              planner_choice)

__all__ = ["Plan", "plan", "default_candidates", "regime_map"]


@dataclass
class Plan:
    """The planner's choice, what it was planned for, and the table it chose from (one row per candidate,
    sorted by predicted TPOT)."""

    strategy: str
    options: dict[str, Any]
    predicted_tpot_ms: float
    table: pd.DataFrame = field(repr=False)
    label: str = ""
    expert_budget: Any = None
    hardware: Any = None
    cost_shape: str | None = None

    def engine_kwargs(self) -> dict[str, Any]:
        return {"strategy": self.strategy, **self.options}

    def _repr_html_(self) -> str:
        head = f"<b>plan:</b> {self.label} — predicted TPOT {self.predicted_tpot_ms:.3f} ms"
        return head + self.table.to_html(index=False, float_format=lambda v: f"{v:.3f}")


def candidate_strategies() -> tuple[list[str], list[str]]:
    """(non-speculative rows, speculative rows searched over draft × K), in the table's order."""
    rows = [n for n in STRATEGIES if n not in NOT_CANDIDATES]
    plain = [n for n in rows if not STRATEGIES[n].speculative]
    searched = [n for n in rows if STRATEGIES[n].speculative]
    return plain, searched


def default_candidates(num_experts: int, draft=None, k: "int | str | None" = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, strategy, engine options). No speculation, then speculation with each draft variant × K.

    ``draft`` / ``k`` pin the speculative candidates to the caller's draft and draft length (the planner then
    only decides *whether* to speculate, and with what split)."""
    plain, searched = candidate_strategies()
    cands: list[tuple[str, str, dict[str, Any]]] = [(s, s, {}) for s in plain]
    drafts = [
        ("int4", DraftSpec("quantized", QuantSpec(4, 64))),
        ("int3", DraftSpec("quantized", QuantSpec(3, 64))),  # fits at a quarter of the experts, where int4 does not
        ("int2", DraftSpec("quantized", QuantSpec(2, 64))),
        ("resident", DraftSpec("resident")),
        ("hybrid-int2", DraftSpec("hybrid", QuantSpec(2, 64), max(1, num_experts // 8))),
    ]
    if draft is not None:
        d = as_draft_spec(draft)
        drafts = [(d.label, d)]
    # k=1 wins when copies dominate; 8 is the paper's; "auto" is the governor.
    ks = (1, 4, 8, "auto") if k is None else (k,)
    for s in searched:
        st = STRATEGIES[s]
        if st.miss == "copy":  # every draft variant × K
            cands += [(f"spec {dname} k={kk}", s, {"draft": d, "k": kk}) for dname, d in drafts for kk in ks]
            continue
        # speculation + host execution of what the forecast missed, with every low-bit draft (a small budget holds
        # only the smaller ones): the one-offs on the host (miss="host"), or the window's copies as the link allows
        # and the rest split by lane (miss="balance"), which also tries K=2 beside the governor: a 2-bit draft's
        # short accepted runs want short windows (docs/measured/closer_to_bound.md)
        host = st.miss == "host"
        for dname, d in drafts:
            if d.variant != "quantized":
                continue
            kks = ks[-2:] if host else (ks if k is not None else _split_ks(d, ks[-1]))
            cands += [(f"{'spec+host' if host else 'spec+split'} {dname} k={kk}", s, {"draft": d, "k": kk})
                      for kk in kks]
    return cands


def _split_ks(draft: DraftSpec, governor) -> tuple:
    """The split's K when the caller pins none: 2 and the governor for every draft, and also 8 and 16 for one of
    4 bits or more, whose long accepted runs pay for a long window: on a copy-bound link its verification reads
    each host expert once for the whole window (docs/paper.md's low compiled case, where K=16 is the pick). Not
    for 2 or 3 bits: there long windows lost in every cell measured and cost ~15 % more planning time."""
    long = (8, 16) if draft.quant.bits >= 4 else ()
    return (2, *long, governor)


def _replayable(cand, trace: RoutingTrace) -> bool:
    """Can ``trace`` replay this candidate? (Its own quantized draft, K up to its chains; speculation needs chains.)"""
    _, strategy, opts = cand
    if uses_gate_predictions(get_strategy(strategy)):
        return trace.gated  # an import holds them only when modelled
    if not get_strategy(strategy).speculative:
        return True
    d, kk = opts.get("draft"), opts.get("k", get_strategy(strategy).k)
    rec = trace.draft or {}
    recorded = QuantSpec(rec["bits"], rec["group_size"], rec["method"]) if "bits" in rec else None
    k_need = KGovernor().k_max if kk == "auto" else kk
    return (trace.speculative and d is not None and d.recordable and d.quant == recorded
            and k_need <= trace.k_max)


def plan(model, tokenizer, hardware="rtx4090-pcie4", expert_budget=0.5, prompts: Sequence | None = None,
         cost_shape: str | None = None, max_new_tokens: int = 32, candidates=None, progress: bool = True,
         margin: float = PLANNER_MARGIN, draft=None, k: "int | str | None" = None, trace: RoutingTrace | None = None,
         executor: "Executor | str | None" = "auto") -> Plan:
    """Choose strategy, draft variant, bits, K and slot split for this model, budget and hardware.

    ``draft=`` / ``k=`` fix the speculative candidates' draft and K (see :func:`default_candidates`); they
    cannot be combined with ``candidates=``.

    A speculative candidate is chosen only if its predicted TPOT beats the best non-speculative one by
    ``margin`` (10 %): calibration is a few short runs, and a near-tie does not survive other prompts.

    ``trace=``: calibrate by replaying a recorded or imported routing trace (seconds; ``model`` may be None) — its
    sequences are then both what the plan is chosen on and what it predicts, so record it on prompts apart from
    the ones you will judge the plan by. Candidates a trace cannot replay (draft variants that depend on the
    cache, K beyond its chains) are rows that say so, and the table gains ``x_of_bound``: the autoregressive
    bound's mean TPOT over the trace at this memory over each candidate's predicted TPOT (as ``bench`` reads
    rows; a speculative candidate may exceed 1). ``executor=``: the candidates on any Executor (``"auto"``: a
    local process pool on a trace, :func:`~specter_lab.studies.runs.run_cells`)."""
    if trace is not None:
        info = inspect_model(skeleton(trace.config))
        source = as_source(None, tokenizer, prompts, max_new_tokens, trace)
    else:
        info = inspect_model(model)
        calib = list(prompts) if prompts is not None else calibration_prompts(tokenizer, vocab=info.vocab)
        # each candidate's calibration runs as a replay of the model's routing where that is the live run
        source = ReplayedLiveSource(model, tokenizer, calib, max_new_tokens)
    if not source.prompts:
        raise ValueError("prompts is empty: the planner needs at least one calibration prompt.")
    if candidates is not None and (draft is not None or k is not None):
        raise ValueError("draft=/k= pin the default candidates; with candidates= put them in each candidate's options.")
    candidates = candidates or default_candidates(info.num_experts, draft=draft, k=k)
    rows = []
    if trace is not None:  # what this trace cannot replay is a row that says so
        rows += [{"candidate": c[0], "feasible": False, "why": "not replayable from this trace (its draft chains "
                  f"are {trace.draft or 'absent'}, k_max={trace.k_max}"
                  f"{'' if trace.gated else '; no gate predictions'}): plan live for it"}
                 for c in candidates if not _replayable(c, trace)]
        candidates = [c for c in candidates if _replayable(c, trace)]
    cells = [Cell.of(strategy, expert_budget=expert_budget, hardware=hardware, cost_shape=cost_shape, **opts)
             for _, strategy, opts in candidates]
    results = run_cells(source, cells, executor, progress, "plan")
    for (label, strategy, opts), runs in zip(candidates, results):
        if isinstance(runs, SKIPPED):  # e.g. the budget cannot hold this draft: not a candidate here
            rows.append({"candidate": label, "feasible": False, "why": runs.label})
            continue
        rows.append(_row(label, strategy, opts, runs))
    table = pd.DataFrame(rows)
    if trace is not None:  # how far each candidate is from the best any autoregressive schedule does here
        table["x_of_bound"] = _bound_ms(trace, expert_budget, hardware, cost_shape) / table.predicted_tpot_ms
    feas = table[table.feasible]
    if feas.empty:
        raise ValueError(f"expert_budget={expert_budget!r} is too small for every candidate; give more memory.")
    best = _choose(feas.sort_values("predicted_tpot_ms"), margin)
    shown = table.drop(columns=[c for c in ("_strategy", "_opts") if c in table]).sort_values(
        "predicted_tpot_ms", na_position="last").reset_index(drop=True)
    return Plan(best["_strategy"], dict(best["_opts"]), float(best.predicted_tpot_ms), shown, best.candidate,
                expert_budget=expert_budget, hardware=hardware, cost_shape=cost_shape)


def _bound_ms(trace: RoutingTrace, expert_budget, hardware, cost_shape) -> float:
    """The autoregressive bound's mean TPOT over the trace's sequences (NaN where the budget holds no slot)."""
    tpots = bound_tpots(trace, expert_budget, hardware, cost_shape)
    return float(np.mean(tpots)) if tpots else float("nan")


def _choose(ranked: pd.DataFrame, margin: float) -> pd.Series:
    """The candidate :func:`~specter_lab.run.strategies.planner_choice` picks of ``ranked`` (fastest first)."""
    return ranked.iloc[planner_choice(list(zip(ranked._strategy, ranked.predicted_tpot_ms)), margin)]


def _row(label: str, strategy: str, opts: dict, runs: PromptRuns) -> dict[str, Any]:
    """One candidate's line in the plan table: its predicted TPOT and what explains it."""
    return {"candidate": label, "feasible": True, "predicted_tpot_ms": runs.mean("tpot_ms"),
            "slots_per_layer": runs.first("slots_per_layer"), "draft_bytes": runs.first("draft_bytes"),
            **runs.means(("hit_rate", "acceptance_rate", "recall", "mean_k", "stall_ms_per_token")),
            "_strategy": strategy, "_opts": opts}


def regime_map(model, tokenizer, prompts, budgets=(0.25, 0.35, 0.5, 0.75, 1.0),
               hardware=("rtx4090-pcie4", "a100-40g-pcie4"), cost_shapes=("deepseek-v2-lite", "mixtral-8x7b"),
               max_new_tokens: int = 32, progress: bool = True, trace: RoutingTrace | None = None,
               executor: "Executor | str | None" = "auto") -> pd.DataFrame:
    """Speedup of faithful ``specter`` and of ``auto`` over the best baseline, per budget × profile × shape.

    ``auto`` plans on calibration prompts (not ``prompts``), then is evaluated on ``prompts`` like the others.
    ``trace=``: every cell replayed from it (``model``/``prompts`` None), ``auto`` planned on the same trace;
    ``executor=``: the cells on any Executor (``"auto"``: one local process pool for every plan and cell on a
    trace)."""
    grid = [(b, h, c) for c in cost_shapes for h in hardware for b in budgets]
    source = as_source(model, tokenizer, prompts, max_new_tokens, trace)
    with sweep_executor(source, len(grid) * (len(BASELINES) + 2), executor) as ex:
        plans = {}
        for b, h, c in tqdm(grid, desc="regimes (auto plans)", disable=not progress):
            try:
                plans[(b, h, c)] = plan(model, tokenizer, h, b, cost_shape=c, progress=False, trace=trace,
                                        executor=ex)
            except ValueError:  # too small for every candidate
                plans[(b, h, c)] = None
        names = (*BASELINES, "specter")
        cells = [Cell.of(s, expert_budget=b, hardware=h, cost_shape=c) for b, h, c in grid for s in names]
        cells += [Cell.of(p.strategy, expert_budget=b, hardware=h, cost_shape=c, **p.options)
                  for (b, h, c), p in plans.items() if p is not None]
        results = dict(zip(cells, run_cells(source, cells, ex, progress, "regimes")))
    rows = []
    for b, h, c in grid:
        tpot = {s: _mean_tpot(results[Cell.of(s, expert_budget=b, hardware=h, cost_shape=c)]) for s in names}
        p = plans[(b, h, c)]
        tpot["auto"] = np.nan if p is None else _mean_tpot(
            results[Cell.of(p.strategy, expert_budget=b, hardware=h, cost_shape=c, **p.options)])
        label = None if p is None else p.label
        base = {k: v for k, v in tpot.items() if k in BASELINES and not np.isnan(v)}
        best = min(base, key=base.get)
        rows.append({"cost_shape": c, "hardware": h, "expert_budget": b, "best_baseline": best,
                     "best_baseline_tpot": base[best], "specter_tpot": tpot["specter"], "auto_tpot": tpot["auto"],
                     "auto_choice": label,
                     "speedup_specter": base[best] / tpot["specter"], "speedup_auto": base[best] / tpot["auto"],
                     "routing": source.label})
    return pd.DataFrame(rows)


def _mean_tpot(runs) -> float:
    return np.nan if isinstance(runs, SKIPPED) else runs.mean("tpot_ms")


register_auto_planner(plan)
