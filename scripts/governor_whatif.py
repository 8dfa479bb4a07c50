"""The K governor (``k="auto"``) against fixed K (issue 36), simulated.

``specter_split`` and ``specter_plus`` draft with ``k="auto"``: for its first ``measured_after`` windows the governor
prices one more token after every draft step (:class:`specter_lab.predict.KGovernor`); from then on it drafts, per
window, the K with the least measured window time per expected committed token, trying a neighbouring K every
``explore_every``-th window. Each column below replays ``specter_split`` on the evaluation traces of
``scripts/closer_to_bound.py`` at a fixed K, with the governor as shipped, and with the governor's fields changed
(``KGovernor(**fields)`` for the length of the replay, by wrapping ``specter_lab.analysis.replay.KGovernor``):

* ``measured_after=0``: the priced rule alone, the governor before 2026-12-06's second change;
* ``extrapolate=False``: only K measured in a window count, no longer K priced off the line through them;
* ``explore_every=8``: the measured rule trying a neighbour half as often (a what-if: the default stays 4).

Prints a markdown table of × of the bound (the bound's mean TPOT over the row's mean) per cell, and how far the
governor is from the best fixed K of the columns::

    nice python scripts/closer_to_bound.py --save-traces /tmp/ctb   # the traces are written in the first minute
    nice python scripts/governor_whatif.py /tmp/ctb   # ~2 minutes

``--long-k`` instead replays four rows of ``closer_to_bound.py``'s regimes table where K = 16 is best (Mixtral-8x7B's
cost shape, rtx4090 compiled) at K = 2, 4, 8, 16 and with the governor's variants, in ms (~1 minute; it records
the routing itself, so the traces folder is not read).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from pathlib import Path
from typing import Iterator

import numpy as np

import specter_lab as sl
from specter_lab.predict import KGovernor
from specter_lab.analysis import replay as replay_module
from specter_lab.analysis.bound import bound_tpots

SHAPE = "deepseek-v2-lite@full"
ROUTINGS = {"DeepSeek-V2-Lite-local": "deepseek-v2-lite-local", "Mixtral-local": "mixtral-local"}
BUDGETS = {0.25: 2, 0.5: 4}  # budget → the draft bits its trace was imported with (closer_to_bound.py's BITS)
PROFILES = ("rtx4090-pcie4@eager", "rtx4090-pcie4@compiled", "a100-40g-pcie4@compiled")
FIXED_K = (1, 2, 4)
VARIANTS = {  # column → KGovernor fields
    "governor, priced rule only (before)": dict(measured_after=0),
    "governor (now)": {},
    "governor, measured K only (no line)": dict(extrapolate=False),
    "governor, a neighbour every 8th window": dict(explore_every=8),
}


@contextlib.contextmanager
def governor(**fields) -> Iterator[None]:
    """Within the block, a replay's K governor is ``KGovernor(**fields)``."""
    made = replay_module.KGovernor
    replay_module.KGovernor = functools.partial(KGovernor, **fields)
    try:
        yield
    finally:
        replay_module.KGovernor = made


def tpot(runs) -> float:
    return float(np.mean([r.metrics["tpot_ms"] for r in runs]))


def long_k(row: str) -> None:
    """The regimes table's Mixtral-8x7B-shaped rows where K = 16 is best: ms per token, fixed K and the variants."""
    import dataclasses

    import closer_to_bound as cb  # this folder's: the same routing, targets and imports as the regimes table
    from specter_lab.pricing.profiles import get_profile

    model, tok = sl.load_model("tiny")
    ne = [layer.num_experts for layer in sl.inspect_model(model).layers]
    ev = sl.record(model, tok, sl.heldout_prompts(4), max_new_tokens=cb.TOKENS, k_max=0, progress=False)
    target = cb.TARGET_HIT_AT_HALF["deepseek-v2-lite-chat"]
    base = get_profile("rtx4090-pcie4@compiled")
    pcie3 = dataclasses.replace(base, name="rtx4090 compiled, link /2", pcie_bandwidth=base.pcie_bandwidth / 2)
    rows = {"0.25 · int2, as good as int4": (0.25, 2, dict(acceptance=0.945, recall=0.983), base),
            "0.5 · int4, link ×½": (0.5, 4, {}, pcie3), "0.5 · int4": (0.5, 4, {}, base),
            "0.5 · int4, near-exact (acc. 0.99)": (0.5, 4, dict(acceptance=0.99, recall=1.0), base)}
    ks = (2, 4, 8, 16)
    cols = [f"K={k}" for k in ks] + list(VARIANTS)
    print(f"`{row}` on mixtral-8x7b@full, rtx4090-pcie4@compiled, ms per token (simulated clock).\n")
    print("| row | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, (budget, bits, draft, profile) in rows.items():
        trace = cb.imported(ev, target, ne, bits, **draft)
        kw = dict(expert_budget=budget, hardware=profile, cost_shape="mixtral-8x7b@full", draft=sl.QuantSpec(bits, 64))
        cells = [tpot(sl.replay(trace, row, k=k, **kw)) for k in ks]
        for fields in VARIANTS.values():
            with governor(**fields):
                cells.append(tpot(sl.replay(trace, row, **kw)))
        print(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="?", help="the folder closer_to_bound.py --save-traces wrote")
    ap.add_argument("--row", default="specter_split", help="a speculative strategy with k='auto'")
    ap.add_argument("--long-k", action="store_true", help="the regimes rows where K = 16 is best instead")
    a = ap.parse_args()
    t0 = time.perf_counter()
    if a.long_k:
        long_k(a.row)
        print(f"\n({time.perf_counter() - t0:.0f} s)")
        return
    if a.traces is None:
        ap.error("the traces folder is needed (or --long-k)")
    cols = [f"K={k}" for k in FIXED_K] + list(VARIANTS) + ["governor (now) − best fixed K"]
    print(f"`{a.row}`, × of the bound (simulated clock, {SHAPE}, the evaluation traces of closer_to_bound.py).\n")
    print("| routing | profile · budget | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for label, stem in ROUTINGS.items():
        for profile in PROFILES:
            for budget, bits in BUDGETS.items():
                trace = sl.load_trace(Path(a.traces) / f"{stem}-int{bits}.npz")
                kw = dict(expert_budget=budget, hardware=profile, cost_shape=SHAPE, draft=sl.QuantSpec(bits, 64))
                bound = float(np.mean(bound_tpots(trace, expert_budget=budget, hardware=profile, cost_shape=SHAPE)))
                cells = [tpot(sl.replay(trace, a.row, k=k, **kw)) for k in FIXED_K]
                for fields in VARIANTS.values():
                    with governor(**fields):
                        cells.append(tpot(sl.replay(trace, a.row, **kw)))
                x = [bound / c for c in cells]
                gap = x[len(FIXED_K) + list(VARIANTS).index("governor (now)")] - max(x[:len(FIXED_K)])
                print(f"| {label} | {profile} · {budget} | " + " | ".join(f"{v:.3f}" for v in x) + f" | {gap:+.3f} |",
                      flush=True)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
