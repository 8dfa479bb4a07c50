"""Specter's headline under its own protocol (:mod:`specter_lab.studies.paper`), what its speedup is made of, and the same
cases at equal memory against the lean baselines.

Every time here is simulated: the A100-40G PCIe 4.0 profile in an execution mode, each case's cost shape at full
depth, and the routing of the model run live (the bundled one unless another is given) or of a recorded routing
trace (``trace=``, :func:`specter_lab.analysis.record`), *projected* onto that shape: each method keeps the artifact's
fraction of experts resident. The frames say so in ``attrs`` and :func:`paper_header` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from tqdm.auto import tqdm

from ..run.engine import Engine
from ..model import inspect_model
from ..analysis.replay import replay, skeleton
from ..traces.trace_file import RoutingTrace
from ..pricing.profiles import EXECUTIONS
from ..pricing.shapes import get_cost_shape
from .paper import PAPER_CASES, PAPER_CLAIM, PAPER_EXECUTIONS, PAPER_PROFILE, PROTOCOL, PaperCase, get_case
from .calibration import ReplayedLiveSource
from .prompts import heldout_prompts
from .results_file import ResultsFile, open_results
from .runs import LiveSource, PromptRuns, TraceSource
from ..run.strategies import AUTO, BASELINES, Strategy, get_strategy

__all__ = ["reproduce_paper", "paper_waterfall", "paper_equal_memory", "paper_prompts", "paper_header",
           "WATERFALL_STEPS", "LEAN_STRATEGIES"]

_KEYS = ("tpot_ms", "tpot_ms_artifact", "hit_rate", "acceptance_rate", "h2d_bytes_per_token",
         "d2h_bytes_per_token", "stall_ms_per_token", "first_commit_tokens")
DEFAULT_CASES = ("deepseek-v2-lite-high", "deepseek-v2-lite-low")
# The equal-memory table: every baseline but those a row already stands for, then Specter and the planner. Each
# exclusion says why, so a new baseline joins the table unless someone writes down why not.
LEAN_EXCLUDED = {
    "on_demand": "keeps nothing: lru at the same memory holds everything it holds and more",
    "gate_lookahead": "prefetches one layer ahead of a demand-loaded lru: the table's lru and specmoeoff rows "
                      "bracket it, and the artifact compares against neither",
    "spec_lru": "specter without its prefetch: the waterfall (paper_waterfall) isolates that step",
}
LEAN_STRATEGIES: tuple[str, ...] = (*(b for b in BASELINES if b not in LEAN_EXCLUDED), "specter", AUTO)


def paper_prompts(tokenizer, n: int = 3, tokens: int = PROTOCOL.prompt_tokens) -> list[list[int]]:
    """The first ``n`` held-out prompts cut to their first ``tokens`` tokens, as the artifact caps its prompts."""
    if tokenizer is None:
        raise ValueError("paper_prompts needs a tokenizer; with a model that has none, pass prompts= as token ids.")
    return [tokenizer(p, add_special_tokens=True)["input_ids"][:tokens] for p in heldout_prompts(n)]


def _check(cases, executions, trace) -> list[PaperCase]:
    if trace is not None and not isinstance(trace, RoutingTrace):
        raise TypeError(f"trace= must be a sl.RoutingTrace (sl.record(...) or sl.load_trace(path)), got "
                        f"{type(trace).__name__}; or None to run the model live.")
    cases = [get_case(c) for c in ([cases] if isinstance(cases, (str, PaperCase)) else list(cases))]
    if not cases:
        raise ValueError("cases is empty: give at least one name from sl.paper.PAPER_CASES.")
    bad = [e for e in executions if e not in EXECUTIONS]
    if bad or not executions:
        raise ValueError(f"executions={executions!r}: use a non-empty subset of {list(EXECUTIONS)}.")
    return cases


@dataclass
class _Bench:
    """What every run of one call shares: the model, prompts, length and progress bar."""

    model: Any
    tokenizer: Any
    prompts: list
    max_new_tokens: int
    bar: Any = None
    trace: RoutingTrace | None = None  # replay this recorded routing instead of running the model
    log: ResultsFile | None = None  # each run's means on disk as it finishes (``results=``)
    source: ReplayedLiveSource | None = None  # live: each engine's runs replayed where that is the live run

    @property
    def num_experts(self) -> int:
        return inspect_model(self.model if self.trace is None else skeleton(self.trace.config)).num_experts

    def measure(self, strategy: "str | Strategy", case: PaperCase, execution: str, **kw) -> dict[str, float]:
        """Mean metrics of ``strategy`` over the prompts, run live or replayed from the trace, with its slots,
        device bytes and budget bytes (read from the results file when a run before this one wrote them)."""
        return self.kept({"strategy": strategy, "case": case.name, "execution": execution, **kw},
                         lambda: _summary(self.runs(strategy, case, execution, **kw)))

    def kept(self, cell: dict, compute) -> dict:
        """``compute()``, or its result from the results file; a new result is written there before returning."""
        if self.log is not None and cell in self.log:
            if self.bar is not None:
                self.bar.update(len(self.prompts))  # the runs it stands for, done before
            return self.log.get(cell)
        out = compute()
        if self.log is not None:
            self.log.add(cell, out)
        return out

    def identity(self) -> dict:
        """What every run of this call shares, for its results file: the trace, or the model and prompts."""
        if self.trace is not None:
            return TraceSource(self.trace).identity()
        return LiveSource(self.model, self.tokenizer, self.prompts, self.max_new_tokens).identity()

    def runs(self, strategy: "str | Strategy", case: PaperCase, execution: str, **kw) -> PromptRuns:
        """Every prompt's metrics: a live run of each (the protocol's fixed length), or a replay of the trace's
        recorded sequences, the one place where the two differ."""
        if self.trace is None:
            return self.source.run_engine(self.engine(strategy, case, execution, **kw), self.bar)
        results = replay(self.trace, strategy, hardware=f"{PAPER_PROFILE}@{execution}", cost_shape=case.cost_shape,
                         **kw)
        if self.bar is not None:
            self.bar.update(len(results))
        return PromptRuns([r.metrics for r in results])

    def engine(self, strategy: "str | Strategy", case: PaperCase, execution: str, **kw) -> Engine:
        # ignore_eos: the protocol's fixed output length, every run commits max_new_tokens
        return Engine(self.model, self.tokenizer, strategy, hardware=f"{PAPER_PROFILE}@{execution}",
                      cost_shape=case.cost_shape, ignore_eos=True, **kw)

    def run(self, eng: Engine) -> dict[str, float]:
        """:meth:`measure` of an engine already made (live only)."""
        return _summary(self.source.run_engine(eng, self.bar))


def _summary(runs: PromptRuns) -> dict[str, float]:
    """The protocol's means over the prompts, and the memory columns every prompt's run shares."""
    return {**runs.means(_KEYS), **{k: runs.first(k) for k in ("slots_per_layer", "device_bytes", "budget_bytes")}}


def _setup(model, tokenizer, prompts, n_prompts, max_new_tokens, total, progress, trace=None,
           results=None) -> _Bench:
    if trace is not None:  # the recorded prompts and lengths
        b = _Bench(None, tokenizer, [s.prompt.tolist() for s in trace.sequences],
                   max(len(s.tokens) for s in trace.sequences), None, trace)
    else:
        prompts = list(prompts) if prompts is not None else paper_prompts(tokenizer, n_prompts)
        if not prompts:
            raise ValueError("prompts is empty: give at least one prompt.")
        # every engine's runs replayed from the model's routing, recorded once (chains on demand), where that is
        # the live run (studies/calibration.py): the same figures for a fraction of the forwards
        b = _Bench(model, tokenizer, prompts, max_new_tokens,
                   source=ReplayedLiveSource(model, tokenizer, prompts, max_new_tokens))
    if results is not None:  # every table of the paper's protocol shares one kind: a run is named in full
        b.log = open_results(results, "paper", {"source": b.identity(), "settings": {"profile": PAPER_PROFILE}})
    b.bar = tqdm(total=total * len(b.prompts), desc="paper (replay)" if trace is not None else "paper",
                 disable=not progress)
    return b


def _measure_methods(b: _Bench, case: PaperCase, execution: str) -> dict[str, dict]:
    """Each method of the case at its projected resident slots; ``matched`` ones at Specter's device bytes."""
    n_exp = b.num_experts
    got: dict[str, dict] = {}
    for m in sorted(case.methods, key=lambda m: m.residents is None):  # fixed first: matched needs Specter's
        slots = m.slots_on(n_exp, case.num_experts)
        size = dict(cache_slots=slots) if slots is not None else dict(expert_budget=got["specter"]["budget_bytes"])
        got[m.method] = b.measure(m.method, case, execution, k=m.k, **size)
    return got


