"""The benchmark harness: every strategy in one run, at equal device memory, against the oracle bound, on named
hardware; ablations and the K sweep; the CPU wall-clock overhead against HF.

Times from a simulated profile are model outputs, labelled ``simulated`` (and ``projected`` with a cost shape);
every row names its profile, its execution mode (``eager``: host dispatch priced per aten op; ``compiled``:
the graphs / compile what-if) and its projection. Only ``hardware="cuda"`` measures speed. :func:`published`
holds the simulator against published batch-1 measurements.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..run.engine import Engine
from .fidelity import fidelity
from ..offload.clock import is_measured, make_clock
from ..pricing.shapes import get_cost_shape
from .prompts import heldout_prompts
from ..estimator.consumer import consumer_anchors
from ..pricing.published import published
from .reproduce import paper_equal_memory, paper_header, paper_prompts, paper_waterfall, reproduce_paper
from ..run.quant import QuantSpec
from ..analysis.bound import bound_tpots, x_of_bound
from ..analysis.gap import cell_gaps
from ..traces.trace_file import RoutingTrace
from . import planner  # noqa: F401  a sweep's strategy="auto" cells plan with sl.plan, registered on import
from .calibration import ReplayedLiveSource, as_source
from .results_file import sweep_results
from .runs import SKIPPED, Cell, DoesNotFit, PromptRuns, run_cells, run_prompts, sweep_executor, workers_of
from ..run.strategies import AUTO, BASELINES, STRATEGIES, get_strategy, strategy_names
from ..units import parse_budget

__all__ = ["compare", "compare_gaps", "fidelity", "summarize", "heldout_prompts", "ablations", "k_sweep",
           "cpu_overhead",
           "BASELINES", "COMPARE_COLUMNS", "ABLATIONS", "published", "consumer_anchors", "reproduce_paper",
           "paper_waterfall", "paper_equal_memory", "paper_header", "paper_prompts"]

COMPARE_COLUMNS = ["strategy", "hardware", "prompt", "expert_budget", "tpot_ms", "tpot_ms_artifact",
                   "acceptance_rate", "recall", "precision", "hit_rate", "h2d_bytes_per_token", "stall_ms_per_token",
                   "mean_accepted", "slots_per_layer", "draft_bytes", "device_bytes", "budget_bytes", "new_tokens", "clock",
                   "projected", "cost_shape", "execution", "projection", "host_experts_per_token", "plan", "fits",
                   "routing", "bound_tpot_ms", "x_of_bound", "wall_s"]


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def compare(model, tokenizer, strategies: Sequence[str] | None = None, prompts: Sequence | None = None,
            hardware: "str | Sequence[str]" = ("rtx4090-pcie4",), max_new_tokens: int = 48,
            expert_budget: "float | str | Sequence" = 0.5, cost_shape: str | None = None, k=None,
            draft: QuantSpec | None = None, progress: bool = True, trace: RoutingTrace | None = None,
            executor: "Executor | str | None" = "auto", results: "str | Path | None" = None,
            **engine_kw) -> pd.DataFrame:
    """Run every strategy × hardware × budget × prompt and return one tidy row per run.

    All runs see the same prompts and the same expert budget in bytes (the draft's bytes come out of it for the
    speculative strategies). Arguments are validated before any generation starts. On a model, each cell is a
    replay of the model's routing over the prompts, recorded once (its draft chains as the cells ask), wherever a
    replay is the live run, and a live run elsewhere: the table is the one running every cell live gives
    (:mod:`.calibration`). ``trace=`` (a recorded or imported :class:`~specter_lab.RoutingTrace`) replays every
    cell from it instead of generating (seconds, not minutes; ``model`` may be None; the prompts are the trace's;
    greedy); ``executor=`` runs the cells on any
    ``concurrent.futures.Executor``, with the same rows as the serial run (``"auto"``: a local process pool for a
    replayed sweep of many cells; ``None``: here, one after the other; see :func:`~specter_lab.studies.runs.run_cells`).

    ``results=path`` (a ``.jsonl`` file) writes each cell to ``path`` as it finishes, and a rerun with the same
    path computes only the cells not there yet: a sweep stopped by a kill keeps every finished cell, and the frame
    a rerun returns equals an uninterrupted run's, row for row (``wall_s`` is the time the cell took when it ran).
    The file is tied to the trace (its fingerprint) or the model and prompts, and to ``cost_shape``, ``k``,
    ``draft`` and the engine options: another is refused as :class:`~specter_lab.errors.ResumeMismatch` naming
    the field. More strategies, profiles or budgets may be asked on a rerun (:mod:`.results_file`)."""
    strategies = list(strategies or strategy_names())
    for s in strategies:
        if s != AUTO:
            get_strategy(s)
    hws = _as_list(hardware)
    for h in hws:
        make_clock(h)
    get_cost_shape(cost_shape)
    budgets = _as_list(expert_budget)
    for b in budgets:
        parse_budget(b)
    source = as_source(model, tokenizer, prompts if prompts is not None or trace is not None else heldout_prompts(4),
                       max_new_tokens, trace)
    if not source.prompts:
        raise ValueError("prompts is empty: give at least one prompt.")
    # Build every engine first, so a bad budget for any strategy fails before the long part starts. The CUDA
    # clock measures this model as it is: a cost shape applies to the simulated profiles only.
    # A strategy the budget cannot hold (its draft plus a slot per layer) is a row that says so, not an error.
    cells = {(s, h, b): Cell.of(s, expert_budget=b, hardware=h, cost_shape=None if is_measured(h) else cost_shape,
                                k=k if s != AUTO and get_strategy(s).speculative else None, draft=draft, **engine_kw)
             for b in budgets for h in hws for s in strategies}
    setups = {key: source.setup(cell) for key, cell in cells.items()}
    if all(isinstance(e, DoesNotFit) for e in setups.values()):
        raise ValueError(f"expert_budget={expert_budget!r} is too small for every strategy asked for: "
                         f"{next(iter(setups.values())).reason}")
    todo = [key for key, e in setups.items() if not isinstance(e, SKIPPED)]
    log = sweep_results(results, "compare", source, dict(cost_shape=cost_shape, k=k, draft=draft, **engine_kw))
    stored = {key: PromptRuns.of_record(log.get(cells[key])) for key in todo if log is not None and cells[key] in log}
    missing = [key for key in todo if key not in stored]

    def keep(i: int, r) -> None:  # in this process, as each cell finishes: on disk before the sweep goes on
        if log is not None and isinstance(r, PromptRuns):
            log.add(cells[missing[i]], r.as_record())

    t0 = time.perf_counter()
    desc = f"compare ({len(stored)} of {len(todo)} cells on disk)" if stored else "compare"
    with sweep_executor(source, len(missing), executor) as ex:
        computed = dict(zip(missing, run_cells(source, [cells[key] for key in missing], ex, progress, desc,
                                               on_result=keep)))
    runs = {key: stored[key] if key in stored else computed[key] for key in todo}
    sweep = {"cells": len(missing), "seconds": time.perf_counter() - t0, "workers": workers_of(ex),
             "from_results_file": len(stored)}
    bounds = _bounds(source, hws, budgets, cost_shape)
    rows = []
    for (s, h, b), setup in setups.items():
        if isinstance(setup, SKIPPED):
            rows.append({"strategy": s, "hardware": h, "expert_budget": b, "tpot_ms": float("nan"),
                         "fits": setup.label, "routing": source.label})
            continue
        for i, m in enumerate(runs[(s, h, b)].metrics):
            bound_ms = bounds[(h, b)][i] if (h, b) in bounds else float("nan")
            rows.append({**{c: m.get(c) for c in COMPARE_COLUMNS if c in m},
                         "bound_tpot_ms": bound_ms, "x_of_bound": x_of_bound(bound_ms, m.get("tpot_ms")),
                         "strategy": s, "hardware": h, "prompt": i, "expert_budget": b,
                         "execution": "measured" if setup.measured else setup.profile.execution,
                         "projection": setup.cost.projection_label, "fits": "yes", "routing": source.label,
                         "wall_s": runs[(s, h, b)].seconds / len(runs[(s, h, b)].metrics)})
    df = pd.DataFrame(rows)
    df = df[[c for c in COMPARE_COLUMNS if c in df.columns]]
    df.attrs["sweep"] = sweep  # how the cells ran: count, wall seconds, worker processes (None: not known)
    return df


def _bounds(source, hws, budgets, cost_shape) -> dict:
    """The autoregressive bound (:mod:`specter_lab.analysis.bound`) of every prompt at each simulated profile × budget, from
    the trace, or from the prompts' greedy routing (the one the cells replayed, kept with the model)."""
    trace = source.routing()
    out = {}
    for h in hws:
        for b in budgets:
            if is_measured(h):
                continue  # a measured run has no priced bound
            tpots = bound_tpots(trace, b, h, cost_shape)
            if tpots is not None:
                out[(h, b)] = tpots
    return out


