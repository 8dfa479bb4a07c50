"""One prepared, timed validation of the CUDA path: run it once on a machine with an NVIDIA GPU.

    python scripts/gpu_check.py                 # on a GPU: at most ~8 minutes, writes docs/measured/<gpu>.json/.md
    python scripts/gpu_check.py --dry-run       # the whole script on the CPU (CI): small models, simulated clock

Parts (each guarded: a failure prints its traceback, is recorded, and the next part still runs):

1. ``calibrate``: the profile of this GPU (link, latency, HBM, matmul), used by the simulated runs below.
2. per model (the bundled tiny model in fp32, and random-init bf16 models with DeepSeek-V2-Lite's and OLMoE's layer
   sizes, fewer layers, routers scaled so routing is decisive), with the expert budget capped artificially:
   * HF ``generate`` on the GPU (everything resident): its TPOT is the floor, its tokens the reference;
   * agreement of the runtime's expert math with HF's on the GPU: token agreement and the max logit difference
     teacher-forced over HF's continuation (CPU and GPU kernels, and grouped vs per-expert sums, round
     differently: this is a measurement, not a pass/fail on bit-identity);
   * every strategy on the CUDA clock (a warm-up run, then a measured ``trace="steps"`` run for TPOT and a
     ``trace="full"`` run for copies), and the same on the simulated clock with the just-calibrated profile:
     measured and simulated TPOT and their ratio, achieved H2D bandwidth against the calibrated peak;
   * host synchronisations per token (a counting torch function mode, as in ``tests/test_hot_path.py``).
3. ``race``: ``specter_plus`` with shared slots, copies delayed on the copy stream (``torch.cuda._sleep``) against
   the same run with copies ordered on the compute stream: tokens must be identical (a race changes them).

Exit code: 0 when every part ran, 1 when some part failed (its error is in the report).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
PROMPT = "def fibonacci(n):\n"


@dataclass
class Report:
    """What the run found, part by part; written as JSON and as a Markdown summary."""

    meta: dict[str, Any]
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    deadline: float = 0.0

    def part(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        left = self.deadline - time.perf_counter()
        if left < 20:
            self.parts[name] = {"ok": False, "error": f"skipped: {left:.0f} s left of the time limit"}
            print(f"[{name}] skipped (time limit)")
            return None
        t0 = time.perf_counter()
        print(f"[{name}] ...", flush=True)
        try:
            out = fn()
            self.parts[name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 1), **out}
        except Exception as e:  # guarded on purpose: the next part still runs
            traceback.print_exc()
            self.parts[name] = {"ok": False, "seconds": round(time.perf_counter() - t0, 1),
                                "error": f"{type(e).__name__}: {e}"}
            out = None
        print(f"[{name}] {'ok' if self.parts[name]['ok'] else 'FAILED'} in {self.parts[name]['seconds']} s")
        return out


# ---------------------------------------------------------------------------------------------- models
def _real_dim(family: str, dry: bool, device: str) -> dict[str, Any]:
    """Overrides for a random model with a real model's layer sizes (fewer layers; tiny in a dry run)."""
    if family == "deepseek_v3":  # DeepSeek-V2-Lite's MoE sizes on the V3 modeling code
        big = dict(hidden_size=2048, moe_intermediate_size=1408, intermediate_size=10944, n_routed_experts=64,
                   num_experts_per_tok=6, n_shared_experts=2, num_hidden_layers=3, num_attention_heads=16,
                   num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                   qk_nope_head_dim=128, v_head_dim=128, n_group=1, topk_group=1, vocab_size=32000)
        small = dict(hidden_size=128, moe_intermediate_size=64, intermediate_size=256, n_routed_experts=16,
                     num_experts_per_tok=6, n_shared_experts=2, num_hidden_layers=3, n_group=1, topk_group=1)
    else:  # olmoe: OLMoE-1B-7B's sizes
        big = dict(hidden_size=2048, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
                   num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16, vocab_size=50304)
        small = dict(hidden_size=128, intermediate_size=64, num_experts=16, num_experts_per_tok=8,
                     num_hidden_layers=2)
    return small if dry else big