def reproduce_paper(model, tokenizer, cases: "Sequence[str] | str" = DEFAULT_CASES, trace=None,
                    executions: Sequence[str] = PAPER_EXECUTIONS, prompts: Sequence | None = None,
                    n_prompts: int = 3, max_new_tokens: int = PROTOCOL.new_tokens,
                    progress: bool = True, results: "str | Path | None" = None) -> pd.DataFrame:
    """The artifact's comparison, case × execution × method: both TPOTs (means over the prompts), and on each
    baseline's row Specter's speedup over it under each metric (baseline mean TPOT / Specter's, the artifact's
    definition), with the paper's 1.50× / 1.88× beside it.

    Each method runs at the artifact's resident count, projected (:meth:`MethodSetup.slots_on`), its K, on
    ``a100-40g-pcie4@<execution>`` at the case's cost shape at full depth, for ``max_new_tokens`` tokens (EOS does
    not stop a run: the protocol's fixed length) after the first 16 tokens of each of ``n_prompts`` held-out
    prompts. With ``trace=`` (a :class:`~specter_lab.RoutingTrace` recorded with ``k_max`` ≥ the cases' K) every
    method is replayed on the recorded routing instead (its prompts and lengths; ``model`` may be None).
    ``results=path`` (JSON Lines) writes each method's means as it finishes and a rerun with the same path
    computes only the runs it lacks (:mod:`.results_file`; :func:`paper_waterfall` and
    :func:`paper_equal_memory` take the same file)."""
    cases = _check(cases, executions, trace)
    b = _setup(model, tokenizer, prompts, n_prompts, max_new_tokens,
               sum(len(c.methods) for c in cases) * len(executions), progress, trace, results)
    rows = []
    with b.bar:
        for case in cases:
            for ex in executions:
                got = _measure_methods(b, case, ex)
                for m in case.methods:
                    rows.append(_row(case, ex, m, got[m.method], got["specter"]))
    df = pd.DataFrame(rows)
    df.attrs.update(_attrs(b, cases, executions))
    return df


