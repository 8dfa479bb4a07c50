"""How fast the toolkit is where a user waits: ``specter-lab bench --speed`` measures it and writes
``docs/measured/speed.md``; ``--quick`` measures the figures that take seconds and fails on one more than 2x
worse than the page's (what ``.ci/run`` runs).

Measured, one after the other, on the machine it runs on:

* **replay**: replayed tokens per second of ``sl.replay`` for every strategy on two traces of real geometry made
  from synthetic routing (:func:`speed_traces`: DeepSeek-V2-Lite's 26 MoE layers × 64 experts, top-6; Mixtral-8x7B's
  32 × 8, top-2; a 64-token prompt and 512 decoded tokens, a modelled draft and gate predictions), at
  ``trace_level="steps"`` (what the estimate, the planner and every sweep run) and ``"full"`` (``sl.replay``'s
  default, every per-op record);
* **the live view**: ``sl.viz.live(...).join()`` over a plain ``generate`` of the same engine (bundled model,
  ``specter``, 100 and 300 tokens);
* **the launch count**: aten ops per committed token, ``specter`` over HF ``generate`` (the package's op counter,
  as ``tests/test_hot_path.py`` counts them: the difference of a long and a short run);
* **the planner**: ``sl.plan`` on notebook 04's setting, then again on the same model at another budget;
* **a comparison**: the README's ``sl.compare`` on the bundled model;
* **the notebooks**: each ``notebooks/0*.ipynb`` Run All under nbclient.

The machine is shared, so code is timed in CPU seconds (``time.process_time``, every thread of the process), the
best of a few runs: the wall clock would time the neighbours too. A notebook's Run All is wall time (it is what a
reader waits for, kernel start included), as is the planner's second figure.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from datetime import date
from pathlib import Path
from typing import Any, Callable

from ..atomic import write_atomic

__all__ = ["measure", "write_page", "read_page", "regressions", "speed_traces", "best_seconds", "PAGE",
           "TRACES"]

PAGE = Path("docs/measured/speed.md")
TRACES = {"deepseek-v2-lite": "DeepSeek-V2-Lite (26 MoE layers × 64 experts, top-6)",
          "mixtral-8x7b": "Mixtral-8x7B (32 MoE layers × 8 experts, top-2)"}
PROMPT, DECODE = 64, 512
SPEC_BUDGET = {"mixtral-8x7b": 0.6}  # Mixtral's default budget holds no draft beside one slot per layer
PLAN_04 = dict(hardware="rtx4090-pcie4", expert_budget=0.35, cost_shape="deepseek-v2-lite")  # notebook 04's plan
PLAN_AGAIN = {**PLAN_04, "expert_budget": 0.5}  # the same model planned again, at another budget
WORSE = 2.0  # --quick fails on a figure this many times worse than the page's


def best_seconds(fn: Callable[[], Any], n: int = 3, clock: Callable[[], float] = time.process_time) -> float:
    """The least seconds of ``n`` runs of ``fn`` on ``clock`` (CPU seconds by default; noise only ever adds)."""
    best = float("inf")
    for _ in range(n):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def speed_traces() -> dict:
    """The two replay traces (module docstring), made the same way every time (seed 0)."""
    import specter_lab as sl
    from specter_lab.model.geometry import geometry_from_config, load_config
    from specter_lab.traces.synthetic import locality_for, synthetic_routing

    out = {}
    for name in TRACES:
        g = geometry_from_config(name)
        ids = synthetic_routing(g.moe_layers, g.num_experts, g.top_k, PROMPT + DECODE, locality_for(g.model_type), 0)
        out[name] = sl.import_routing(ids, load_config(name).to_dict(), segments=[(0, PROMPT, "prefill"),
                                                                                  (PROMPT, DECODE, "decode")],
                                      gate_recall=0.5)
    return out


def replay_speed(strategies: "list[str] | None" = None, levels=("steps", "full"), repeat: int = 3) -> list[dict]:
    """Replayed tokens/s per trace, strategy and trace level (best of ``repeat`` after a warm run)."""
    import specter_lab as sl

    rows = []
    for tname, trace in speed_traces().items():
        for s in strategies or [s for s in sl.STRATEGIES if s != "auto"]:
            kw = {"expert_budget": SPEC_BUDGET[tname]} if sl.STRATEGIES[s].speculative and tname in SPEC_BUDGET else {}
            for level in levels:
                sl.replay(trace, s, trace_level=level, **kw)  # warm: skeleton, cost model, op counts
                secs = best_seconds(lambda: sl.replay(trace, s, trace_level=level, **kw), repeat)
                rows.append({"trace": tname, "strategy": s, "level": level, "tokens_per_s": trace.tokens / secs})
    return rows


def _fresh_model():
    """The bundled model, loaded for one figure (one thread; nothing recorded of it yet)."""
    import torch

    import specter_lab as sl

    torch.set_num_threads(1)
    return sl.load_model("tiny")


def live_ratio(tokens=(100, 300), repeat: int = 3, strategy: str = "specter") -> list[dict]:
    """CPU time of a live view's run over a plain ``generate`` (the view never shown, as in a script)."""
    import specter_lab as sl

    model, tok = _fresh_model()
    eng = sl.Engine(model, tok, strategy)
    eng.info.eos_token_ids = []  # every run commits exactly n tokens
    prompt = "def fib(n):"
    eng.generate(prompt, max_new_tokens=8)
    sl.viz.live(eng, prompt, max_new_tokens=8).join()  # warm: the widget modules
    rows = []
    for n in tokens:
        plain = best_seconds(lambda: eng.generate(prompt, max_new_tokens=n), repeat)
        live = best_seconds(lambda: sl.viz.live(eng, prompt, max_new_tokens=n).join(), repeat)
        rows.append({"tokens": n, "plain_s": plain, "live_s": live, "ratio": live / plain})
    return rows


