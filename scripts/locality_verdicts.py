"""Which 'where it wins' verdicts change when routing is less local (issue #25, item 9).

Records the bundled model's routing (4 held-out prompts × 48 tokens, k_max=16), then makes two less local
versions of its target routing with ``sl.less_local`` (each routed expert replaced with probability q by one the
token does not use, q bisected so the per-layer LRU hit at half the experts cached is DeepSeek-V2-Lite-Chat's
0.72 or Mixtral-8x7B's 0.61) and imports them with ``sl.import_routing`` (modelled int4 draft: the bundled
draft's measured recall and acceptance). The recorded routing is also imported unchanged, so the modelled draft
can be read against the real one. Every strategy is replayed on each, DeepSeek-V2-Lite at full depth, rtx4090,
eager and compiled, budgets 0.5 and 0.35. Prints markdown.

    python scripts/locality_verdicts.py
"""

from __future__ import annotations

import time

import torch

import specter_lab as sl
from specter_lab.traces.locality import TARGET_HIT_AT_HALF, lru_hit_curve


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, tok = sl.load_model("tiny")
    recorded = sl.record(model, tok, sl.heldout_prompts(4), max_new_tokens=48, k_max=16, progress=False)
    routing, segs = recorded.target_rows()
    ne = [l.num_experts for l in sl.inspect_model(model).layers]
    traces = {"recorded (real draft)": recorded,
              "recorded routing, modelled draft": sl.import_routing(routing, recorded.config, segs)}
    for name, target in (("deepseek-v2-lite-chat", TARGET_HIT_AT_HALF["deepseek-v2-lite-chat"]),
                         ("mixtral-8x7b", TARGET_HIT_AT_HALF["mixtral-8x7b"])):
        ll = sl.less_local(routing, target, num_experts=ne)
        print(f"{name}: {ll!r}")
        traces[f"less local like {name} ({target})"] = sl.import_routing(ll.routing, recorded.config, segs)
    print()
    for name, tr in traces.items():
        r, _ = tr.target_rows()
        curve = lru_hit_curve(r, (0.25, 0.5), num_experts=ne)
        print(f"- {name}: per-layer LRU hit at 25 % / 50 % cached {curve[0.25]:.3f} / {curve[0.5]:.3f}")
    hw = ["rtx4090-pcie4@eager", "rtx4090-pcie4@compiled"]
    strategies = [s for s in sl.STRATEGIES if s not in ("auto", "gate_lookahead")]  # gate: not in an import
    print("\n| routing | profile · budget | best baseline (ms) | specter (ms, ×) | specter_plus | specter_host | "
          "host_lru | lru × of bound | auto's plan |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, tr in traces.items():
        df = sl.compare(None, tok, strategies, expert_budget=[0.5, 0.35], hardware=hw,
                        cost_shape="deepseek-v2-lite@full", trace=tr, progress=False)
        mean = df.groupby(["hardware", "expert_budget", "strategy"], sort=False)[["tpot_ms", "x_of_bound"]].mean()
        for (h, b), cell in mean.groupby(level=[0, 1], sort=False):
            t = cell.tpot_ms.droplevel([0, 1])
            base = t[[s for s in sl.bench.BASELINES if s in t and s != "gate_lookahead"]].dropna()
            best = base.idxmin()
            p = sl.plan(None, tok, hardware=h, expert_budget=b, cost_shape="deepseek-v2-lite@full", trace=tr,
                        progress=False)
            print(f"| {name} | {h} · {b} | {best} {base[best]:.1f} | {t['specter']:.1f} ({base[best] / t['specter']:.2f}×)"
                  f" | {t['specter_plus']:.1f} | {t['specter_host']:.1f} | {t['host_lru']:.1f} | "
                  f"{cell.x_of_bound.droplevel([0, 1])['lru']:.2f} | {p.label} |")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