def _row(case: PaperCase, execution: str, m, r: dict, spec: dict) -> dict:
    base = m.method != "specter"
    return {"case": case.name, "execution": execution, "method": m.method, "artifact_name": m.artifact_name,
            "residents": m.residents if m.residents is not None else "matched", "k": m.k,
            "slots_per_layer": r["slots_per_layer"], "tpot_ms": r["tpot_ms"],
            "tpot_ms_artifact": r["tpot_ms_artifact"],
            "speedup": _ratio(r["tpot_ms"], spec["tpot_ms"]) if base else float("nan"),
            "speedup_artifact": _ratio(r["tpot_ms_artifact"], spec["tpot_ms_artifact"]) if base else float("nan"),
            "paper_mean": PAPER_CLAIM.mean, "paper_max": PAPER_CLAIM.max,
            "hit_rate": r["hit_rate"], "acceptance_rate": r["acceptance_rate"],
            "first_commit_tokens": r["first_commit_tokens"], "h2d_MB_per_token": r["h2d_bytes_per_token"] / 1e6,
            "d2h_MB_per_token": r["d2h_bytes_per_token"] / 1e6, "device_MB": r["device_bytes"] / 1e6}


def _ratio(a: float, b: float) -> float:
    # a run so short that its first window committed every token has an artifact TPOT of 0: no finite speedup
    return a / b if b > 0 else float("inf")