def op_ratio() -> list[dict]:
    """Aten ops per committed token of ``specter`` (the packed int4 draft a GPU runs, and the CPU's default) over
    HF ``generate``'s, counted as ``tests/test_hot_path.py`` counts them."""
    import torch

    import specter_lab as sl
    from specter_lab.pricing.opcount import CountOps
    from specter_lab.run.quant import DraftExperts

    model, tok = _fresh_model()
    prompt, new = "def fib(n):", 24

    def per_token(run) -> float:
        counts = []
        for n in (8, 8 + new):
            mode = CountOps()
            with mode:
                run(n)
            counts.append(sum(mode.funcs.values()))
        return (counts[1] - counts[0]) / new

    ids = torch.tensor([tok.encode(prompt)])
    hf = per_token(lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False))
    rows = []
    engines = (("specter, packed int4 draft (the device layout)", True), ("specter, the CPU's draft", False))
    for label, packed in engines:
        eng = sl.Engine(model, tok, "specter", expert_budget=0.5, k=8, draft=sl.QuantSpec(bits=4, group_size=64))
        if packed:
            eng._draft = DraftExperts(eng.info, eng.draft_spec, pack=True)
        eng.info.eos_token_ids = []
        eng.generate(prompt, max_new_tokens=4)
        ops = per_token(lambda n: eng.generate(prompt, max_new_tokens=n))
        rows.append({"engine": label, "ops_per_token": ops, "hf_ops_per_token": hf, "ratio": ops / hf})
    return rows


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its CPU seconds and its wall seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - t0


def plan_seconds() -> dict:
    """``sl.plan`` on notebook 04's setting: CPU and wall seconds, and its pick; then ``sl.plan`` again on the same
    model at another budget (``again_*``: what the first recorded is replayed, :mod:`.calibration`)."""
    import specter_lab as sl

    model, tok = _fresh_model()
    p, cpu, wall = _timed(lambda: sl.plan(model, tok, progress=False, **PLAN_04))
    again, again_cpu, again_wall = _timed(lambda: sl.plan(model, tok, progress=False, **PLAN_AGAIN))
    return {"cpu_s": cpu, "wall_s": wall, "pick": p.label, "candidates": len(p.table), "again_cpu_s": again_cpu,
            "again_wall_s": again_wall, "again_pick": again.label}


