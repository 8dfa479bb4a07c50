"""Command line: ``specter-lab run | bench | calibrate | estimate | trace``. Same names as the Python API.

Imports are at the top like everywhere else: the package's ``__init__`` already loads torch and every room, so a
function-local import would save nothing. The one exception is the optional HTML report (plotly), imported only when
``--html`` asks for it."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from .atomic import write_atomic
from .estimator import estimate
from .pricing.profiles import HOST_DECODE_EFFICIENCY
from .estimator.consumer import PROPERTY_FAMILIES, consumer_summary, flag_property
from .model import BUNDLED, load_model
from .model.checkpoint_check import check_checkpoint
from .model.memory import plan_memory
from .offload.clock import is_measured, make_clock
from .pricing.calibrate import calibrate
from .pricing.hostcal import calibrate_host
from .pricing.profiles import PROFILES
from .pricing.shapes import get_cost_shape
from .traces.formats import FORMATS
from .traces.importing import import_routing
from .analysis.record import record
from .traces.trace_file import load_trace
from .run.engine import Engine
from .run.quant import QuantSpec
from .run.strategies import STRATEGIES, get_strategy, strategy_names
from .studies import bench
from .studies.bench import consumer_anchors, paper_header, published, reproduce_paper
from .studies.paper import PAPER_EXECUTIONS
from .studies.planner import regime_map
from .studies.prompts import heldout_prompts
from .studies.reproduce import DEFAULT_CASES
from .units import budget_from_text, parse_budget

__all__ = ["main"]


def _k(text: str):
    return text if text == "auto" else int(text)


def _add_common(p: argparse.ArgumentParser) -> None:

    p.add_argument("--model", default="tiny", help="'tiny' (bundled), a local HF MoE folder, or a hub id")
    p.add_argument("--expert-budget", type=budget_from_text, default=None,
                   help="fraction of routed-expert bytes (0-1], bytes, or '2GiB' (default 0.5)")
    p.add_argument("--bits", type=int, default=4, help="draft bits: 2, 3, 4 or 8")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--method", default="rtn", help="draft quantizer: rtn or hqq")
    p.add_argument("--k", type=_k, default=None, help="draft length, or 'auto'")
    p.add_argument("--cost-shape", default=None, help="price experts as a real model (projected)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--trust-remote-code", action="store_true")


# ----------------------------------------------------------------------------------------- run
def cmd_run(a) -> int:

    spec = QuantSpec(a.bits, a.group_size, a.method)
    # Check names and counts before loading the model (the slow part); the Engine checks the rest.
    get_strategy(a.strategy), make_clock(a.hardware), get_cost_shape(a.cost_shape)
    for flag, v in (("--max-new-tokens", a.max_new_tokens), ("--cache-slots", a.cache_slots), ("--k", a.k)):
        if isinstance(v, int) and v < 1:
            raise ValueError(f"{flag} {v}: use an integer >= 1.")
    _print_memory_plan(a, spec, get_strategy(a.strategy).speculative)
    # --hardware cuda: load straight into the offloading layout (dense on the GPU, experts pinned on the host).
    model, tok = load_model(a.model, trust_remote_code=a.trust_remote_code, **_cuda_load(a.hardware))
    kw = dict(cache_slots=a.cache_slots) if a.cache_slots is not None else dict(expert_budget=a.expert_budget)
    if a.host_budget is not None:
        kw["host_budget"] = a.host_budget
    engine = Engine(model, tok, a.strategy, draft=spec, k=a.k, hardware=a.hardware, cost_shape=a.cost_shape, **kw)
    r = engine.generate(a.prompt, max_new_tokens=a.max_new_tokens, do_sample=a.sample, temperature=a.temperature,
                        top_p=a.top_p, seed=a.seed)
    if a.json:
        print(json.dumps({"text": r.text, "token_ids": r.token_ids, "metrics": _jsonable(r.metrics)}, indent=2))
        return 0
    _print_run(a, r)
    if a.perfetto:
        r.to_perfetto(a.perfetto)
        print(f"timeline written to {a.perfetto} (open it in ui.perfetto.dev)")
    if a.html:
        r.to_html(a.html)
        print(f"report written to {a.html}")
    return 0


def _print_memory_plan(a, spec, speculative: bool) -> None:
    """What the run will hold, from the checkpoint's headers, before anything is loaded (a local folder or a
    bundled model; a hub id is not here yet). The context is counted as prompt characters + new tokens (an upper
    bound for byte-level tokenizers)."""
    path = BUNDLED.get(a.model, Path(a.model).expanduser())
    if a.json or not (path / "config.json").is_file():
        return
    ck = check_checkpoint(path, a.trust_remote_code)
    budget = a.expert_budget if a.expert_budget is not None else 0.5  # the Engine's default
    if a.cache_slots is not None:  # slots per layer as a fraction of the layer's experts
        experts = max((int(v) for k, v in ck.config.items() if k in ("num_experts", "num_local_experts",
                                                                      "n_routed_experts") and isinstance(v, int)),
                      default=1)
        budget = min(1.0, a.cache_slots / max(1, experts))
    print(plan_memory(ck, device="cuda" if a.hardware == "cuda" else "cpu", draft=spec if speculative else None,
                      context=len(a.prompt) + a.max_new_tokens, expert_budget=budget,
                      host_budget=getattr(a, "host_budget", None)))
    print()


_RUN_KEYS = ["tpot_ms", "tokens_per_s", "hit_rate", "h2d_bytes_per_token", "stall_ms_per_token", "acceptance_rate",
             "mean_accepted", "recall", "precision", "prefetch_waste_bytes", "slots_per_layer", "draft_bytes",
             "slot_bytes", "budget_bytes", "new_tokens", "disk_reads", "disk_bytes_per_token", "disk_ms_per_token",
             "host_cache_bytes"]


def _print_run(a, r) -> None:
    print(a.prompt + (r.text or ""))
    print()
    label = r.metrics["clock"] + (" (projected as " + r.metrics["cost_shape"] + ")" if r.metrics["projected"] else "")
    print(f"strategy {r.strategy} · clock {label}")
    for k in _RUN_KEYS:
        if k.startswith(("disk_", "host_cache_")) and a.host_budget is None:
            continue  # the disk tier's figures, only for a run that has one (they would all read 0)
        v = r.metrics.get(k)
        if v is not None:
            print(f"  {k:<22} {v:,.4g}" if isinstance(v, float) else f"  {k:<22} {v:,}")


def _jsonable(d):
    out = {}
    for k, v in d.items():
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else str(v)
    return out


# ----------------------------------------------------------------------------------------- bench
def _bench_budgets(a) -> list:
    """--budgets, or the one --expert-budget (same forms as everywhere: fraction, bytes, '2GiB')."""

    if a.expert_budget is not None and a.budgets is not None:
        raise ValueError("bench: give --budgets (several) or --expert-budget (one), not both.")
    budgets = [a.expert_budget] if a.expert_budget is not None else [
        budget_from_text(b) for b in (a.budgets or "0.5,0.35").split(",") if b.strip()]
    for b in budgets:
        parse_budget(b, "--budgets")
    return budgets


def _cuda_load(hardware: str | None) -> dict[str, Any]:
    """load_model arguments for a run on the CUDA clock: placed for offloading (load_model's CUDA default dtype
    is bf16: fp32 would double every copy)."""

    return {"device": "cuda"} if is_measured(hardware) else {}


def cmd_bench(a) -> int:

    if a.speed:
        return _bench_speed(a)
    if a.published:
        return _bench_published(a)
    if a.paper:
        return _bench_paper(a)
    if a.consumer:
        return _bench_consumer(a)

    # The default set is the paper's comparison plus our own; `auto` (a calibration per cell) is in --regimes.
    if a.gap and not a.trace:
        raise ValueError("bench --gap splits each row's distance to the bound, which needs the recorded routing: add "
                         "--trace FILE (record one with `specter-lab trace record`, or import one: docs/traces.md).")
    strategies = a.strategies.split(",") if a.strategies else list(STRATEGIES)
    hardware = [h for h in a.hardware.split(",") if h]
    if a.execution:  # every profile in every mode asked for: "rtx4090-pcie4@compiled", ...
        hardware = [f"{h}@{m}" for m in a.execution.split(",") if m for h in hardware]
    budgets = _bench_budgets(a)
    cost_shape = None if (a.cost_shape or "deepseek-v2-lite") == "none" else (a.cost_shape or "deepseek-v2-lite")
    spec = QuantSpec(a.bits, a.group_size, a.method)
    trace = load_trace(a.trace) if a.trace else None
    if trace is not None:  # replay every cell: no model to load; the trace's own draft and prompts
        if "cuda" in hardware:
            raise ValueError("bench --trace prices on simulated profiles: drop 'cuda' from --hardware.")
        model, tok, prompts, spec = None, None, None, None
        n_prompts, new_tokens = len(trace.sequences), f"{trace.tokens} recorded tokens"
    else:
        model, tok = load_model(a.model, trust_remote_code=a.trust_remote_code,
                                **_cuda_load("cuda" if "cuda" in hardware else None))
        prompts = heldout_prompts(a.prompts)
        n_prompts, new_tokens = len(prompts), f"{a.max_new_tokens} tokens"
    t0 = time.perf_counter()
    d = trace.draft if trace is not None else None  # an import's draft also holds its "modeled" fidelity
    recorded_draft = QuantSpec(d["bits"], d["group_size"], d["method"]).label if d and "bits" in d else d
    out: dict[str, Any] = {"model": a.model, "cost_shape": cost_shape, "draft": spec.label if spec else recorded_draft,
                           "max_new_tokens": a.max_new_tokens, "prompts": n_prompts,
                           "routing": trace.source if trace else "live",
                           "note": _bench_note(hardware, cost_shape)}
    df = bench.compare(model, tok, strategies, prompts, hardware, a.max_new_tokens, budgets, cost_shape, a.k, spec,
                       progress=not a.json, trace=trace, results=a.results)
    summ = bench.summarize(df)
    out["runs"], out["summary"] = df.to_dict(orient="records"), summ.to_dict(orient="records")
    if trace is None:
        out.update(_bench_extras(a, model, tok, prompts, hardware, budgets, cost_shape, spec))
    elif a.regimes:

        out["regimes"] = regime_map(None, None, None, progress=not a.json, trace=trace).to_dict(orient="records")
    if a.gap:
        out["gap"] = bench.compare_gaps(df, trace, cost_shape=cost_shape).to_dict(orient="records")
    out["seconds"] = time.perf_counter() - t0
    if a.json:
        print(json.dumps(out, indent=1, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    else:
        _print_bench(out, df, summ, a, n_prompts, new_tokens)
    if a.html:
        from .viz.report import bench_html

        write_atomic(a.html, bench_html(df, summ, out))
        if not a.json:
            print(f"report written to {a.html}")
    return 0


def _bench_note(hardware, cost_shape) -> str:
    """What every simulated figure of a bench assumes: profiles with their execution modes, the projection."""

    clocks = [make_clock(h) for h in hardware]
    modes = ", ".join("cuda (measured)" if c.measured else c.profile.clock_label for c in clocks)
    shape = get_cost_shape(cost_shape)
    return f"simulated clock [{modes}] · " + (f"projected as {shape.label}" if shape else "not projected (the model as it is)")


def _bench_speed(a) -> int:
    """``bench --speed``: how fast replay, the live view, the launch count, the planner and the notebooks are
    (studies/speed.py), written to --out; ``--quick``: the figures that take seconds, checked against the page."""
    from .studies import speed

    page = Path(a.out)
    results = speed.measure(quick=a.quick, notebooks=not a.no_notebooks)
    if a.speed_json:
        write_atomic(a.speed_json, json.dumps(results, default=str))
    if a.quick:
        bad = speed.regressions(results, speed.read_page(page))
        for name, (value, _) in speed.figures(results).items():
            print(f"{name}: {value:.3g}")
        if bad:
            print("slower than the page by more than 2x:\n  " + "\n  ".join(bad), file=sys.stderr)
            return 1
        print(f"no figure more than {speed.WORSE:g}x worse than {page}")
        return 0
    before = json.loads(Path(a.speed_before).read_text()) if a.speed_before else None
    speed.write_page(results, page, before)
    print(f"written to {page}")
    return 0


def _bench_paper(a) -> int:
    """``bench --paper``: Specter's headline under the artifact's protocol (sl.bench.reproduce_paper)."""


    trace = load_trace(a.trace) if a.trace else None  # replay its routing instead of running the model
    model, tok = (None, None) if trace is not None else load_model(a.model, trust_remote_code=a.trust_remote_code)
    cases = [c for c in a.cases.split(",") if c] if a.cases else list(DEFAULT_CASES)
    executions = [m for m in a.execution.split(",") if m] if a.execution else list(PAPER_EXECUTIONS)
    df = reproduce_paper(model, tok, cases, trace=trace, executions=executions, n_prompts=a.prompts,
                         max_new_tokens=a.paper_tokens, progress=not a.json, results=a.results)
    if a.json:
        print(json.dumps({"attrs": df.attrs, "rows": df.to_dict(orient="records")}, indent=1, default=str))
        return 0
    print(f"specter-lab bench --paper · model {a.model}")
    print(paper_header(df))
    cols = ["case", "execution", "method", "residents", "slots_per_layer", "k", "tpot_ms", "tpot_ms_artifact",
            "speedup", "speedup_artifact", "paper_mean", "paper_max", "hit_rate", "acceptance_rate"]
    print(_fmt(df[cols]))
    print("speedup = baseline TPOT / specter TPOT (unbiased); speedup_artifact = the same under the artifact's "
          "metric. docs/paper.md says what differs from the artifact.")
    return 0


def _bench_published(a) -> int:
    """``bench --published``: the published batch-1 table against the simulator."""

    df = published()
    notes = [f"{r.model}, {r.implementation}: {r.note}" for _, r in df.iterrows() if r.note]
    notes.append("role 'host fit': the rows the per-op host cost is the geometric-mean fit of (loo_ratio: that row "
                 "priced with the cost fitted on the other rows); 'kernel fit': the row kernel_time is derived from.")
    return _print_anchors(
        a, "published", df,
        "Published batch-1 decode (one GPU, every expert resident) vs the simulated clock. Each row: a tiny "
        "model of the family at the real depth, its aten ops counted under the row's implementation, the real "
        "sizes from the cost shape; ms = sum over forward pieces of max(device, ops x host cost).",
        ["model", "gpu", "implementation", "published_ms", "simulated_ms", "ratio", "loo_ratio",
         "aten_ops_per_token", "kernels_per_token", "host_op_cost_us", "host_only_ms", "device_only_ms",
         "profile", "execution", "role"], notes)


def _bench_consumer(a) -> int:
    """``bench --consumer``: published offloaded decode on consumer machines against the estimator, the fit and
    check rows' errors reported apart."""

    df = consumer_anchors()
    summary = consumer_summary(df)
    if a.json:
        print(json.dumps({"consumer": df.to_dict(orient="records"), "summary": summary.to_dict(orient="records")},
                         indent=1, default=str))
        return 0
    _print_anchors(
        a, "consumer", df,
        "Published offloaded decode on consumer machines (llama.cpp, ktransformers) vs the estimator (modelled: "
        "the llama.cpp-class clock sl.estimate replays on, the row's placement from the model's config, weights "
        f"format, GPU profile and host; host efficiency {HOST_DECODE_EFFICIENCY} fitted to the 'fit' rows only; "
        "'check' rows never fitted).",
        ["model", "machine", "engine", "published_tok_s", "simulated_tok_s", "ratio", "loo_ratio", "band_tok_s",
         "in_band", "dominant_unknown", "split"],
        [f"{r.model}, {r.engine}: {r.note} [{r.source}]" for _, r in df.iterrows()])
    print("\nErrors by group (|simulated / published midpoint - 1|; in_band: the published figure or range meets "
          "the printed band):")
    print(_fmt(summary))
    prop = flag_property()
    print(f"\nThe flags' property (estimator/consumer.flag_property): {prop['pairs']} random llama.cpp flag sets in "
          f"pairs over {len(PROPERTY_FAMILIES)} families, {prop['ordered']} pairs where one keeps strictly more on the "
          f"host: {len(prop['violations'])} priced faster than the other.")
    return 0