def _attrs(b: _Bench, cases: list[PaperCase], executions) -> dict:
    if b.trace is not None:
        routing = f"replayed from a recorded trace: {b.trace.source}"
    else:
        n = b.model.config
        routing = (f"the run model's own routing, live ({getattr(n, 'model_type', '?')}, "
                   f"{getattr(n, 'num_hidden_layers', '?')} layers x {getattr(n, 'num_experts', '?')} experts, "
                   f"top-{getattr(n, 'num_experts_per_tok', '?')}), not recorded DeepSeek/Qwen/Phi routing")
    return {"simulated": True, "profile": PAPER_PROFILE, "executions": list(executions),
            "projection": "; ".join(sorted({get_cost_shape(c.cost_shape).label for c in cases})),
            "routing": routing, "slots": "each method's artifact resident count as the same fraction of the run "
            "model's experts per layer", "new_tokens": b.max_new_tokens,
            "prompts": (f"{len(b.prompts)} recorded sequences" if b.trace is not None else
                        f"{len(b.prompts)} prompts, first {PROTOCOL.prompt_tokens} tokens each"),
            "metrics": "tpot_ms: unbiased; tpot_ms_artifact: (last - first commit)/(N - 1), the artifact's"}


def paper_header(df: pd.DataFrame) -> str:
    """The assumptions behind a :func:`reproduce_paper` / :func:`paper_waterfall` frame, as printed lines."""
    a = df.attrs
    keys = ("profile", "executions", "projection", "routing", "slots", "prompts", "new_tokens", "metrics")
    return "\n".join([f"SIMULATED (not measured) - paper claim {PAPER_CLAIM.mean:.2f}x mean / "
                      f"{PAPER_CLAIM.max:.2f}x max ({PAPER_CLAIM.source})"]
                     + [f"  {k}: {a[k]}" for k in keys if k in a])


# ------------------------------------------------------------------------------------------------ the waterfall
# Specter's speedup over the artifact's Mixtral-Offloading, with one difference switched off at a time, in this
# order (cumulative): (label, what the baseline run is, what the target run is, which metric).
WATERFALL_STEPS = (
    ("artifact protocol", dict(strategy="mixtral_offloading"), "specter", "tpot_ms_artifact"),
    ("metric: unbiased TPOT", dict(strategy="mixtral_offloading"), "specter", "tpot_ms"),
    ("write-back off", dict(strategy="mixtral_offloading", writeback=False), "specter", "tpot_ms"),
    ("single stream off", dict(strategy="mixtral_offloading", writeback=False, single_stream=False), "specter",
     "tpot_ms"),
    ("host syncs + unfused dispatch off (= lean lru)", dict(strategy="lru"), "specter", "tpot_ms"),
    ("memory split: equal bytes", dict(strategy="lru", equal_bytes=True), "specter", "tpot_ms"),
    ("prefetch + overlap off", dict(strategy="lru", equal_bytes=True), "spec_lru", "tpot_ms"),
)


def paper_waterfall(model, tokenizer, case: str = "deepseek-v2-lite-high", execution: str = "eager",
                    prompts: Sequence | None = None, n_prompts: int = 3, max_new_tokens: int = PROTOCOL.new_tokens,
                    trace=None, progress: bool = True, results: "str | Path | None" = None) -> pd.DataFrame:
    """What Specter's speedup over the artifact's Mixtral-Offloading is made of: one row per step of
    :data:`WATERFALL_STEPS` (each switches one more difference off), with the speedup after it and its factor
    (speedup after / before). Rows up to ``memory split`` change the baseline; the last changes the method
    (Specter without its lookahead prefetch: ``spec_lru``, same draft, K and slots), so what is left there is
    speculation alone against lean LRU at equal memory. ``results=``: as :func:`reproduce_paper`'s."""
    (case,) = _check([case], [execution], trace)
    if "mixtral_offloading" not in case.baselines:
        with_mo = [c.name for c in PAPER_CASES.values() if "mixtral_offloading" in c.baselines]
        raise ValueError(f"case={case.name!r}: the artifact compares it with {list(case.baselines)} only, not "
                         f"Mixtral-Offloading, whose speedup the waterfall takes apart; use one of {with_mo}.")
    mo, spec = case.method("mixtral_offloading"), case.method("specter")
    b = _setup(model, tokenizer, prompts, n_prompts, max_new_tokens, 7, progress, trace, results)
    n_exp = b.num_experts
    mo_slots, spec_slots = mo.slots_on(n_exp, case.num_experts), spec.slots_on(n_exp, case.num_experts)
    cache: dict[tuple, dict] = {}

    def run(strategy: str, equal_bytes: bool = False, **opts) -> dict:
        key = (strategy, equal_bytes, tuple(sorted(opts.items())))
        if key not in cache:
            k = spec.k if strategy in ("specter", "spec_lru") else None
            if strategy in ("specter", "spec_lru"):
                size = dict(cache_slots=spec_slots)
            elif equal_bytes:
                size = dict(expert_budget=cache[("specter", False, ())]["budget_bytes"])
            else:
                size = dict(cache_slots=mo_slots)
            cache[key] = b.measure(get_strategy(strategy).with_options(**opts), case, execution, k=k, **size)
        return cache[key]

    rows, prev = [], None
    with b.bar:
        run("specter")
        for label, base_kw, target, metric in WATERFALL_STEPS:
            kw = dict(base_kw)
            base = run(kw.pop("strategy"), kw.pop("equal_bytes", False), **kw)
            tgt = run(target)
            s = _ratio(base[metric], tgt[metric])
            rows.append({"step": label, "speedup": s, "factor": s / prev if prev else float("nan"),
                         "baseline_tpot_ms": base[metric], "target_tpot_ms": tgt[metric], "metric": metric,
                         "baseline_slots": base["slots_per_layer"], "target": target,
                         "target_slots": tgt["slots_per_layer"]})
            prev = s
    df = pd.DataFrame(rows)
    df.attrs.update(_attrs(b, [case], [execution]))
    df.attrs.update(case=case.name, execution=execution)
    return df