COMPARE_README = dict(strategies=["lru", "specter", "oracle"], hardware=["rtx4090-pcie4", "a100-40g-pcie4"],
                      expert_budget=[0.5, 0.35], cost_shape="deepseek-v2-lite")  # the README's sl.compare


def compare_seconds() -> dict:
    """The README's ``sl.compare`` on the bundled model (a model of its own: nothing recorded before): CPU and wall
    seconds, and its rows."""
    import specter_lab as sl

    model, tok = _fresh_model()
    df, cpu, wall = _timed(lambda: sl.compare(model, tok, progress=False, **COMPARE_README))
    return {"cpu_s": cpu, "wall_s": wall, "rows": len(df)}


def notebook_seconds(folder: "str | Path" = "notebooks", timeout: int = 900) -> list[dict]:
    """Each notebook's Run All under nbclient: wall seconds, and the slowest cells."""
    import nbformat
    from nbclient import NotebookClient

    rows = []
    for path in sorted(Path(folder).glob("0*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                                resources={"metadata": {"path": str(path.parent)}})
        t0 = time.perf_counter()
        error = None
        try:
            client.execute()
        except Exception as exc:  # noqa: BLE001 - a failing notebook is a row that says where, not the end
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:160]}"
        rows.append({"notebook": path.name, "wall_s": time.perf_counter() - t0, "slowest": _slowest(nb),
                     "error": error})
    return rows


def _slowest(nb, n: int = 3) -> list:
    from datetime import datetime

    def ts(s: str) -> datetime:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))

    cells = []
    for i, c in enumerate(nb.cells):
        ex = c.get("metadata", {}).get("execution", {})
        if c.cell_type == "code" and "iopub.execute_input" in ex and "shell.execute_reply" in ex:
            secs = (ts(ex["shell.execute_reply"]) - ts(ex["iopub.execute_input"])).total_seconds()
            first = next(iter(c.source.splitlines()), "")[:60]
            cells.append((round(secs, 1), i, first))
    return sorted(cells, reverse=True)[:n]


def measure(quick: bool = False, notebooks: bool = True) -> dict:
    """Every figure (``quick``: the ones that take seconds: ``lru`` replays at both levels, the live view at 100
    tokens, the op ratio, the planner and the README's comparison)."""
    out: dict[str, Any] = {"date": date.today().isoformat(), "machine": _machine(), "quick": quick}
    out["replay"] = replay_speed(["lru"] if quick else None)
    out["live"] = live_ratio((100,) if quick else (100, 300))
    out["ops"] = op_ratio()
    out["plan"] = plan_seconds()
    out["compare"] = compare_seconds()
    if notebooks and not quick:
        out["notebooks"] = notebook_seconds()
    return out


def _machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.processor() or platform.machine()}, {cores} cores, Python {platform.python_version()}"


# ------------------------------------------------------------------------------------------------ the page
def figures(results: dict) -> dict[str, tuple[float, str]]:
    """The figures a quick run is held to: name → (value, "higher" | "lower" is better)."""
    out = {}
    for r in results.get("replay", []):
        if r["strategy"] == "lru":
            out[f"replay lru {r['trace']} {r['level']} tok/s"] = (r["tokens_per_s"], "higher")
    for r in results.get("live", []):
        out[f"live view / generate at {r['tokens']} tokens"] = (r["ratio"], "lower")
    for r in results.get("ops", []):
        out[f"aten ops ratio: {r['engine']}"] = (r["ratio"], "lower")
    if "plan" in results:
        out["sl.plan cpu s (notebook 04)"] = (results["plan"]["cpu_s"], "lower")
    if "compare" in results:
        out["sl.compare cpu s (the README's)"] = (results["compare"]["cpu_s"], "lower")
    return out


