"""Closer to the bound (issue 36): the mechanisms of the field, a draft that fits small budgets, and where the
Specter family wins, measured by replay on routing as local as DeepSeek-V2-Lite's and Mixtral's.

Records the bundled model's greedy routing (4 held-out prompts × 256 tokens for evaluation, as long as the
issue's own sequences; the planner's 2 calibration prompts × 128 tokens apart), lowers its locality with
``sl.less_local`` to the published per-layer LRU hit at half the experts cached (DeepSeek-V2-Lite-Chat 0.72,
Mixtral-8x7B 0.61) and imports it with a *modelled* draft (``sl.import_routing``: the bundled draft's measured
recall and acceptance for its bits) and modelled gate-lookahead predictions (``gate_recall=``: the bundled model's
measured predictor, and what-ifs in their own table). Every cell is replayed at DeepSeek-V2-Lite's sizes (``deepseek-v2-lite@full``)
on the simulated clock. Prints the markdown of ``docs/measured/closer_to_bound.md``.

    nice python scripts/closer_to_bound.py --out docs/measured/closer_to_bound.md --results /tmp/ctb-cells
    nice python scripts/closer_to_bound.py --save-traces /tmp/ctb   # also writes the evaluation traces

``--out`` writes the page whole when the run ends (a run stopped midway leaves the page it had; a shell's
``> page.md`` would have emptied it first). ``--results DIR`` keeps the main table's cells (every ``sl.compare``
sweep, one results file each) as they finish: a rerun after a kill computes only the cells it lacks.

A saved trace replays any cell from the command line, e.g.
``specter-lab bench --trace /tmp/ctb/deepseek-v2-lite-local-int2.npz --budgets 0.25 --hardware rtx4090-pcie4
--execution compiled --cost-shape deepseek-v2-lite@full --strategies host_lru,split_lru,split_lfu``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

import specter_lab as sl
from specter_lab.atomic import write_atomic
from specter_lab.offload.schedule import host_lane_time
from specter_lab.pricing.profiles import get_profile
from specter_lab.analysis.bound import trace_bound
from specter_lab.analysis.gap import cell_gaps
from specter_lab.analysis.replay import replay_setup
from specter_lab.traces.importing import MEASURED_DRAFT, MEASURED_GATE_RECALL, MEASURED_GATE_RECALL_PER_LAYER
from specter_lab.traces.locality import TARGET_HIT_AT_HALF, lru_hit_curve
from specter_lab.studies.planner import default_candidates
from specter_lab.studies.prompts import calibration_prompts

SHAPE = "deepseek-v2-lite@full"
HW = ["rtx4090-pcie4@eager", "rtx4090-pcie4@compiled", "a100-40g-pcie4@compiled"]
BUDGETS = (0.25, 0.5)
# the draft each budget holds: int4-g64 is 4.5 bits a weight (0.28 of bf16: more than a quarter), int2-g64 2.5
BITS = {0.25: 2, 0.5: 4}
PLAIN = ["lru", "global_lru", "gate_lookahead", "fiddler", "host_lru", "static_split", "lfu_decay", "host_lfu",
         "split_lru", "split_lfu", "split_arc", "pregate_split"]
# gate-lookahead recall: the bundled model's own predictor (the tables), then what-ifs: FATE's reported next-layer
# accuracy (arXiv 2502.12224, 78.8 %, as quoted in shared/research/routing_locality.md) and a perfect forecast
GATE_WHAT_IF = (0.788, 1.0)
# evaluation decode length (the issue's), the previous run's (the fairness check), the planner's calibration length
# (long enough that a cache's warm-up from the prompt does not decide the pick: the fairness check's finding)
TOKENS, SHORT, CAL_TOKENS = 256, 48, 128
SPEC = ["specter", "specter_plus", "specter_host", "specter_split"]
ROUTINGS = {"DeepSeek-V2-Lite-local": "deepseek-v2-lite-chat", "Mixtral-local": "mixtral-8x7b"}
ABLATIONS = [  # (mechanism, from, to)
    ("decayed-LFU eviction, misses copied", "lru", "lfu_decay"),
    ("decayed-LFU eviction, misses by reuse (host_lru)", "host_lru", "host_lfu"),
    ("split by lane instead of by reuse alone", "host_lru", "split_lru"),
    ("split by lane + decayed LFU", "host_lru", "split_lfu"),
    ("split by lane + ARC (adaptive replacement) instead of LRU", "split_lru", "split_arc"),
    ("pre-gated prefetch placed by the split (split_lfu → pregate_split without refresh)", "split_lfu",
     "pregate_split-refresh"),
    ("refresh: each layer's most used missing expert copied on an idle link (pregate_split without → with)",
     "pregate_split-refresh", "pregate_split"),
    ("the same refresh in split_lfu", "split_lfu", "split_lfu+refresh"),
    ("one pool over every layer (global, decayed LFU across layers) instead of per-layer slots (pregate_split "
     "without refresh, which needs a layer's own slots)", "pregate_split-refresh", "pregate_split global"),
    ("speculation: window copies by link budget + split (specter_host → specter_split)", "specter_host",
     "specter_split"),
    ("prefetch ranked by stall saved, cancelled at verification (specter_split)", "specter_split",
     "specter_split+stall"),
    ("the same in specter_host (instead of the paper's adaptive chunks)", "specter_host", "specter_host+stall"),
    ("specter_split: K=2 instead of the K governor", "specter_split", "specter_split k=2"),
    ("specter_split: evict by the draft's forecast next use (Belady on the forecast) instead of decayed LFU",
     "specter_split", "specter_split+forecast"),
]


# the bundled predictor's recall, per layer pair as it was measured (one mean flatters it: "faithful" below)
MEASURED = MEASURED_GATE_RECALL_PER_LAYER


def recall_label(r) -> str:
    return "/".join(f"{x:g}" for x in r) if isinstance(r, tuple) else f"{r:g}"


def imported(recorded, target: float, ne, bits: int, gate_recall=MEASURED, **draft) -> sl.RoutingTrace:
    routing, segs = recorded.target_rows()
    ll = sl.less_local(routing, target, num_experts=ne)
    return sl.import_routing(ll.routing, recorded.config, segs, draft_bits=bits, gate_recall=gate_recall, **draft)


def candidates(bits: int) -> list:
    """The planner's default candidates a trace with a modelled int``bits`` draft can replay."""
    return [c for c in default_candidates(32) if not c[0].startswith("spec") or f" int{bits} " in c[0]]