def build_models(dry: bool, device: str) -> dict[str, tuple[Any, Any, list[int]]]:
    """name → (model on ``device`` with everything resident, tokenizer or None, prompt ids)."""
    import specter_lab as sl

    model, tok = sl.load_model("tiny", dtype=torch.float32)
    out = {"tiny-fp32": (model.to(device), tok, tok(PROMPT)["input_ids"])}
    ids = tok(PROMPT)["input_ids"]
    for name, fam in (("deepseek-v2-lite-dims-bf16", "deepseek_v3"), ("olmoe-dims-bf16", "olmoe")):
        with torch.device(device):  # initialise where it runs: a CPU init of 1e9 parameters takes minutes
            m = sl.tiny_random_model(fam, seed=0, **_real_dim(fam, dry, device))
        _scale_routers(m, 8.0)
        vocab = m.get_input_embeddings().weight.shape[0]
        out[name] = (m.to(torch.bfloat16).eval(), None, [t % vocab for t in ids])
    return out


def _scale_routers(model, factor: float) -> None:
    """Random init gives near-uniform router logits, so top-k is decided by rounding noise; scaled, it is decided
    by the weights, as in a trained model."""
    import specter_lab as sl

    with torch.no_grad():
        for layer in sl.inspect_model(model).layers:
            w = getattr(layer.router, "weight", None)
            if isinstance(w, torch.Tensor):
                w.mul_(factor)


# ---------------------------------------------------------------------------------------------- parts
def hf_reference(model, ids: list[int], tokens: int, device: str) -> dict[str, Any]:
    x = torch.tensor([ids], device=device)
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    with torch.no_grad():
        model.generate(x, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate(x, **kw)
        _sync(device)
        wall = time.perf_counter() - t0
    return {"tokens": out[0, len(ids):].tolist(), "tpot_ms": 1e3 * wall / tokens}


def expert_math_agreement(model, ids: list[int], ref: list[int]) -> dict[str, Any]:
    """HF's forward against the same forward with the runtime's expert math (per-expert apply + combine),
    teacher-forced over HF's own continuation: max |logit difference| and argmax agreement."""
    import specter_lab as sl
    from specter_lab.studies.fidelity import _Probe
    from specter_lab.model import attached

    info = sl.inspect_model(model)
    dev = model.get_input_embeddings().weight.device
    x = torch.tensor([ids + ref], device=dev)
    with torch.no_grad():
        hf = model(input_ids=x).logits[0].float()
        with attached(model, info, _Probe(info, None)):
            ours = model(input_ids=x).logits[0].float()
    return {"max_logit_diff": float((hf - ours).abs().max()),
            "argmax_agreement": float((hf.argmax(-1) == ours.argmax(-1)).float().mean())}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_strategy(model, tok, ids, strategy: str, budget: float, hardware, tokens: int,
                 ref: list[int]) -> dict[str, Any]:
    """Warm-up, a speed run (trace='steps'), a full-trace run (copies, stalls), syncs per token."""
    import specter_lab as sl
    from specter_lab.pricing.opcount import CountSyncs

    eng = sl.Engine(model, tok, strategy, expert_budget=budget, hardware=hardware, trace="steps")
    eng.info.eos_token_ids = []  # exactly `tokens` tokens, like HF's min_new_tokens
    eng.generate(ids, max_new_tokens=4)  # warm-up: draft quantization, pools, kernels
    speed = eng.generate(ids, max_new_tokens=tokens)
    full = sl.Engine(model, tok, strategy, expert_budget=budget, hardware=hardware, trace="full")
    full.info.eos_token_ids = []
    r = full.generate(ids, max_new_tokens=tokens)
    counts = []
    for n in (8, 8 + tokens):
        mode = CountSyncs()  # the package's counter, as tests/test_hot_path.py uses it
        with mode:
            eng.generate(ids, max_new_tokens=n)
        counts.append(mode.n)
    agree = sum(a == b for a, b in zip(speed.token_ids, ref)) / max(len(ref), 1)
    first = next((i for i, (a, b) in enumerate(zip(speed.token_ids, ref)) if a != b), None)
    return {"tpot_ms": speed.metrics["tpot_ms"], "tpot_ms_full_trace": r.metrics["tpot_ms"],
            "stall_ms_per_token": r.metrics["stall_ms_per_token"], "hit_rate": r.metrics["hit_rate"],
            "h2d_bytes_per_token": r.metrics["h2d_bytes_per_token"], "h2d_gbps": _achieved_h2d(r),
            "syncs_per_token": (counts[1] - counts[0]) / tokens, "token_agreement": agree,
            "first_divergence": first, "slots_per_layer": min(eng.split.slots_per_layer)}


def _achieved_h2d(result) -> float | None:
    """Bytes over the union of the copy intervals (GB/s): what the link delivered while it was busy."""
    tr = result.frames()["transfers"].sort_values("start")
    if not len(tr):
        return None
    busy, end = 0.0, float("-inf")
    for s, e in zip(tr.start, tr.end):
        if e > end:
            busy += e - max(s, end)
            end = e
    return float(tr.bytes.sum()) / (busy * 1e-3) / 1e9 if busy > 0 else None


def model_part(name, model, tok, ids, a, device, profile) -> dict[str, Any]:
    import specter_lab as sl
    from specter_lab.model import place_for_offload

    ref = hf_reference(model, ids, a.tokens, device)
    out: dict[str, Any] = {"hf_tpot_ms": ref["tpot_ms"], "dtype": str(next(model.parameters()).dtype)}
    out.update(expert_math_agreement(model, ids, ref["tokens"]))
    if device == "cuda":
        place_for_offload(model)  # experts to pinned host memory, the rest stays on the GPU
    rows = {}
    for s in [s for s in sl.STRATEGIES if s != "auto"]:
        try:
            real = run_strategy(model, tok, ids, s, a.budget, "cuda" if device == "cuda" else profile,
                                a.tokens, ref["tokens"])
            sim = sl.Engine(model, tok, s, expert_budget=a.budget, hardware=profile, trace="steps")
            sim.info.eos_token_ids = []
            real["sim_tpot_ms"] = sim.generate(ids, max_new_tokens=a.tokens).metrics["tpot_ms"]
            real["measured_over_sim"] = real["tpot_ms"] / real["sim_tpot_ms"]
            rows[s] = real
        except Exception as e:
            traceback.print_exc()
            rows[s] = {"error": f"{type(e).__name__}: {e}"}
        print(f"  {name} {s:<15} " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in rows[s].items()), flush=True)
    out["strategies"] = rows
    if device == "cuda":
        model.to("cpu")
        torch.cuda.empty_cache()
    return out