def regressions(now: dict, committed: dict, worse: float = WORSE) -> list[str]:
    """The figures of ``now`` more than ``worse`` times worse than the same ones in ``committed``."""
    have, ref = figures(now), figures(committed)
    bad = []
    for name, (value, better) in have.items():
        if name not in ref:
            continue
        base = ref[name][0]
        if (better == "higher" and value * worse < base) or (better == "lower" and value > worse * base):
            bad.append(f"{name}: {value:.3g} now, {base:.3g} on the page (more than {worse:g}x worse)")
    return bad


_JSON = re.compile(r"<!-- speed-json\n(.*?)\n-->", re.S)


def read_page(path: "str | Path" = PAGE) -> dict:
    """The figures a page was written with (its embedded JSON)."""
    m = _JSON.search(Path(path).read_text())
    if m is None:
        raise ValueError(f"{path}: no speed figures in it (write it with `specter-lab bench --speed`).")
    return json.loads(m.group(1))


def write_page(results: dict, path: "str | Path" = PAGE, before: dict | None = None) -> Path:
    """``docs/measured/speed.md`` from :func:`measure`'s results (``before``: the same measured on an older commit,
    shown beside)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, page_text(results, before))
    return path


def page_text(results: dict, before: dict | None = None) -> str:
    """The page's markdown (see :func:`write_page`)."""
    b = before or {}
    lines = [f"# Speed (`specter-lab bench --speed`, {results['date']})", "",
             f"Measured on {results['machine']} (this project's shared 2-core box), one figure after the other. "
             "Code is timed in CPU seconds (`time.process_time`), the best of 3 runs: the wall clock would time the "
             "neighbours too. Notebook Run All times are wall seconds under nbclient (kernel start included). "
             "`specter-lab bench --speed --quick` (`.ci/run`) measures the `lru` replays, the live view at 100 "
             "tokens, the op ratios and the planner again and fails on one more than 2x worse than here.", ""]
    lines += ["## Replay", "",
              f"Replayed tokens/s of `sl.replay` (best of 3 after a warm run): traces of real geometry from synthetic "
              f"routing, a {PROMPT}-token prompt and {DECODE} decoded tokens, modelled draft and gate predictions "
              f"(`specter_lab.studies.speed.speed_traces`); default budget, and {SPEC_BUDGET['mixtral-8x7b']} for "
              "Mixtral's "
              "speculative rows. `steps`: what the estimate, the planner and every sweep run; `full`: "
              "`sl.replay`'s default (every per-op record).", ""]
    rep = results.get("replay", [])
    prev = {(r["trace"], r["strategy"], r["level"]): r["tokens_per_s"] for r in b.get("replay", [])}
    levels = [lv for lv in ("steps", "full") if any(r["level"] == lv for r in rep)]
    head = ["strategy"] + [f"{t.split('-')[0]} {lv}" for t in TRACES for lv in levels]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in dict.fromkeys(r["strategy"] for r in rep):
        cells = [f"`{s}`"]
        for t in TRACES:
            for lv in levels:
                now = next((r["tokens_per_s"] for r in rep if (r["trace"], r["strategy"], r["level"]) == (t, s, lv)),
                           None)
                old = prev.get((t, s, lv))
                cells.append("" if now is None else (f"{now:,.0f}" + (f" ({old:,.0f})" if old else "")))
        lines.append("| " + " | ".join(cells) + " |")
    if prev:
        lines += ["", f"In brackets, here and below: {b.get('label', 'the same on the commit before (measured beside it, same machine)')}."]
    lines += ["", "## The live view", "",
              "`sl.viz.live(engine, prompt, n).join()` over `engine.generate(prompt, n)`, CPU seconds, bundled model, "
              "`specter`, the view not shown (a script): its dashboard is drawn when it is shown.", "",
              "| tokens | generate s | live s | ratio |", "|---|---|---|---|"]
    for r in results.get("live", []):
        old = next((x["ratio"] for x in b.get("live", []) if x["tokens"] == r["tokens"]), None)
        lines.append(f"| {r['tokens']} | {r['plain_s']:.2f} | {r['live_s']:.2f} | {r['ratio']:.2f}"
                     + (f" ({old:.2f})" if old else "") + " |")
    lines += ["", "## The launch count", "", "Aten ops per committed token (bundled model, budget 0.5, int4-g64 "
              "draft, K = 8; the difference of a 32- and an 8-token run, as `tests/test_hot_path.py` counts them).", "",
              "| engine | ops / token | HF generate | ratio |", "|---|---|---|---|"]
    for r in results.get("ops", []):
        old = next((x["ratio"] for x in b.get("ops", []) if x["engine"] == r["engine"]), None)
        lines.append(f"| {r['engine']} | {r['ops_per_token']:.0f} | {r['hf_ops_per_token']:.0f} | {r['ratio']:.2f}"
                     + (f" ({old:.2f})" if old else "") + " |")
    if "plan" in results:
        p, old = results["plan"], b.get("plan", {})
        lines += ["", "## The planner", "",
                  f"`sl.plan(model, tok, hardware='rtx4090-pcie4', expert_budget=0.35, cost_shape='deepseek-v2-lite')` "
                  f"(notebook 04's cell, {p['candidates']} candidates): **{p['cpu_s']:.1f} s** CPU, "
                  f"{p['wall_s']:.1f} s "
                  f"wall, pick `{p['pick']}`" + (f" (before: {old['cpu_s']:.1f} s CPU, {old['wall_s']:.1f} s wall)"
                                                 if old else "") + "."]
        if "again_cpu_s" in p:
            lines += ["", f"The same model planned again at `expert_budget=0.5` (what the first plan recorded is "
                      f"replayed; only chains it did not draft are drafted): **{p['again_cpu_s']:.1f} s** CPU, "
                      f"{p['again_wall_s']:.1f} s wall, pick `{p['again_pick']}`"
                      + (f" (before: {old['again_cpu_s']:.1f} s CPU)" if "again_cpu_s" in old else "") + "."]
    if "compare" in results:
        c, old = results["compare"], b.get("compare", {})
        lines += ["", "## A comparison", "",
                  "The README's `sl.compare(model, tok, strategies=['lru', 'specter', 'oracle'], hardware=["
                  "'rtx4090-pcie4', 'a100-40g-pcie4'], expert_budget=[0.5, 0.35], cost_shape='deepseek-v2-lite')` "
                  f"on the bundled model ({c['rows']} rows, 4 held-out prompts x 48 tokens): **{c['cpu_s']:.1f} s** "
                  f"CPU, {c['wall_s']:.1f} s wall" + (f" (before: {old['cpu_s']:.1f} s CPU)" if old else "") + "."]
    if results.get("notebooks"):
        lines += ["", "## The notebooks", "", "Run All under nbclient, wall seconds (the three slowest cells).", "",
                  "| notebook | Run All s | slowest cells (s, cell) |", "|---|---|---|"]
        olds = {x["notebook"]: x["wall_s"] for x in b.get("notebooks", [])}
        for r in results["notebooks"]:
            slow = "; ".join(f"{s} s [{i}] `{src}`" for s, i, src in r["slowest"])
            old = olds.get(r["notebook"])
            failed = f" **failed**: {r['error']}; " if r.get("error") else ""
            lines.append(f"| {r['notebook']} | {r['wall_s']:.0f}" + (f" ({old:.0f})" if old else "")
                         + f" | {failed}{slow} |")
    lines += ["", "<!-- speed-json", json.dumps({k: v for k, v in results.items()}, default=str), "-->", ""]
    return "\n".join(lines)