def _print_anchors(a, key: str, df, intro: str, cols: list[str], notes: list[str]) -> int:
    """A table of published rows against our figures: JSON under ``key`` with ``--json``, else the intro, the
    columns ``cols`` and a note per line."""
    if a.json:
        print(json.dumps({key: df.to_dict(orient="records")}, indent=1, default=str))
        return 0
    print(intro)
    print(_fmt(df[cols]))
    print("\nNotes:")
    for line in notes:
        print(f" * {line}")
    return 0


def _bench_extras(a, model, tok, prompts, hardware, budgets, cost_shape, spec) -> dict[str, Any]:
    """The optional tables: ablations + K sweep, CPU overhead, the regime map."""

    out: dict[str, Any] = {}
    quiet = a.json
    tightest = min(budgets, key=lambda b: b if isinstance(b, float) else float("inf"))
    if a.ablations:
        out["ablations"] = bench.ablations(model, tok, prompts, hardware[0], tightest, cost_shape, a.max_new_tokens,
                                           spec, progress=not quiet).to_dict(orient="records")
        out["k_sweep"] = bench.k_sweep(model, tok, prompts, hardware=hardware[0], expert_budget=tightest,
                                       cost_shape=cost_shape, max_new_tokens=a.max_new_tokens, draft=spec,
                                       progress=not quiet).to_dict(orient="records")
    if a.overhead:
        strategies = a.strategies.split(",") if a.strategies else list(STRATEGIES)
        out["cpu_overhead"] = bench.cpu_overhead(model, tok, prompts[0], max_new_tokens=a.max_new_tokens,
                                                 strategies=strategies).to_dict(orient="records")
    if a.regimes:

        out["regimes"] = regime_map(model, tok, prompts[:2], progress=not quiet,
                                    max_new_tokens=min(a.max_new_tokens, 32)).to_dict(orient="records")
    return out


