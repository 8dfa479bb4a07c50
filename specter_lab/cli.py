"""Command line: ``specter-lab run | bench | calibrate``. Same names as the Python API."""

from __future__ import annotations

import argparse
import json
import sys


def _budget(text: str):
    try:
        v = float(text)
    except ValueError:
        return text  # '2GiB' etc.: the Engine parses and validates it
    return v if v <= 1 else int(v)


def _k(text: str):
    return text if text == "auto" else int(text)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="'tiny' (bundled), a local HF MoE folder, or a hub id")
    p.add_argument("--expert-budget", type=_budget, default=None,
                   help="fraction of routed-expert bytes (0-1], bytes, or '2GiB' (default 0.5)")
    p.add_argument("--bits", type=int, default=4, help="draft bits: 2, 3, 4 or 8")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--method", default="rtn", help="draft quantizer: rtn or hqq")
    p.add_argument("--k", type=_k, default=None, help="draft length, or 'auto'")
    p.add_argument("--cost-shape", default=None, help="price experts as a real model (projected)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--trust-remote-code", action="store_true")


def cmd_run(a) -> int:
    import specter_lab as sl

    spec = sl.QuantSpec(a.bits, a.group_size, a.method)
    # Check names and counts before loading the model (the slow part); the Engine checks the rest.
    from .offload.hardware import get_cost_shape, get_profile
    from .strategies import get_strategy

    get_strategy(a.strategy), get_profile(a.hardware), get_cost_shape(a.cost_shape)
    for flag, v in (("--max-new-tokens", a.max_new_tokens), ("--cache-slots", a.cache_slots), ("--k", a.k)):
        if isinstance(v, int) and v < 1:
            raise ValueError(f"{flag} {v}: use an integer >= 1.")
    model, tok = sl.load_model(a.model, trust_remote_code=a.trust_remote_code)
    kw = dict(cache_slots=a.cache_slots) if a.cache_slots is not None else dict(expert_budget=a.expert_budget)
    engine = sl.Engine(model, tok, a.strategy, draft=spec, k=a.k, hardware=a.hardware, cost_shape=a.cost_shape, **kw)
    r = engine.generate(a.prompt, max_new_tokens=a.max_new_tokens, do_sample=a.sample, temperature=a.temperature,
                        top_p=a.top_p, seed=a.seed)
    if a.json:
        print(json.dumps({"text": r.text, "token_ids": r.token_ids, "metrics": _jsonable(r.metrics)}, indent=2))
        return 0
    print(a.prompt + (r.text or ""))
    print()
    label = r.metrics["clock"] + (" (projected as " + r.metrics["cost_shape"] + ")" if r.metrics["projected"] else "")
    print(f"strategy {r.strategy} · clock {label}")
    keys = ["tpot_ms", "tokens_per_s", "hit_rate", "h2d_bytes_per_token", "stall_ms_per_token", "acceptance_rate",
            "mean_accepted", "recall", "precision", "prefetch_waste_bytes", "slots_per_layer", "draft_bytes",
            "slot_bytes", "budget_bytes", "new_tokens"]
    for k in keys:
        v = r.metrics.get(k)
        if v is None:
            continue
        print(f"  {k:<22} {v:,.4g}" if isinstance(v, float) else f"  {k:<22} {v:,}")
    if a.html:
        r.to_html(a.html)
        print(f"report written to {a.html}")
    return 0


def _jsonable(d):
    out = {}
    for k, v in d.items():
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else str(v)
    return out


def cmd_calibrate(a) -> int:
    import specter_lab as sl

    prof = sl.calibrate(a.name, save=True)
    print(prof.to_json())
    print(f"saved: use hardware={a.name!r}")
    return 0


def cmd_bench(a) -> int:
    from .bench import bench_main

    return bench_main(a)


def main(argv: list[str] | None = None) -> int:
    import specter_lab as sl

    parser = argparse.ArgumentParser(prog="specter-lab", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="generate once and print the text and metrics")
    _add_common(r)
    r.add_argument("--strategy", default="specter", help=f"one of {list(sl.STRATEGIES)}")
    # Ends mid-line on purpose: with byte-level BPE a trailing newline splits the usual newline+indent token.
    r.add_argument("--prompt", default='def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:')
    r.add_argument("--hardware", default="rtx4090-pcie4", help=f"one of {sorted(sl.PROFILES)} or 'cuda'")
    r.add_argument("--cache-slots", type=int, default=None)
    r.add_argument("--sample", action="store_true")
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.add_argument("--html", default=None, help="also write a standalone report of the run")
    r.set_defaults(fn=cmd_run)
    b = sub.add_parser("bench", help="every strategy, equal memory, named hardware: the comparison table")
    _add_common(b)
    b.add_argument("--strategies", default=None, help="comma-separated (default: all but auto; add auto to plan per cell)")
    b.add_argument("--hardware", default="rtx4090-pcie4,a100-40g-pcie4")
    b.add_argument("--budgets", default="0.5,0.35")
    b.add_argument("--prompts", type=int, default=4, help="how many held-out prompts")
    b.add_argument("--ablations", action="store_true", help="also the ablation table and K sweep")
    b.add_argument("--regimes", action="store_true", help="speedup map over budgets × profiles × cost shapes")
    b.add_argument("--overhead", action="store_true", help="CPU wall-clock overhead against HF generate")
    b.add_argument("--json", action="store_true")
    b.add_argument("--html", default=None)
    b.set_defaults(fn=cmd_bench)
    c = sub.add_parser("calibrate", help="measure this CUDA machine's profile and save it")
    c.add_argument("--name", default="calibrated")
    c.set_defaults(fn=cmd_calibrate)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: the bundled model's ops are too small to share)")
    a = parser.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, a.threads))
    try:
        return a.fn(a)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"specter-lab {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
