"""The benchmark harness: every strategy in one run, at equal device memory, against the oracle bound, on named
hardware; the draft fidelity study; ablations and the K sweep; the CPU wall-clock overhead against HF.

Times from a simulated profile are model outputs, labelled ``simulated`` (and ``projected`` with a cost shape);
only ``hardware="cuda"`` measures speed.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .engine import Engine
from .model import attached, inspect_model
from .offload.hardware import get_cost_shape, get_profile
from .offload.runtime import _route_groups, expert_apply
from .quant import DraftExperts, QuantSpec
from .strategies import STRATEGIES, get_strategy

__all__ = ["compare", "fidelity", "summarize", "heldout_prompts", "ablations", "k_sweep", "cpu_overhead",
           "BASELINES"]

BASELINES = ("on_demand", "lru", "gate_lookahead", "spec_lru", "specmoeoff")
COMPARE_COLUMNS = ["strategy", "hardware", "prompt", "expert_budget", "tpot_ms", "acceptance_rate", "recall",
                   "precision", "hit_rate", "h2d_bytes_per_token", "stall_ms_per_token", "mean_accepted",
                   "slots_per_layer", "draft_bytes", "device_bytes", "budget_bytes", "new_tokens", "clock",
                   "projected", "cost_shape"]


def heldout_prompts(n: int | None = None) -> list[str]:
    """Code prompts from standard-library modules the bundled model never trained on."""
    text = resources.files("specter_lab").joinpath("data/heldout_prompts.json").read_text()
    prompts = json.loads(text)
    return prompts[:n] if n else prompts


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def compare(model, tokenizer, strategies: Sequence[str] | None = None, prompts: Sequence | None = None,
            hardware: "str | Sequence[str]" = ("rtx4090-pcie4",), max_new_tokens: int = 48,
            expert_budget: "float | str | Sequence" = 0.5, cost_shape: str | None = None, k=None,
            draft: QuantSpec | None = None, progress: bool = True, **engine_kw) -> pd.DataFrame:
    """Run every strategy × hardware × budget × prompt and return one tidy row per run.

    All runs see the same prompts and the same expert budget in bytes (the draft's bytes come out of it for the
    speculative strategies). Arguments are validated before any generation starts."""
    strategies = list(strategies or STRATEGIES)
    for s in strategies:
        get_strategy(s)
    hws = _as_list(hardware)
    for h in hws:
        get_profile(h)
    get_cost_shape(cost_shape)
    budgets = _as_list(expert_budget)
    if prompts is None:
        prompts = heldout_prompts(4)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt.")
    # Build every engine first, so a bad budget for any strategy fails before the long part starts.
    engines = {}
    for b in budgets:
        for h in hws:
            for s in strategies:
                engines[(s, h, b)] = Engine(model, tokenizer, s, expert_budget=b, hardware=h, cost_shape=cost_shape,
                                            k=k if get_strategy(s).speculative else None, draft=draft, **engine_kw)
    rows = []
    bar = tqdm(total=len(engines) * len(prompts), desc="compare", disable=not progress)
    for (s, h, b), engine in engines.items():
        for i, p in enumerate(prompts):
            r = engine.generate(p, max_new_tokens=max_new_tokens)
            m = r.metrics
            row = {c: m.get(c) for c in COMPARE_COLUMNS if c in m}
            row.update(strategy=s, hardware=h, prompt=i, expert_budget=b)
            rows.append(row)
            bar.update()
    bar.close()
    df = pd.DataFrame(rows)
    return df[[c for c in COMPARE_COLUMNS if c in df.columns]]


def summarize(df: pd.DataFrame, target: str = "specter", baselines: Iterable[str] = BASELINES) -> pd.DataFrame:
    """Per (hardware, budget): mean TPOT of each strategy, the strongest baseline, and speedups.

    Speedup = baseline TPOT / target TPOT on the same prompts and budget (the paper's definition)."""
    mean = df.groupby(["hardware", "expert_budget", "strategy"], sort=False)["tpot_ms"].mean().unstack("strategy")
    base = [b for b in baselines if b in mean.columns]
    out = pd.DataFrame(index=mean.index)
    for s in mean.columns:
        out[f"tpot_{s}"] = mean[s]
    if base and target in mean.columns:
        best = mean[base].idxmin(axis=1)
        out["best_baseline"] = best
        out["best_baseline_tpot"] = mean[base].min(axis=1)
        out[f"speedup_{target}"] = out["best_baseline_tpot"] / mean[target]
    if "oracle" in mean.columns and target in mean.columns:
        out[f"{target}_over_oracle"] = mean[target] / mean["oracle"]
    return out.reset_index()


# ----------------------------------------------------------------------------------------- fidelity


class _Probe:
    """A minimal runtime for teacher-forced passes: target (exact) or draft experts; records routing."""

    def __init__(self, info, draft: DraftExperts | None) -> None:
        self.info = info
        self.draft = draft
        self.routing: dict[int, np.ndarray] = {}

    def experts_forward(self, layer, mod, x, idx, w):
        self.routing[layer] = idx.detach().cpu().numpy()
        groups = _route_groups(idx)
        final = torch.zeros_like(x)
        for e in sorted(groups):
            tok, kpos = groups[e]
            if self.draft is None:
                weights = {n: getattr(mod, n)[e] for n in self.info.layers[layer].param_names}
            else:
                weights = self.draft.weights(layer, e)
            final.index_add_(0, tok, (expert_apply(mod, x[tok], weights) * w[tok, kpos, None]).to(final.dtype))
        return final


def _teacher_forced(model, info, ids: list[int], draft: DraftExperts | None):
    probe = _Probe(info, draft)
    with attached(model, info, probe), torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    return logits.argmax(-1), probe.routing


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
    seqs, targets = [], []
    for p in prompts:
        ids = ref.encode(p)
        out = ref.generate(ids, max_new_tokens=max_new_tokens).token_ids
        seq = ids + out
        seqs.append((len(ids), seq))
        targets.append(_teacher_forced(model, info, seq, None))
    rows = []
    for spec in tqdm(specs, desc="fidelity", disable=not progress):
        t0 = time.perf_counter()
        draft = DraftExperts(info, spec)
        q_time = time.perf_counter() - t0
        inter = total = agree = n_tok = 0
        for (n_prompt, seq), (t_next, t_route) in zip(seqs, targets):
            d_next, d_route = _teacher_forced(model, info, seq, draft)
            sl = slice(n_prompt - 1, len(seq) - 1)  # predictions of the generated tokens
            agree += int((d_next[sl] == t_next[sl]).sum())
            n_tok += sl.stop - sl.start
            for layer, t_idx in t_route.items():
                d_idx = d_route[layer]
                for a, b in zip(t_idx[n_prompt - 1:], d_idx[n_prompt - 1:]):
                    inter += len(set(a.tolist()) & set(b.tolist()))
                    total += len(a)
        row = {"bits": spec.bits, "group_size": spec.group_size, "method": spec.method,
               "routing_recall": inter / total, "token_agreement": agree / n_tok,
               "draft_bytes": draft.packed_bytes, "fp16_fraction": draft.fp16_ratio,
               "rel_error": draft.rel_error, "quantize_s": q_time}
        if acceptance:
            eng = Engine(model, tokenizer, "spec_lru", expert_budget=1.0, draft=spec, k=k)
            eng._draft = draft
            acc = [eng.generate(p, max_new_tokens=max_new_tokens).metrics["acceptance_rate"] for p in prompts]
            row["acceptance_rate"] = float(np.nanmean(acc))
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------- ablations


ABLATIONS = {
    "specter (paper)": dict(strategy="specter"),
    "no lookahead prefetch": dict(strategy="specter", prefetch="none"),
    "fixed chunking (0.2 only)": dict(strategy="specter", chunking=(0.2,)),
    "forecast eviction": dict(strategy="specter", eviction="forecast"),
    "slots shared across layers": dict(strategy="specter", shared_slots=True),
    "k=auto": dict(strategy="specter", k="auto"),
    "forecast eviction + k=auto": dict(strategy="specter", eviction="forecast", k="auto"),
}


def ablations(model, tokenizer, prompts, hardware="rtx4090-pcie4", expert_budget=0.35, cost_shape=None,
              max_new_tokens=48, draft=None, progress=True) -> pd.DataFrame:
    """Specter with one piece switched at a time, same prompts and budget."""
    rows = []
    for name, kw in tqdm(ABLATIONS.items(), desc="ablations", disable=not progress):
        kw = dict(kw)
        eng = Engine(model, tokenizer, kw.pop("strategy"), expert_budget=expert_budget, hardware=hardware,
                     cost_shape=cost_shape, draft=draft, **kw)
        for i, p in enumerate(prompts):
            m = eng.generate(p, max_new_tokens=max_new_tokens).metrics
            rows.append({"variant": name, "prompt": i, "tpot_ms": m["tpot_ms"], "hit_rate": m["hit_rate"],
                         "recall": m["recall"], "acceptance_rate": m["acceptance_rate"],
                         "stall_ms_per_token": m["stall_ms_per_token"], "mean_k": m.get("mean_k"),
                         "h2d_bytes_per_token": m["h2d_bytes_per_token"]})
    df = pd.DataFrame(rows)
    return df.groupby("variant", sort=False).mean(numeric_only=True).drop(columns="prompt").reset_index()


def k_sweep(model, tokenizer, prompts, ks=(1, 2, 4, 6, 8, 12, 16, "auto"), hardware="rtx4090-pcie4",
            expert_budget=0.35, cost_shape=None, max_new_tokens=48, strategy="specter", progress=True,
            **engine_kw) -> pd.DataFrame:
    """The paper's offline profiler: TPOT against K, to show where ``k="auto"`` lands."""
    rows = []
    for k in tqdm(ks, desc="k sweep", disable=not progress):
        eng = Engine(model, tokenizer, strategy, expert_budget=expert_budget, hardware=hardware,
                     cost_shape=cost_shape, k=k, **engine_kw)
        ms = [eng.generate(p, max_new_tokens=max_new_tokens).metrics for p in prompts]
        rows.append({"k": str(k), "tpot_ms": float(np.mean([m["tpot_ms"] for m in ms])),
                     "acceptance_rate": float(np.nanmean([m["acceptance_rate"] for m in ms])),
                     "mean_k": float(np.nanmean([m.get("mean_k", np.nan) for m in ms])),
                     "hit_rate": float(np.nanmean([m["hit_rate"] for m in ms]))})
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
            hf = best(lambda: model.generate(x, max_new_tokens=max_new_tokens, do_sample=False, min_new_tokens=max_new_tokens))
        rows = [{"strategy": "hf_generate", "seconds": hf, "ratio": 1.0}]
        for s in strategies:
            eng = Engine(model, tokenizer, s, expert_budget=1.0)
            eng.info.eos_token_ids = []
            t = best(lambda: eng.generate(ids, max_new_tokens=max_new_tokens))
            rows.append({"strategy": s, "seconds": t, "ratio": t / hf})
    finally:
        gc.eos_token_id = eos
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------- CLI


def _fmt(df: pd.DataFrame) -> str:
    return df.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def bench_main(a) -> int:

    from .model import load_model

    # The default set is the paper's comparison plus our own; `auto` (a calibration per cell) is in --regimes.
    strategies = a.strategies.split(",") if a.strategies else [s for s in STRATEGIES if s != "auto"]
    hardware = [h for h in a.hardware.split(",") if h]
    budgets = [float(b) if float(b) <= 1 else int(float(b)) for b in a.budgets.split(",")]
    cost_shape = None if (a.cost_shape or "deepseek-v2-lite") == "none" else (a.cost_shape or "deepseek-v2-lite")
    spec = QuantSpec(a.bits, a.group_size, a.method)
    model, tok = load_model(a.model, trust_remote_code=a.trust_remote_code)
    prompts = heldout_prompts(a.prompts)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"model": a.model, "cost_shape": cost_shape, "draft": spec.label,
                           "max_new_tokens": a.max_new_tokens, "prompts": len(prompts),
                           "note": "simulated clock" + (f", projected as {cost_shape}" if cost_shape else "")}
    df = compare(model, tok, strategies, prompts, hardware, a.max_new_tokens, budgets, cost_shape, a.k, spec,
                 progress=not a.json)
    summ = summarize(df)
    out["runs"] = df.to_dict(orient="records")
    out["summary"] = summ.to_dict(orient="records")
    if a.ablations:
        ab = ablations(model, tok, prompts, hardware[0], min(budgets), cost_shape, a.max_new_tokens, spec,
                       progress=not a.json)
        ks = k_sweep(model, tok, prompts, hardware=hardware[0], expert_budget=min(budgets), cost_shape=cost_shape,
                     max_new_tokens=a.max_new_tokens, draft=spec, progress=not a.json)
        out["ablations"], out["k_sweep"] = ab.to_dict(orient="records"), ks.to_dict(orient="records")
    if a.overhead:
        ov = cpu_overhead(model, tok, prompts[0], max_new_tokens=a.max_new_tokens, strategies=strategies)
        out["cpu_overhead"] = ov.to_dict(orient="records")
    if getattr(a, "regimes", False):
        from .planner import regime_map

        rm = regime_map(model, tok, prompts[:2], progress=not a.json, max_new_tokens=min(a.max_new_tokens, 32))
        out["regimes"] = rm.to_dict(orient="records")
    out["seconds"] = time.perf_counter() - t0
    if a.json:
        print(json.dumps(out, indent=1, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    else:
        print(f"specter-lab bench · model {a.model} · {out['note']} · draft {spec.label} · "
              f"{len(prompts)} held-out prompts × {a.max_new_tokens} tokens")
        mean = df.groupby(["hardware", "expert_budget", "strategy"], sort=False)[
            ["tpot_ms", "hit_rate", "acceptance_rate", "recall", "stall_ms_per_token", "h2d_bytes_per_token",
             "slots_per_layer"]].mean().reset_index()
        print("\nMean over prompts (TPOT in ms, simulated):")
        print(_fmt(mean))
        print("\nSpeedup of specter over the strongest baseline, and specter / oracle:")
        print(_fmt(summ[[c for c in summ.columns if not c.startswith("tpot_")]]))
        for key, title in (("ablations", "Ablations (specter, lowest budget, first profile)"),
                           ("k_sweep", "K sweep"), ("cpu_overhead", "CPU wall-clock vs HF generate (full budget)"),
                           ("regimes", "Regime map")):
            if key in out:
                print(f"\n{title}:")
                print(_fmt(pd.DataFrame(out[key])))
        print(f"\n({out['seconds']:.0f} s)")
    if a.html:
        from .viz.figures import bench_html

        with open(a.html, "w", encoding="utf-8") as f:
            f.write(bench_html(df, summ, out))
        if not a.json:
            print(f"report written to {a.html}")
    return 0