def _fmt(df) -> str:
    return df.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def _print_bench(out, df, summ, a, n_prompts, new_tokens) -> None:

    what = (f"routing replayed from {a.trace} ({out['routing']})" if a.trace else f"model {a.model}")
    print(f"specter-lab bench · {what} · {out['note']} · draft {out['draft']} · "
          f"{n_prompts} {'recorded' if a.trace else 'held-out'} prompts × {new_tokens}")
    mean = df.groupby(["hardware", "expert_budget", "strategy"], sort=False)[
        ["tpot_ms", "x_of_bound", "hit_rate", "acceptance_rate", "recall", "stall_ms_per_token",
         "h2d_bytes_per_token", "slots_per_layer"]].mean().reset_index()
    print("\nMean over prompts (TPOT in ms, simulated; x_of_bound = the autoregressive bound's TPOT / this TPOT: "
          "1.0 is the best any non-speculative schedule can do at this memory, speculation may exceed it):")
    print(_fmt(mean))
    if "wall_s" in df:
        # a row refused in every cell (a speculative one on a trace without draft chains) ran no tokens: NaN
        speed = df.groupby("strategy", sort=False).apply(
            lambda g: g.new_tokens.sum() / g.wall_s.sum() if g.wall_s.sum() > 0 else float("nan"),
            include_groups=False)
        how = "replayed" if a.trace else "generated (live, simulated clock)"
        sweep = df.attrs.get("sweep") or {}
        where = {None: "", 1: ", one after the other in this process"}.get(
            sweep.get("workers"), f", {sweep.get('workers')} worker processes side by side")
        print(f"\nTokens {how} per second of this machine's wall time, per strategy (each cell timed where it "
              f"ran{where}):")
        print("  " + ", ".join(f"{s} {v:,.0f}" for s, v in speed.items()))
        if sweep.get("seconds"):
            n = int(df.new_tokens.sum())
            print(f"  the sweep: {sweep['cells']} cells, {n:,} tokens in {sweep['seconds']:.1f} s "
                  f"({n / sweep['seconds']:,.0f} tokens/s)")
    print("\nSpeedup of specter over the strongest baseline, and specter / oracle:")
    print(_fmt(summ[[c for c in summ.columns if not c.startswith("tpot_")]]))
    for key, title in (("ablations", "Ablations (specter, lowest budget, first profile)"),
                       ("k_sweep", "K sweep"), ("cpu_overhead", "CPU wall-clock vs HF generate (full budget)"),
                       ("regimes", "Regime map"),
                       ("gap", "Distance to the bound, split (non-speculative rows; sl.bound_gap): eviction_share, "
                               "what Belady's eviction is worth against the row's online policy; across_tokens, "
                               "copies started in earlier tokens (a draft's reach); within_token, copies started "
                               "before the router asks (a pre-gating predictor's); initial_set, residents chosen "
                               "knowing the sequence; rest, the row's own rules")):
        if key in out:
            print(f"\n{title}:")
            print(_fmt(pd.DataFrame(out[key])))
    print(f"\n({out['seconds']:.0f} s)")


