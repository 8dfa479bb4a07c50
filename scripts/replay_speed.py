"""Replay against live on this machine: record the bundled model's routing once, then time every strategy live
and replayed (same cells, same answers), and sl.plan live vs on the trace. Writes a markdown table to stdout.

    python scripts/replay_speed.py [--prompts 4] [--tokens 48] [--geometry FILE.npz]

``--geometry`` also times replays of another trace (e.g. one recorded from a DeepSeek-V2-Lite-shaped random
model) for the replayed-tokens-per-second goal.
"""

from __future__ import annotations

import argparse
import time

import torch

import specter_lab as sl
from specter_lab.studies.speed import best_seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--geometry", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = sl.load_model("tiny")
    prompts = sl.heldout_prompts(a.prompts)
    t0 = time.perf_counter()
    trace = sl.record(model, tok, prompts, max_new_tokens=a.tokens, k_max=16, progress=False)
    print(f"record: {time.perf_counter() - t0:.1f} s for {trace.tokens} tokens (k_max=16)\n")
    kw = dict(expert_budget=0.35, hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite@full")
    print("| strategy | live s | replay s | replay × faster | replayed tokens/s | same TPOT |")
    print("|---|---|---|---|---|---|")
    for s in [s for s in sl.STRATEGIES if s != "auto"]:
        # both at trace="steps", what a sweep runs (the metrics are the same at every trace level)
        eng = sl.Engine(model, tok, s, trace="steps", **kw)
        t0 = time.perf_counter()
        live = [eng.generate(p, max_new_tokens=a.tokens) for p in prompts]
        t_live = time.perf_counter() - t0
        sl.replay(trace, s, tokenizer=tok, trace_level="steps", **kw)  # warm: the skeleton, op counts
        t_rep = _best(lambda: sl.replay(trace, s, tokenizer=tok, trace_level="steps", **kw))
        rep = sl.replay(trace, s, tokenizer=tok, trace_level="steps", **kw)
        same = all(x.metrics["tpot_ms"] == y.metrics["tpot_ms"] for x, y in zip(live, rep))
        print(f"| {s} | {t_live:.2f} | {t_rep:.3f} | {t_live / t_rep:.0f}× | {trace.tokens / t_rep:,.0f} | {same} |")
    t0 = time.perf_counter()
    p_live = sl.plan(model, tok, progress=False, **kw)
    t_plan_live = time.perf_counter() - t0
    t0 = time.perf_counter()
    p_trace = sl.plan(None, tok, trace=trace, progress=False, **kw)
    t_plan_trace = time.perf_counter() - t0
    print(f"\nplan, budget 0.35, rtx4090-pcie4, deepseek-v2-lite@full: live (calibration prompts) "
          f"{t_plan_live:.1f} s → {p_live.label}; on the trace {t_plan_trace:.1f} s → {p_trace.label}")
    if a.geometry:
        g = sl.load_trace(a.geometry)
        print(f"\n{g!r}\n\n| strategy | replayed tokens/s |\n|---|---|")
        for s in [s for s in sl.STRATEGIES if s != "auto"]:
            sl.replay(g, s, trace_level="steps", **kw)
            print(f"| {s} | {g.tokens / _best(lambda: sl.replay(g, s, trace_level='steps', **kw)):,.0f} |")


def _best(fn) -> float:
    """The fastest of 3 wall-clock timings (seconds): live and replayed runs are compared as a user waits."""
    return best_seconds(fn, 3, clock=time.perf_counter)


if __name__ == "__main__":
    main()