def paper_equal_memory(model, tokenizer, case: str = "deepseek-v2-lite-high", execution: str = "eager",
                       strategies: Sequence[str] = LEAN_STRATEGIES, prompts: Sequence | None = None,
                       n_prompts: int = 3, max_new_tokens: int = PROTOCOL.new_tokens,
                       progress: bool = True, results: "str | Path | None" = None) -> pd.DataFrame:
    """The same case at equal device memory (Specter's bytes in the artifact's setup: its slots plus its draft)
    against the lean baselines, host execution and ``auto``: one row per strategy, mean TPOT (both metrics) and
    Specter's speedup over it (unbiased), sorted fastest first. ``auto`` plans with Specter's draft and K pinned
    (``sl.plan(draft=, k=)``): every strategy, speculative or not, at this case's draft. ``results=``: as
    :func:`reproduce_paper`'s (a row read from it skips its engine, the planner's too)."""
    (case,) = _check([case], [execution], None)
    # one run per strategy: Specter's engine sizes the budget and is the 'specter' row's, run once (counting
    # it twice left the bar one short, and tqdm draws a bar closed short red, as if the run had failed: E4)
    b = _setup(model, tokenizer, prompts, n_prompts, max_new_tokens, len(strategies), progress, results=results)
    spec = case.method("specter")
    with b.bar:
        ref = b.engine("specter", case, execution, k=spec.k, cache_slots=spec.slots_on(b.num_experts, case.num_experts))
        budget = ref.split.budget_bytes
        rows = []
        for s in strategies:
            # auto plans with Specter's own draft and K (the case's): at Specter's memory it decides whether to
            # speculate and how to split the budget, not which draft to make (that search is sl.plan's, and
            # costs twice the candidates)
            pinned = dict(draft=ref.draft_cfg, k=spec.k) if s == AUTO else {}

            def measured(s=s, pinned=pinned) -> dict:
                eng = ref if s == "specter" else b.engine(s, case, execution, expert_budget=budget, **pinned)
                return {"plan": eng.plan.label if eng.plan else None, **b.run(eng)}

            rows.append({"strategy": s, **b.kept({"equal_memory": s, "case": case.name, "execution": execution,
                                                  "expert_budget": budget, **pinned}, measured)})
    df = pd.DataFrame(rows)
    t_spec = df.loc[df.strategy == "specter", "tpot_ms"].iloc[0] if "specter" in set(df.strategy) else float("nan")
    df["specter_speedup"] = df.tpot_ms / t_spec
    df = df.sort_values("tpot_ms").reset_index(drop=True)
    df.attrs.update(_attrs(b, [case], [execution]))
    df.attrs.update(case=case.name, execution=execution, budget_bytes=budget)
    return df