# ----------------------------------------------------------------------------------------- trace
def cmd_trace_record(a) -> int:

    spec = QuantSpec(a.bits, a.group_size, a.method)  # checked before the model loads
    for flag, v in (("--max-new-tokens", a.max_new_tokens), ("--prompts", a.prompts)):
        if v < 1:
            raise ValueError(f"{flag} {v}: use an integer >= 1.")
    if Path(a.out).exists() and not a.resume:  # before the model loads: minutes, for a refusal
        raise ValueError(f"--out {a.out}: the file exists; add --resume to go on from the sequences it holds, or "
                         "give another path (nothing recorded is overwritten by accident).")
    model, tok = load_model(a.model, trust_remote_code=a.trust_remote_code,
                            **({"device": a.device} if a.device else {}))
    prompts = a.prompt or heldout_prompts(a.prompts)
    # saved after every sequence (whole): a kill loses at most the one in progress; --resume goes on from there
    trace = record(model, tok, prompts, max_new_tokens=a.max_new_tokens, k_max=a.k_max, draft=spec, out=a.out,
                   resume=a.resume)
    path = Path(a.out)
    print(f"{trace!r}\nwritten to {path} ({path.stat().st_size / 1e6:.2f} MB); replay it with "
          f"`specter-lab bench --trace {path}` or sl.replay(sl.load_trace({str(path)!r}), ...)")
    return 0