GAP_COLUMNS = ("strategy", "x_of_bound", "eviction", "eviction_share", "across_tokens_share", "within_token_share",
               "initial_set_share", "rest_share", "hit_rate", "bound_hit_rate")


def compare_gaps(df: pd.DataFrame, trace: RoutingTrace, *, cost_shape=None) -> pd.DataFrame:
    """Each non-speculative row of a :func:`compare` table replayed on ``trace``: its distance to the bound per
    cell (hardware × budget), split into Belady's eviction, foresight across tokens, foresight within the token,
    the initial set and the rest (:func:`specter_lab.analysis.gap.cell_gaps`; ``specter-lab bench --trace F
    --gap``). The rows' TPOT and hit rate are the table's means over its sequences, so the bound and its
    online-eviction variants are priced once a cell. A speculative row has no such split and is left out."""
    mean = df.groupby(["hardware", "expert_budget", "strategy"], sort=False)[["tpot_ms", "hit_rate"]].mean()
    out = []
    for (hw, budget), cell in mean.groupby(level=[0, 1], sort=False):
        rows = {s: (r.tpot_ms, r.hit_rate) for (_, _, s), r in cell.iterrows()
                if s in STRATEGIES and not STRATEGIES[s].speculative}
        for g in cell_gaps(trace, rows, expert_budget=budget, hardware=hw, cost_shape=cost_shape):
            d = g.as_dict()
            out.append({"hardware": hw, "expert_budget": budget, **{k: d[k] for k in GAP_COLUMNS}})
    return pd.DataFrame(out, columns=["hardware", "expert_budget", *GAP_COLUMNS])