@contextmanager
def copies(clock, mode: str):
    """``delayed``: every copy waits ~1 ms on the copy stream first (widens any race window); ``ordered``: copies
    run on the compute stream (nothing overlaps). A no-op on the simulated clock."""
    if not clock.measured:
        yield
        return
    if mode == "ordered":
        clock.copy_stream = torch.cuda.current_stream(clock.device)
        yield
        return
    orig = clock.copy

    def delayed(duration, fn, after=(), issue_at=None):
        return orig(duration, lambda: (torch.cuda._sleep(1_000_000), fn()), after, issue_at)

    clock.copy = delayed
    try:
        yield
    finally:
        clock.copy = orig


class _CopiesIn:
    """The engine's clock factory, with every clock it makes running its copies in ``mode`` (see :func:`copies`)."""

    def __init__(self, factory, mode: str) -> None:
        self.factory, self.mode = factory, mode
        self.profile, self.measured = factory.profile, factory.measured

    def make(self, *args, **kwargs):
        clock = self.factory.make(*args, **kwargs)
        copies(clock, self.mode).__enter__()  # lives for the run: the clock is used only by it
        return clock


def race_part(model, tok, ids, a, hardware) -> dict[str, Any]:
    import specter_lab as sl

    tokens = {}
    for mode in ("ordered", "delayed"):
        eng = sl.Engine(model, tok, "specter_plus", expert_budget=a.budget, hardware=hardware, shared_slots=True)
        eng.setup = dataclasses.replace(eng.setup, clocks=_CopiesIn(eng.clocks, mode))
        tokens[mode] = eng.generate(ids, max_new_tokens=a.tokens).token_ids
    same = tokens["ordered"] == tokens["delayed"]
    if not same:
        raise AssertionError(f"delayed copies changed the tokens: {tokens}")
    return {"identical": same, "tokens": len(tokens["ordered"])}