def fmt(x: float) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save-traces", default=None, help="a folder to write the evaluation traces to (.npz)")
    ap.add_argument("--out", default=None, help="write the page here, whole, when the run ends (default: print it)")
    ap.add_argument("--results", default=None, help="a folder for the main table's results files (JSON Lines): a "
                    "rerun after a kill computes only the cells they lack")
    a = ap.parse_args()
    if a.results:
        Path(a.results).mkdir(parents=True, exist_ok=True)
    if a.out:
        page = io.StringIO()
        with contextlib.redirect_stdout(page):
            run(a)
        write_atomic(a.out, page.getvalue())
        print(f"written to {a.out}")
    else:
        run(a)


def run(a) -> None:
    """The page, printed."""
    os.nice(5)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, tok = sl.load_model("tiny")
    ne = [l.num_experts for l in sl.inspect_model(model).layers]
    ev = sl.record(model, tok, sl.heldout_prompts(4), max_new_tokens=TOKENS, k_max=0, progress=False)
    cal = sl.record(model, tok, calibration_prompts(tok, 2), max_new_tokens=CAL_TOKENS, k_max=0, progress=False)
    traces, calib = {}, {}
    print("# Closer to the bound (issue 36)\n")
    print("`nice python scripts/closer_to_bound.py > docs/measured/closer_to_bound.md` (this file; the run's time "
          "is at the end). Simulated clock, DeepSeek-V2-Lite at full depth (`deepseek-v2-lite@full`), replayed "
          "routing; every figure below is modelled, not measured on a GPU.\n")
    print(f"**Routing.** The bundled model's greedy routing (4 held-out prompts × {TOKENS} tokens; the planner "
          f"calibrates on 2 other prompts × {CAL_TOKENS} tokens), made less local with `sl.less_local` to the "
          "published per-layer LRU hit at half the experts cached, imported with a modelled draft "
          "(`sl.import_routing`: measured recall and acceptance of the bundled model's RTN draft at that width) "
          "and modelled gate-lookahead predictions for `gate_lookahead` and `pregate_split` (`gate_recall=`"
          f"{list(MEASURED)}: the share of the next layer's experts the bundled model's own predictor names while "
          f"decoding, per layer pair, {MEASURED_GATE_RECALL} in all; other recalls in \"Pre-gating\" below):\n")
    for label, key in ROUTINGS.items():
        for bits in set(BITS.values()):
            traces[label, bits] = imported(ev, TARGET_HIT_AT_HALF[key], ne, bits)
            calib[label, bits] = imported(cal, TARGET_HIT_AT_HALF[key], ne, bits)
        if a.save_traces:
            Path(a.save_traces).mkdir(parents=True, exist_ok=True)
            for bits in set(BITS.values()):
                traces[label, bits].save(Path(a.save_traces) / f"{label.lower()}-int{bits}.npz")
        r, _ = traces[label, 4].target_rows()
        c = lru_hit_curve(r, (0.25, 0.5), num_experts=ne)
        print(f"- {label} (target {TARGET_HIT_AT_HALF[key]}): per-layer LRU hit at 25 % / 50 % cached "
              f"{c[0.25]:.3f} / {c[0.5]:.3f}")
    print("\nDraft per budget: int4-g64 (4.5 bits a weight, 0.28 of the experts' bf16 bytes) does not fit at 0.25, "
          "so the 0.25 cells run every speculative row with int2-g64 (2.5 bits, 0.16; modelled acceptance "
          f"{MEASURED_DRAFT[2].acceptance}); the 0.5 cells with int4-g64 (acceptance "
          f"{MEASURED_DRAFT[4].acceptance}).\n")

    # ----------------------------------------------------------------------------------- the main table
    means, picks = {}, {}
    for label in ROUTINGS:
        for b in BUDGETS:
            bits = BITS[b]
            cells = Path(a.results) / f"{label.lower()}-{b}.jsonl" if a.results else None
            df = sl.compare(None, None, PLAIN + SPEC, expert_budget=b, hardware=HW, cost_shape=SHAPE,
                            trace=traces[label, bits], draft=sl.QuantSpec(bits, 64), progress=False, results=cells)
            m = df.groupby(["hardware", "strategy"])[["tpot_ms", "bound_tpot_ms"]].mean()
            for h in HW:
                means[label, h, b] = m.loc[h].copy()
                # variants replayed beside the rows: the stall-ranked prefetch (a chunking value, not a row) in
                # two rows, and specter_split at a fixed K=2 against its governor
                variants = {f"{row}+stall": (sl.STRATEGIES[row].with_options(chunking="stall"), {})
                            for row in ("specter_split", "specter_host")}
                variants["specter_split k=2"] = ("specter_split", {"k": 2})
                variants["pregate_split-refresh"] = (sl.STRATEGIES["pregate_split"].with_options(refresh=False), {})
                variants["split_lfu+refresh"] = (sl.STRATEGIES["split_lfu"].with_options(refresh=True), {})
                variants["pregate_split global"] = (sl.STRATEGIES["pregate_split"].with_options(
                    refresh=False, pool="global"), {})
                variants["specter_split+forecast"] = (sl.STRATEGIES["specter_split"].with_options(
                    eviction="forecast"), {})
                for name, (st, opts) in variants.items():
                    runs = sl.replay(traces[label, bits], st, expert_budget=b, hardware=h, cost_shape=SHAPE,
                                     draft=sl.QuantSpec(bits, 64), **opts)
                    means[label, h, b].loc[name] = (np.mean([r.metrics["tpot_ms"] for r in runs]),
                                                    m.loc[h].bound_tpot_ms.mean())
                p = sl.plan(None, None, h, b, cost_shape=SHAPE, trace=calib[label, bits],
                            candidates=candidates(bits), progress=False, executor=None)
                runs = sl.replay(traces[label, bits], p.strategy, expert_budget=b, hardware=h, cost_shape=SHAPE,
                                 **p.options)
                picks[label, h, b] = (p.label, float(np.mean([r.metrics["tpot_ms"] for r in runs])))
    print("## The table of the issue, now\n")
    print("× of the bound = bound TPOT / TPOT (1.0 is the clairvoyant autoregressive schedule; a speculative row "
          "may exceed it). `auto` = the planner's pick, planned on the calibration routing and replayed on the "
          "evaluation routing.\n")
    print("| routing | profile · budget | bound ms | `auto` (pick) ms | its × | best row | `lru` × | "
          "`host_lru` × | "
          "`split_lfu` × | `specter` × | best Specter-family row × |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for label in ROUTINGS:
        for h in HW:
            for b in BUDGETS:
                m = means[label, h, b]
                bound = float(m.bound_tpot_ms.mean())
                x = bound / m.tpot_ms
                best = m.tpot_ms.idxmin()
                fam = x[[s for s in x.index if s.startswith("specter")]].dropna()
                fam_best = fam.idxmax() if len(fam) else None
                pick, pick_ms = picks[label, h, b]
                rows.append(dict(routing=label, hw=h, budget=b, bound=bound, x=x, pick=pick, pick_ms=pick_ms,
                                 fam_best=fam_best, best=best, m=m))
                print(f"| {label} | {h} · {b} | {bound:.1f} | {pick} {pick_ms:.1f} | {bound / pick_ms:.2f} | "
                      f"{best} {x[best]:.2f} | {fmt(x.get('lru'))} | {fmt(x.get('host_lru'))} | "
                      f"{fmt(x.get('split_lfu'))} | {fmt(x.get('specter'))} | "
                      f"{fam_best} {fmt(x.get(fam_best)) if fam_best else '—'} |")

    # ----------------------------------------------------------------------------------- ablation
    print("\n## Ablation: which mechanism moved which cell (Δ × of the bound)\n")
    print("| routing | profile · budget | " + " | ".join(a[0] for a in ABLATIONS) + " |")
    print("|---|---|" + "---|" * len(ABLATIONS))
    for r in rows:
        cells = [f"{r['x'][b_] - r['x'][a_]:+.3f}" for _, a_, b_ in ABLATIONS]
        print(f"| {r['routing']} | {r['hw']} · {r['budget']} | " + " | ".join(cells) + " |")

    # ----------------------------------------------------------------------------------- what the bound still has
    print("\n## Where the rest goes (compiled cells: the bound against `split_lfu`)\n")
    print("Per decode token. The bound's device time is its dense work and experts; exposed = the device waiting "
          "for a copy or a host result. Hit rate: decode lookups served from the device.\n")
    print("| routing | profile · budget | bound: device / exposed copy / exposed host ms, misses per token | "
          "`split_lfu`: TPOT, stall ms, host experts per token, hit rate |")
    print("|---|---|---|---|")
    for label in ROUTINGS:
        for h in HW[1:]:
            for b in BUDGETS:
                kw = dict(expert_budget=b, hardware=h, cost_shape=SHAPE)
                bs = trace_bound(traces[label, BITS[b]], **kw)
                rs = sl.replay(traces[label, BITS[b]], "split_lfu", **kw)
                mb = lambda f: np.mean([getattr(x, f) for x in bs])  # noqa: E731
                mr = lambda f: np.mean([x.metrics[f] for x in rs])  # noqa: E731
                print(f"| {label} | {h} · {b} | {mb('compute_ms'):.1f} / {mb('copy_ms'):.1f} / {mb('host_ms'):.1f}, "
                      f"{np.mean([x.misses / x.tokens for x in bs]):.1f} | {mr('tpot_ms'):.1f}, "
                      f"{mr('stall_ms_per_token'):.1f}, {mr('host_experts_per_token'):.1f}, {mr('hit_rate'):.2f} |")

    fairness_and_gap(traces)
    foresight(traces)
    faithful(ev)
    pregating(ev, cal, ne)

    # ----------------------------------------------------------------------------------- Specter's best cell
    best_cell = max(rows, key=lambda r: r["m"].tpot_ms[PLAIN].min() / r["m"].tpot_ms[r["fam_best"]])
    plain_best = best_cell["m"].tpot_ms[PLAIN].idxmin()
    fb = best_cell["fam_best"]
    print("\n## The Specter family's best cell\n")
    print(f"{best_cell['routing']}, {best_cell['hw']}, budget {best_cell['budget']}: `{fb}` "
          f"{best_cell['m'].tpot_ms[fb]:.1f} ms ({best_cell['x'][fb]:.2f} of the bound) against the best "
          f"non-speculative row `{plain_best}` {best_cell['m'].tpot_ms[plain_best]:.1f} ms; the planner picked "
          f"**{best_cell['pick']}** ({best_cell['pick_ms']:.1f} ms on the evaluation routing).")

    # ----------------------------------------------------------------------------------- regimes
    locality_and_link(ev, ne)
    regime_table(ev, ne)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


# --------------------------------------------------------------------------------------------- fairness, the gap
# Two analyses of the bound (the bound itself is trace_bound's default): its schedule re-run with the initial pool
# an online run could have (initial="prompt": the prompt's most used experts), and with an online eviction policy
# in place of Belady's (evict="lfu_decay" / "lru"; the rest of its schedule, copies started as early as the link
# allows, kept): analysis/bound.py's analysis variants.

def prefix(trace: sl.RoutingTrace, n: int) -> sl.RoutingTrace:
    """The trace cut to the first ``n`` decode forwards of every sequence: the same routing, a shorter run."""
    def cut(s):
        p = len(s.prompt)
        return dataclasses.replace(
            s, tokens=s.tokens[: n + 1], decode=s.decode[:n], gate=None if s.gate is None else s.gate[: p + n],
            **{f: getattr(s, f)[:n] for f in ("draft_tokens", "draft_routing", "verify_routing", "verify_tokens")
               if getattr(s, f) is not None})
    return dataclasses.replace(trace, sequences=[cut(s) for s in trace.sequences])


def _mean_tpot(runs) -> float:
    return float(np.mean([r.tpot_ms if hasattr(r, "tpot_ms") else r.metrics["tpot_ms"] for r in runs]))


def fairness_and_gap(traces) -> None:
    cells = [(label, h, b) for label in ROUTINGS for h in HW[1:] for b in BUDGETS]
    print("\n## Is the comparison fair? (compiled cells, `split_lfu` against the bound)\n")
    print("Both are priced by the same cost model (`replay_setup`: the same dense, expert, copy and host prices), "
          "on the same decode routing, at the same slots (the bound's pool is `budget_bytes // expert_bytes`, "
          "what the rows' per-layer slots add up to), and both TPOTs are the decode forwards' time over N − 1 (a "
          "row's from its prefill token's commit; at budget 1.0 they agree exactly: `tests/test_bound.py`). Two "
          f"things differ. The bound starts with a full pool chosen knowing the future; a row starts from what its "
          f"prefill left. And the previous run's sequences were {SHORT} tokens long, where an online cache's "
          "move from the prompt's experts to the decode's is a large share of the run.\n")
    print(f"| routing | profile · budget | {SHORT} tokens: bound ms, `split_lfu` × | {TOKENS} tokens: bound ms, "
          "`split_lfu` × | the bound starting from the prompt's experts instead: ms, `split_lfu` × |")
    print("|---|---|---|---|---|")
    for label, h, b in cells:
        kw = dict(expert_budget=b, hardware=h, cost_shape=SHAPE)
        tr = traces[label, BITS[b]]
        short = prefix(tr, SHORT - 1)
        row = []
        for t in (short, tr):
            bd, r = _mean_tpot(trace_bound(t, **kw)), _mean_tpot(sl.replay(t, "split_lfu", **kw))
            row.append(f"{bd:.2f}, {bd / r:.3f}")
        bp = _mean_tpot(trace_bound(tr, initial="prompt", **kw))
        print(f"| {label} | {h} · {b} | {row[0]} | {row[1]} | {bp:.2f}, {bp / r:.3f} |")

    print("\n## What the bound's lead is made of (compiled cells)\n")
    print("The bound's own schedule re-run with an online eviction policy instead of Belady's, everything else "
          "kept (copies started as early as the link and the slot allow, the greedy copy-or-host, the initial "
          "fill): × of the bound. The step from there down to `split_lfu` is what knowing *which* expert comes "
          "next, *before* the router asks, is worth; the step from 1.0 down to it is Belady's eviction. The timing "
          "part, split by how far ahead that schedule may start its copies (`sl.bound_gap`'s shares): *across "
          "tokens* (copies started in earlier tokens; only a draft reaches), *within the token* (before the router "
          "asks, in the same token: a pre-gating predictor's reach), *initial set* (the prompt's experts instead "
          "of a set chosen knowing the sequence), *rest* (that fully online schedule against `split_lfu`).\n")
    print("| routing | profile · budget | bound ms | its schedule, decayed-LFU eviction × | LRU eviction × | "
          "`split_lfu` × | of the gap to `split_lfu`: eviction / timing (across tokens + within the token + "
          "initial set + rest) |")
    print("|---|---|---|---|---|---|---|")
    need = []
    for label, h, b in cells:
        kw = dict(expert_budget=b, hardware=h, cost_shape=SHAPE)
        tr = traces[label, BITS[b]]
        bs = trace_bound(tr, **kw)
        bd = _mean_tpot(bs)
        rs = sl.replay(tr, "split_lfu", **kw)
        r = _mean_tpot(rs)
        # sl.bound_gap's split of split_lfu's distance (its decayed-LFU variant), and the LRU variant beside it
        (g,) = cell_gaps(tr, {"split_lfu": (r, float(np.mean([x.metrics["hit_rate"] for x in rs])))}, **kw)
        lru = _mean_tpot(trace_bound(tr, evict="lru", **kw))
        print(f"| {label} | {h} · {b} | {bd:.2f} | {bd / g.online_ms:.3f} | {bd / lru:.3f} | {g.x_of_bound:.3f} | "
              f"{g.eviction_share:.0%} / {g.schedule_share:.0%} ({g.across_tokens_share:.0%} + "
              f"{g.within_token_share:.0%} + {g.initial_set_share:.0%} + {g.rest_share:.0%}) |")
        need.append((label, h, b, kw, tr, bs, bd, rs, r))

    print("\n## What would have to be true for an online schedule to reach 0.75 (compiled cells)\n")
    print("Per decode token, on the cost model. *Allowance*: the stall a row may have at 0.75 of the bound, the "
          "target TPOT less `split_lfu`'s time without stalls. *Misses allowed*: the allowance over `split_lfu`'s "
          "stall per miss today (a linear reading: each miss cut saves today's average). Belady's hit rate is the "
          "bound's (its misses per lookup). A copy hides only if it starts *copy ÷ layer* layers before its layer "
          "(the expert's copy time against one layer's device time: dense part + top-k experts).\n")
    print("| routing | profile · budget | target ms | `split_lfu` ms, stall ms | allowance ms | misses/token now → "
          "allowed | hit rate now → needed (Belady's) | copy ÷ layer |")
    print("|---|---|---|---|---|---|---|---|")
    for label, h, b, kw, tr, bs, bd, rs, r in need:
        setup, info = replay_setup(tr, "lru", check=False, **kw)
        c = setup.cost
        lookups = sum(l.top_k for l in info.layers)
        stall = float(np.mean([x.metrics["stall_ms_per_token"] for x in rs]))
        hit = float(np.mean([x.metrics["hit_rate"] for x in rs]))
        misses = lookups * (1 - hit)
        target = bd / 0.75
        allowance = target - (r - stall)
        allowed = max(0.0, allowance / (stall / misses))
        belady = 1 - np.mean([x.misses / x.tokens for x in bs]) / lookups
        p = len(tr.sequences[0].prompt)
        layer = c.dense_layer_time(1, p) + info.layers[0].top_k * c.expert_time(1)
        print(f"| {label} | {h} · {b} | {target:.2f} | {r:.2f}, {stall:.2f} | {allowance:.2f} | {misses:.1f} → "
              f"{allowed:.1f} | {hit:.2f} → {1 - allowed / lookups:.2f} ({belady:.2f}) | "
              f"{c.copy_time(c.expert_bytes) * 1e3:.2f} ÷ {layer * 1e3:.2f} = "
              f"{c.copy_time(c.expert_bytes) / layer:.1f} (host {host_lane_time(c, 1) * 1e3:.2f} ms) |")


LEADS = (0, 1, 2, math.inf)  # run layers of foresight (inf: anywhere in the token)


def foresight(traces) -> None:
    """What a perfect pre-gating forecast N layers ahead is worth to an online schedule (the bound's lead=)."""
    print("\n## What foresight is worth (compiled cells)\n")
    print("The bound's schedule made online: decayed-LFU eviction, starting from the prompt's experts, each copy "
          "started at most N of the run's 4 layers before its router asks and never before its token's forward "
          "began (`trace_bound(..., evict=\"lfu_decay\", initial=\"prompt\", lead=N)`): what a perfect pre-gating "
          "predictor N layers deep would give (N = 0: none; ∞: anywhere in the token). A run layer's copies and work "
          "are both priced 6.5 real layers', so N run layers hide what N of DeepSeek-V2-Lite's would; but a run "
          "token has 4 layers, not 26, so its first layer never has a forecast here. Then Belady's eviction with "
          "the same whole-token foresight: the rest of the distance to 1.0 is foresight across tokens. "
          "× of the bound.\n")
    print("| routing | profile · budget | `split_lfu` | "
          + " | ".join(f"online, lead {'∞' if math.isinf(n) else n}" for n in LEADS)
          + " | Belady, lead ∞ |")
    print("|---|---|---|" + "---|" * (len(LEADS) + 1))
    for label in ROUTINGS:
        for h in HW[1:]:
            for b in BUDGETS:
                kw = dict(expert_budget=b, hardware=h, cost_shape=SHAPE)
                tr = traces[label, BITS[b]]
                bd = _mean_tpot(trace_bound(tr, **kw))
                cells = [bd / _mean_tpot(sl.replay(tr, "split_lfu", **kw))]
                cells += [bd / _mean_tpot(trace_bound(tr, evict="lfu_decay", initial="prompt", lead=n, **kw))
                          for n in LEADS]
                cells.append(bd / _mean_tpot(trace_bound(tr, lead=LEADS[-1], **kw)))
                print(f"| {label} | {h} · {b} | " + " | ".join(f"{x:.3f}" for x in cells) + " |")


def faithful(ev) -> None:
    """The modelled forecast against the recorded one, on the bundled model's own routing (where both exist)."""
    print("\n## Is the modelled forecast faithful? (the bundled model's own routing)\n")
    per = tuple(round(float(x), 3) for x in sl.gate_recall(ev, per_layer=True))  # MEASURED, from this recording
    mean = round(sl.gate_recall(ev), 3)
    print("The evaluation prompts' routing as the bundled model routed it (not made less local), replayed with "
          "`pregate_split` using the gate predictions `sl.record` recorded (layer l+1's router on layer l's state), "
          f"then imported with modelled ones at the recall those have: per layer pair ({recall_label(per)}), at "
          f"their mean ({mean:g}) for every pair, and perfect (1.0). × of the bound.\n")
    cols = {"recorded": None, f"modelled, {recall_label(per)}": per, f"modelled, {mean:g} everywhere": mean,
            "modelled, 1.0": 1.0}
    print("| profile · budget | `split_lfu` | " + " | ".join(f"`pregate_split`, {c}" for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    routing, segs = ev.target_rows()
    traces = {c: ev if r is None else sl.import_routing(routing, ev.config, segs, k_max=0, gate_recall=r)
              for c, r in cols.items()}
    for h in HW:
        for b in BUDGETS:
            kw = dict(expert_budget=b, hardware=h, cost_shape=SHAPE)
            bd = _mean_tpot(trace_bound(ev, **kw))
            cells = [bd / _mean_tpot(sl.replay(ev, "split_lfu", **kw))]
            cells += [bd / _mean_tpot(sl.replay(t, "pregate_split", **kw)) for t in traces.values()]
            print(f"| {h} · {b} | " + " | ".join(f"{x:.3f}" for x in cells) + " |")


def pregating(ev, cal, ne) -> None:
    """pregate_split, and the planner's pick, at the bundled predictor's recall and at the what-ifs."""
    recalls = (MEASURED, *GATE_WHAT_IF)
    print("\n## Pre-gating: what the predictor's recall is worth (compiled cells)\n")
    print("`pregate_split` (split_lfu with pre-gated prefetch placed by the split) and `auto` (planned on the "
          "calibration routing imported with the same recall, replayed on the evaluation routing) at the gate "
          f"recall of the bundled model's own predictor ({recall_label(MEASURED)} per layer pair), at FATE's "
          "reported next-layer accuracy (0.788, arXiv 2502.12224, a what-if) and with a perfect forecast (1.0, a "
          "what-if); `split_lfu` for reference. × of the bound.\n")
    print("| routing | profile · budget | `split_lfu` | "
          + " | ".join(f"`pregate_split` at {recall_label(r)}" for r in recalls)
          + " | " + " | ".join(f"`auto` at {r:g} (pick)" for r in GATE_WHAT_IF) + " |")
    print("|---|---|---|" + "---|" * (len(recalls) + len(GATE_WHAT_IF)))
    for label, key in ROUTINGS.items():
        target = TARGET_HIT_AT_HALF[key]
        for h in HW[1:]:
            for b in BUDGETS:
                bits = BITS[b]
                kw = dict(expert_budget=b, hardware=h, cost_shape=SHAPE)
                cells, picks = [], []
                for r in recalls:
                    tr = imported(ev, target, ne, bits, gate_recall=r)
                    bd = _mean_tpot(trace_bound(tr, **kw))
                    if r == recalls[0]:
                        cells.append(f"{bd / _mean_tpot(sl.replay(tr, 'split_lfu', **kw)):.3f}")
                    cells.append(f"{bd / _mean_tpot(sl.replay(tr, 'pregate_split', **kw)):.3f}")
                    if r in GATE_WHAT_IF:
                        p = sl.plan(None, None, h, b, cost_shape=SHAPE, trace=imported(cal, target, ne, bits,
                                                                                         gate_recall=r),
                                    candidates=candidates(bits), progress=False, executor=None)
                        ms = _mean_tpot(sl.replay(tr, p.strategy, **kw, **p.options))
                        picks.append(f"{bd / ms:.3f} ({p.label})")
                print(f"| {label} | {h} · {b} | " + " | ".join(cells + picks) + " |")


def locality_and_link(ev, ne) -> None:
    """The compiled cells' best non-speculative row against the bound, on routing more local than the targets
    (the bundled model's own) and on faster links: is the 0.75 bar out of reach because of the routing or the
    machine?"""
    routings = {"the bundled model's own (no replacement)": None,
                **{f"{label} (target {TARGET_HIT_AT_HALF[key]})": TARGET_HIT_AT_HALF[key]
                   for label, key in ROUTINGS.items()}}
    links = (1, 2, 4)
    rows = ["lfu_decay", "host_lru", "host_lfu", "split_lru", "split_lfu"]
    print("\n## Is it the routing or the machine? (compiled cells, the best non-speculative row)\n")
    print("The same evaluation prompts, routing made less local to each target or left as the bundled model "
          "routed it (per-layer LRU hit at 50 % cached: 0.89), the link's bandwidth ×1 (PCIe 4), ×2 (PCIe 5) and "
          "×4, everything else the profile's; each cell the best of "
          + ", ".join(f"`{r}`" for r in rows) + " against the bound at the same link: × of the bound.\n")
    print("| routing | profile · budget | " + " | ".join(f"link ×{m}" for m in links) + " |")
    print("|---|---|" + "---|" * len(links))
    routing, segs = ev.target_rows()
    for name, target in routings.items():
        derived = routing if target is None else sl.less_local(routing, target, num_experts=ne).routing
        for h in HW[1:]:
            base = get_profile(h)
            for b in BUDGETS:
                tr = sl.import_routing(derived, ev.config, segs, draft_bits=BITS[b])
                cells = []
                for m in links:
                    prof = dataclasses.replace(base, name=f"{h}, link ×{m}", pcie_bandwidth=base.pcie_bandwidth * m)
                    kw = dict(expert_budget=b, hardware=prof, cost_shape=SHAPE)
                    bound = _mean_tpot(trace_bound(tr, **kw))
                    t = {r: _mean_tpot(sl.replay(tr, r, **kw)) for r in rows}
                    best = min(t, key=t.get)
                    cells.append(f"{best} {bound / t[best]:.2f}")
                print(f"| {name} | {h} · {b} | " + " | ".join(cells) + " |")


def regime_table(ev, ne) -> None:
    """Where the Specter family is picked: cost shape × budget × host × link × draft, rtx4090 compiled."""
    base = get_profile("rtx4090-pcie4@compiled")
    hosts = {"host ×1": base,
             "host ×¼": dataclasses.replace(base, name="rtx4090 compiled, host /4",
                                           cpu_mem_bandwidth=base.cpu_mem_bandwidth / 4,
                                           cpu_flops=base.cpu_flops / 4)}
    drafts = {2: {"measured": {}, "as good as int4": dict(acceptance=0.945, recall=0.983)},
              4: {"measured": {}, "near-exact (acc. 0.99)": dict(acceptance=0.99, recall=1.0)}}
    target = TARGET_HIT_AT_HALF["deepseek-v2-lite-chat"]
    plain = ["lru", "fiddler", "host_lru", "static_split", "split_lru", "split_lfu"]
    spec = ["specter", "specter_host", "specter_split"]
    KS = {"specter_split": (2, 4, 8, "auto")}  # K: fixed lengths against the governor
    print("\n## Regimes: where the Specter family is the pick (item 2)\n")
    print("DeepSeek-V2-Lite-local routing, rtx4090-pcie4 compiled (25 GB/s link, 60 GB/s / 1 TFLOP/s host), "
          "varied one knob at a time: host bandwidth and FLOP/s ÷4 (a DDR4 desktop), the link ÷2 (PCIe 3), the "
          "draft's modelled acceptance, and the cost shape (Mixtral-8x7B's 350 MB experts); `specter_split` at "
          "K = 2, 4, 8 and the governor (`specter` and `specter_host` at their K = 8). \"Picked\": the best "
          "Specter-family row beats the best non-speculative one by more than the planner's 10 % margin.\n")
    print("| cost shape | budget · draft | host | link | draft acceptance | best plain (ms) | "
          "best Specter family (ms) "
          "| plain / Specter | picked? |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in ("deepseek-v2-lite@full", "mixtral-8x7b@full"):
        for b in BUDGETS:
            bits = BITS[b]
            for dname, dkw in drafts[bits].items():
                tr = imported(ev, target, ne, bits, **dkw)
                for hname, prof in hosts.items():
                    for lname, link in (("×1", prof), ("×½", dataclasses.replace(
                            prof, name=prof.name + ", link /2", pcie_bandwidth=prof.pcie_bandwidth / 2))):
                        if dname != "measured" and (hname != "host ×1" or lname != "×1"):
                            continue  # the draft knob on the base machine only (the run stays short)
                        kw = dict(expert_budget=b, hardware=link, cost_shape=shape)
                        t = {s: float(np.mean([r.metrics["tpot_ms"] for r in sl.replay(tr, s, **kw)]))
                             for s in plain}
                        ts = {f"{s} k={k}": float(np.mean([r.metrics["tpot_ms"] for r in sl.replay(
                            tr, s, draft=sl.QuantSpec(bits, 64), k=k, **kw)]))
                              for s in spec for k in KS.get(s, (sl.STRATEGIES[s].k,))}
                        bp, bs = min(t, key=t.get), min(ts, key=ts.get)
                        ratio = t[bp] / ts[bs]
                        print(f"| {shape} | {b} · int{bits} | {hname} | {lname} | {dname} | {bp} {t[bp]:.1f} | "
                              f"{bs} {ts[bs]:.1f} | {ratio:.2f} | {'**yes**' if ratio > 1 / 0.9 else 'no'} |")


if __name__ == "__main__":
    main()