def summarize(df: pd.DataFrame, target: str = "specter", baselines: Iterable[str] = BASELINES) -> pd.DataFrame:
    """Per (hardware, budget): mean TPOT of each strategy, the strongest baseline, and speedups.

    Speedup = baseline TPOT / target TPOT on the same prompts and budget (the paper's definition)."""
    mean = df.groupby(["hardware", "expert_budget", "strategy"], sort=False)["tpot_ms"].mean().unstack("strategy")
    base = [b for b in baselines if b in mean.columns]
    out = pd.DataFrame(index=mean.index)
    for s in mean.columns:
        out[f"tpot_{s}"] = mean[s]
    if base and target in mean.columns:
        out["best_baseline"] = mean[base].idxmin(axis=1)
        out["best_baseline_tpot"] = mean[base].min(axis=1)
        out[f"speedup_{target}"] = out["best_baseline_tpot"] / mean[target]
    if "oracle" in mean.columns and target in mean.columns:
        out[f"{target}_over_oracle"] = mean[target] / mean["oracle"]
    return out.reset_index()


ABLATIONS = {
    "specter (paper)": dict(strategy="specter"),
    "no lookahead prefetch": dict(strategy="specter", prefetch="none"),
    "fixed chunking (0.2 only)": dict(strategy="specter", chunking=(0.2,)),
    "forecast eviction": dict(strategy="specter", eviction="forecast"),
    "slots shared across layers": dict(strategy="specter", shared_slots=True),
    "k=auto": dict(strategy="specter", k="auto"),
    "forecast eviction + k=auto": dict(strategy="specter", eviction="forecast", k="auto"),
}
_ABLATION_KEYS = ("tpot_ms", "hit_rate", "recall", "acceptance_rate", "stall_ms_per_token", "mean_k",
                  "h2d_bytes_per_token")