# ---------------------------------------------------------------------------------------------- output
def write(report: Report, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = report.meta["slug"]
    js, md = out_dir / f"{slug}.json", out_dir / f"{slug}.md"
    from specter_lab.atomic import write_atomic  # each page whole: a run stopped while writing keeps the last one

    write_atomic(js, json.dumps({"meta": report.meta, "parts": report.parts}, indent=1, default=str) + "\n")
    write_atomic(md, markdown(report))
    return js, md


def markdown(report: Report) -> str:
    m = report.meta
    lines = [f"# GPU check: {m['device']}", "", f"`{m['command']}` · torch {m['torch']} · transformers "
             f"{m['transformers']} · {m['date']}" + (" · **dry run on the CPU (simulated clock)**" if m["dry_run"]
                                                     else ""), ""]
    cal = report.parts.get("calibrate", {})
    if cal.get("ok"):
        lines += ["## Calibrated profile", "", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in cal["profile"].items() if isinstance(v, (int, float))] + [""]
    for name, p in report.parts.items():
        if "strategies" not in p or not p.get("ok"):
            continue
        lines += [f"## {name} ({p['dtype']})", "", f"HF generate, everything resident: {p['hf_tpot_ms']:.3f} ms "
                  f"per token. Runtime expert math vs HF (teacher-forced): max logit diff "
                  f"{p['max_logit_diff']:.3g}, argmax agreement {p['argmax_agreement']:.3f}.", "",
                  "| strategy | measured TPOT ms | simulated ms | measured/sim | stall ms/tok | hit | H2D GB/s | "
                  "syncs/tok | token agreement |", "|---|---|---|---|---|---|---|---|---|"]
        for s, r in p["strategies"].items():
            if "error" in r:
                lines.append(f"| {s} | error: {r['error']} | | | | | | | |")
                continue
            h2d = f"{r['h2d_gbps']:.1f}" if r["h2d_gbps"] else "–"
            lines.append(f"| {s} | {r['tpot_ms']:.3f} | {r['sim_tpot_ms']:.3f} | {r['measured_over_sim']:.2f} | "
                         f"{r['stall_ms_per_token']:.3f} | {r['hit_rate']:.2f} | {h2d} | "
                         f"{r['syncs_per_token']:.1f} | {r['token_agreement']:.2f} |")
        lines.append("")
    lines += ["## Parts", "", "| part | ok | seconds | error |", "|---|---|---|---|"]
    lines += [f"| {n} | {p['ok']} | {p.get('seconds', '')} | {p.get('error', '')} |" for n, p in report.parts.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the whole script on the CPU (small models, simulated)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--budget", type=float, default=0.4, help="expert budget (fraction): capped on purpose")
    ap.add_argument("--limit-s", type=float, default=480, help="stop starting parts after this many seconds")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "measured")
    a = ap.parse_args(argv)
    if not a.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --dry-run to exercise the script on the CPU).", file=sys.stderr)
        return 2
    import transformers

    import specter_lab as sl

    device = "cpu" if a.dry_run else "cuda"
    name = "dry-run-cpu" if a.dry_run else torch.cuda.get_device_name()
    meta = {"device": name, "slug": "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-"),
            "dry_run": a.dry_run, "torch": torch.__version__, "transformers": transformers.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens": a.tokens, "budget": a.budget,
            "command": "python scripts/gpu_check.py" + (" --dry-run" if a.dry_run else "")}
    report = Report(meta, deadline=time.perf_counter() + a.limit_s)
    profile = sl.PROFILES["rtx4090-pcie4"]
    cal = report.part("calibrate", lambda: {"profile": vars(_calibrate(a.dry_run))})
    if cal:
        profile = sl.HardwareProfile(**cal["profile"])
    built: dict[str, tuple] = {}
    report.part("build models", lambda: {"models": list(built.update(build_models(a.dry_run, device)) or built)})
    for mname, (model, tok, ids) in built.items():
        report.part(mname, lambda: model_part(mname, model, tok, ids, a, device, profile))
    tiny = built.get("tiny-fp32")
    if tiny:
        from specter_lab.model import place_for_offload

        if device == "cuda":
            place_for_offload(tiny[0])
        report.part("race", lambda: race_part(*tiny, a, "cuda" if device == "cuda" else profile))
    js, md = write(report, a.out)
    print(f"wrote {js} and {md}")
    return 0 if all(p["ok"] for p in report.parts.values()) else 1


def _calibrate(dry: bool):
    import specter_lab as sl

    if dry:
        return sl.PROFILES["rtx4090-pcie4"]  # nothing to measure on the CPU: the named profile stands in
    return sl.calibrate("gpu-check", save=False)


if __name__ == "__main__":
    sys.exit(main())