def cmd_trace_import(a) -> int:

    trace = import_routing(a.source, a.config, k_max=a.k_max, draft_bits=a.bits, format=a.format,
                           gate_recall=a.gate_recall)
    path = trace.save(a.out)
    print(f"{trace!r}\nwritten to {path}; replay it with `specter-lab bench --trace {path}`")
    return 0


def cmd_trace_export(a) -> int:

    path = load_trace(a.path).export(a.out, a.format)
    print(f"written to {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def cmd_trace_info(a) -> int:

    trace = load_trace(a.path)
    print(repr(trace))
    for key, value in sorted(trace.meta.items()):
        print(f"  {key:<20} {value}")
    return 0


# ----------------------------------------------------------------------------------------- calibrate
def cmd_calibrate(a) -> int:

    if a.host:  # no GPU needed: the host CPU's expert times, combined with any profile as '<profile>+host'
        host = calibrate_host(hidden=a.hidden, intermediate=a.intermediate, save=True)
        print(host.to_json())
        print(f"saved: DRAM read {host.dram_bandwidth / 1e9:.1f} GB/s on {host.dram_threads} threads. Use "
              "`specter-lab estimate --host calibrated ...` (sl.estimate(host='calibrated')), or "
              "hardware='<profile>+host', e.g. 'rtx4090-pcie4+host'")
        return 0
    prof = calibrate(a.name, save=True)
    print(prof.to_json())
    print(f"saved: use hardware={a.name!r}")
    return 0


# ----------------------------------------------------------------------------------------- estimate
def cmd_estimate(a) -> int:
    from .estimator.terminal import estimate_json, render_estimate

    host = a.host
    if host is not None and re.fullmatch(r"\d+(\.\d+)?", host):
        host = float(host)  # a measured GB/s
    e = estimate(a.config, gpu=a.gpu, vram=a.vram, host=host, weights=a.weights, context=a.context, depth=a.depth,
                 placement=a.placement, ram=a.ram, disk=a.disk, progress=sys.stderr.isatty(),
                 **({} if a.tokens is None else {"tokens": a.tokens}))
    fmt = "json" if a.json else a.format
    if fmt == "json":
        print(estimate_json(e, a.prompt, a.gguf))
    elif fmt == "csv":
        print(e.table.to_csv(index=False), end="")
    else:
        print(render_estimate(e, wide=a.wide, prompt=a.prompt, gguf=a.gguf))
    return 0


# ----------------------------------------------------------------------------------------- parser
def _parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(prog="specter-lab", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="generate once and print the text and metrics")
    _add_common(r)
    r.add_argument("--strategy", default="specter", help=f"one of {strategy_names()}")
    # Ends mid-line on purpose: with byte-level BPE a trailing newline splits the usual newline+indent token.
    r.add_argument("--prompt", default='def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:')
    r.add_argument("--hardware", default="rtx4090-pcie4", help=f"one of {sorted(PROFILES)} or 'cuda'")
    r.add_argument("--cache-slots", type=int, default=None)
    r.add_argument("--host-budget", type=budget_from_text, default=None,
                   help="the disk tier: host RAM for expert weights (fraction, bytes or '2GiB'); the rest is read "
                        "from the checkpoint files on demand (docs/disk_tier.md)")
    r.add_argument("--sample", action="store_true")
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.add_argument("--html", default=None, help="also write a standalone report of the run")
    r.add_argument("--perfetto", default=None, metavar="FILE",
                   help="also write the run's timeline as Chrome trace-event JSON (ui.perfetto.dev opens it)")
    r.set_defaults(fn=cmd_run)
    b = sub.add_parser("bench", help="every strategy, equal memory, named hardware: the comparison table")
    _add_common(b)
    b.add_argument("--strategies", default=None, help="comma-separated (default: all but auto; add auto to plan per cell)")
    b.add_argument("--hardware", default="rtx4090-pcie4,a100-40g-pcie4",
                   help="comma-separated profiles; a name may end in @eager or @compiled")
    b.add_argument("--execution", default=None,
                   help="comma-separated execution modes (eager,compiled): every profile in each")
    b.add_argument("--published", action="store_true",
                   help="only the published batch-1 table vs the simulator (sl.bench.published())")
    b.add_argument("--paper", action="store_true",
                   help="only Specter's headline under the artifact's protocol (sl.bench.reproduce_paper)")
    b.add_argument("--cases", default=None, help="with --paper: comma-separated cases in sl.paper.PAPER_CASES "
                   "(default: the two DeepSeek-V2-Lite ones)")
    b.add_argument("--paper-tokens", type=int, default=128, help="with --paper: tokens per run (the protocol's 128)")
    b.add_argument("--consumer", action="store_true",
                   help="only the published consumer-machine offloaded rows vs the estimator "
                        "(sl.bench.consumer_anchors())")
    b.add_argument("--budgets", default=None,
                   help="comma-separated budgets, each a fraction, bytes or '2GiB' (default 0.5,0.35)")
    b.add_argument("--prompts", type=int, default=4, help="how many held-out prompts")
    b.add_argument("--ablations", action="store_true", help="also the ablation table and K sweep")
    b.add_argument("--regimes", action="store_true", help="speedup map over budgets × profiles × cost shapes")
    b.add_argument("--overhead", action="store_true", help="CPU wall-clock overhead against HF generate")
    b.add_argument("--gap", action="store_true",
                   help="with --trace: split each non-speculative row's distance to the bound into eviction "
                        "(Belady's against the row's policy) and the schedule (copies before the router asks)")
    b.add_argument("--speed", action="store_true",
                   help="only how fast the toolkit is: replay tok/s, the live view, aten ops vs HF, sl.plan, every "
                        "notebook's Run All (studies/speed.py), written to --out")
    b.add_argument("--quick", action="store_true",
                   help="with --speed: the figures that take seconds, checked against --out (exit 1 on one more than "
                        "2x worse); writes nothing")
    b.add_argument("--out", default="docs/measured/speed.md", help="with --speed: the page")
    b.add_argument("--no-notebooks", action="store_true", help="with --speed: leave the notebooks out")
    b.add_argument("--speed-json", default=None, help="with --speed: also write the figures as JSON here")
    b.add_argument("--speed-before", default=None,
                   help="with --speed: figures (JSON from --speed-json) of an older commit, shown beside (a "
                        "\"label\" in it says what they are)")
    b.add_argument("--json", action="store_true")
    b.add_argument("--html", default=None)
    b.add_argument("--results", default=None, metavar="FILE",
                   help="write each finished cell to FILE (JSON Lines) as it completes; rerun with the same FILE "
                        "to compute only the cells it lacks (the table and with --paper the paper's)")
    b.add_argument("--trace", default=None,
                   help="replay every cell from a recorded routing trace (.npz from `specter-lab trace record`) "
                        "instead of generating: seconds instead of minutes; the model is not loaded")
    b.set_defaults(fn=cmd_bench)
    t = sub.add_parser("trace", help="record a model's routing once, for replaying every strategy from it")
    tsub = t.add_subparsers(dest="trace_cmd", required=True)
    tr = tsub.add_parser("record", help="greedy decoding with the draft chains: sl.record(...).save(--out)")
    tr.add_argument("--model", default="tiny", help="'tiny' (bundled), a local HF MoE folder, or a hub id")
    tr.add_argument("--trust-remote-code", action="store_true")
    tr.add_argument("--out", required=True, help="the trace file to write (.npz), saved after every sequence")
    tr.add_argument("--resume", action="store_true",
                    help="go on from --out: skip the sequences it holds (checked against the prompts, model and "
                         "settings; a difference is refused by name)")
    tr.add_argument("--prompts", type=int, default=4, help="how many held-out prompts (or --prompt)")
    tr.add_argument("--prompt", action="append", default=None, help="a prompt text (repeatable)")
    tr.add_argument("--max-new-tokens", type=int, default=48)
    tr.add_argument("--k-max", type=int, default=16, help="draft chain length recorded per window (0: no chains)")
    tr.add_argument("--bits", type=int, default=4)
    tr.add_argument("--group-size", type=int, default=64)
    tr.add_argument("--method", default="rtn")
    tr.add_argument("--device", default=None, help="cuda to record on the GPU (default: where the model loads)")
    tr.set_defaults(fn=cmd_trace_record)
    tm = tsub.add_parser("import", help="routing another engine wrote (vLLM, SGLang, llama.cpp moe-trace, JSONL) or "
                         "an .npz of expert ids, as a trace: sl.import_routing(...).save(--out)")
    tm.add_argument("source", help="the engine's routing file (docs/traces.md, 'Routing from other engines')")
    tm.add_argument("--config", required=True, help="the config.json (or its folder) of the model it ran")
    tm.add_argument("--out", required=True, help="the trace file to write (.npz)")
    tm.add_argument("--format", default=None, choices=FORMATS, help="when the suffix does not tell")
    tm.add_argument("--k-max", type=int, default=16, help="modelled draft chain length (0: no speculative rows)")
    tm.add_argument("--bits", type=int, default=4, help="the modelled draft's bits (its measured recall and "
                    "acceptance at that width)")
    tm.add_argument("--gate-recall", type=float, default=None, help="model gate predictions at this recall (the "
                    "pre-gated rows)")
    tm.set_defaults(fn=cmd_trace_import)
    te = tsub.add_parser("export", help="a trace's target routing in an engine's format: trace.export(--out)")
    te.add_argument("path", help="a trace file (.npz)")
    te.add_argument("--out", required=True, help="by its suffix: .npz vLLM, .json SGLang, .csv llama.cpp, .jsonl")
    te.add_argument("--format", default=None, choices=FORMATS, help="when the suffix does not tell")
    te.set_defaults(fn=cmd_trace_export)
    ti = tsub.add_parser("info", help="what a trace file holds")
    ti.add_argument("path")
    ti.set_defaults(fn=cmd_trace_info)
    c = sub.add_parser("calibrate", help="measure this CUDA machine's profile (or, with --host, its CPU) and save it")
    c.add_argument("--name", default="calibrated")
    c.add_argument("--host", action="store_true", help="time expert-sized SwiGLU on this CPU instead (no GPU)")
    c.add_argument("--hidden", type=int, default=2048, help="--host: expert hidden size (DeepSeek-V2-Lite's)")
    c.add_argument("--intermediate", type=int, default=1408, help="--host: expert intermediate size")
    c.set_defaults(fn=cmd_calibrate)
    e = sub.add_parser("estimate", help="decode speed per strategy on a machine you describe, from a config.json "
                       "alone (before any download), with the llama.cpp command")
    e.add_argument("--config", required=True,
                   help="a Hugging Face config.json (or its folder), or a bundled name (qwen3-30b-a3b, gpt-oss-20b, "
                        "deepseek-v2-lite)")
    e.add_argument("--gpu", default="rtx4090",
                   help="a card of the catalog (specter_lab.pricing.gpus: rtx3060, 'rtx 4060 ti 16gb', rtx5070, "
                        "rtx4070laptop, a4000, l40s, w7800, ...) or a profile name")
    e.add_argument("--vram", default=None, help="usable VRAM, e.g. 24GB or 8GiB (default: the card's)")
    e.add_argument("--host", default=None,
                   help="the host's memory as type-MT/s x channels (ddr4-3200x2, ddr5-5600x2, ddr4-3200x4), a "
                        "measured GB/s (45 or 45GB/s), 'calibrated' (after `specter-lab calibrate --host`) or a named "
                        "host (i5-7600k, i9-10900x, epyc-9355). Default: not given, the band spans a desktop")
    e.add_argument("--weights", default=None,
                   help="bf16, int8, q8_0, q6_k, q5_k_m, q4_k_m, q4_0, q3_k_m, q2_k, mxfp4, or '<experts>+<dense>' "
                        "(default: the checkpoint's format)")
    e.add_argument("--context", type=int, default=4096, help="tokens the KV cache holds (default 4096)")
    e.add_argument("--depth", type=int, default=None,
                   help="tokens already in the KV cache while decoding (default: unknown, priced at --context and "
                        "banded down to empty)")
    e.add_argument("--prompt", type=int, default=None,
                   help="also the time to first token at a prompt of this many tokens, per placement (modelled)")
    e.add_argument("--placement", default=None,
                   help="the llama.cpp flags you run today, priced as given beside the best; give them after '=' (e.g. --placement='--n-cpu-moe 20', "
                        "'--cpu-moe --moe-cache-mib 6000', \"-ot 'blk\\.(0|1)\\.ffn_.*_exps\\.=CPU'\")")
    e.add_argument("--ram", default=None,
                   help="host RAM free for the model's weights, e.g. 32GB (default: assumed to hold them all); where "
                        "it is short, the experts the host reads come from disk, priced per row")
    e.add_argument("--disk", default=None,
                   help="the disk's read bandwidth for experts read from disk, e.g. 3.5GB/s (default 5GB/s, banded "
                        "2-7)")
    e.add_argument("--gguf", default="model.gguf", help="the GGUF path to put in the emitted llama.cpp command")
    e.add_argument("--tokens", type=int, default=None,
                   help="decode tokens replayed per row (default 256: steadier; 64 answers about three times sooner)")
    e.add_argument("--wide", action="store_true", help="every column of the table (default: the columns that decide "
                   "first, fitted to the terminal's width)")
    e.add_argument("--format", choices=("text", "csv", "json"), default="text",
                   help="text (the report), csv (the table, every column) or json (everything)")
    e.add_argument("--json", action="store_true", help="the same as --format json")
    e.set_defaults(fn=cmd_estimate)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: the bundled model's ops are too small to share)")
    return parser


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)

    torch.set_num_threads(max(1, a.threads))
    try:
        return a.fn(a)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"specter-lab {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