def ablations(model, tokenizer, prompts, hardware="rtx4090-pcie4", expert_budget=0.35, cost_shape=None,
              max_new_tokens=48, draft=None, progress=True) -> pd.DataFrame:
    """Specter with one piece switched at a time, same prompts and budget (means over the prompts)."""
    rows = []
    source = ReplayedLiveSource(model, tokenizer, list(prompts), max_new_tokens)  # replayed where that is live
    for name, kw in tqdm(ABLATIONS.items(), desc="ablations", disable=not progress):
        kw = dict(kw)
        eng = Engine(model, tokenizer, kw.pop("strategy"), expert_budget=expert_budget, hardware=hardware,
                     cost_shape=cost_shape, draft=draft, **kw)
        rows.append({"variant": name, **source.run_engine(eng).means(_ABLATION_KEYS)})
    return pd.DataFrame(rows)


def k_sweep(model, tokenizer, prompts, ks=(1, 2, 4, 6, 8, 12, 16, "auto"), hardware="rtx4090-pcie4",
            expert_budget=0.35, cost_shape=None, max_new_tokens=48, strategy="specter", progress=True,
            **engine_kw) -> pd.DataFrame:
    """The paper's offline profiler: TPOT against K, to show where ``k="auto"`` lands."""
    rows = []
    source = ReplayedLiveSource(model, tokenizer, list(prompts), max_new_tokens)  # replayed where that is live
    for k in tqdm(ks, desc="k sweep", disable=not progress):
        eng = Engine(model, tokenizer, strategy, expert_budget=expert_budget, hardware=hardware,
                     cost_shape=cost_shape, k=k, **engine_kw)
        runs = source.run_engine(eng)
        rows.append({"k": str(k), **runs.means(("tpot_ms", "acceptance_rate", "mean_k", "hit_rate"))})
    return pd.DataFrame(rows)


def cpu_overhead(model, tokenizer, prompt, max_new_tokens=64, strategies=("lru",), repeats=3) -> pd.DataFrame:
    """CPU wall-clock of each strategy with a budget that holds every expert, against HF ``generate`` on the same
    model and prompt (best of ``repeats``). This is the runtime's own overhead, not a speed claim."""
    ids = Engine(model, tokenizer, "lru", expert_budget=1.0).encode(prompt)
    x = torch.tensor([ids])
    gc = model.generation_config
    eos, gc.eos_token_id = gc.eos_token_id, None  # same token count on both sides

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    try:
        with torch.no_grad():
            hf = best(lambda: model.generate(x, max_new_tokens=max_new_tokens, do_sample=False,
                                             min_new_tokens=max_new_tokens))
        rows = [{"strategy": "hf_generate", "seconds": hf, "ratio": 1.0}]
        for s in strategies:
            eng = Engine(model, tokenizer, s, expert_budget=1.0, ignore_eos=True)
            t = best(lambda: eng.generate(ids, max_new_tokens=max_new_tokens))
            rows.append({"strategy": s, "seconds": t, "ratio": t / hf})
    finally:
        gc.eos_token_id = eos
    return pd.DataFrame(rows)
