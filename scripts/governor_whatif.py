"""The K governor (``k="auto"``) against fixed K (issue 36), simulated.

``specter_split`` and ``specter_plus`` draft with ``k="auto"``: for its first ``measured_after`` windows the governor
prices one more token after every draft step (:class:`specter_lab.predict.KGovernor`); from then on it drafts, per
window, the K with the least measured window time per expected committed token, trying a neighbouring K every
``explore_every``-th window. Each column below replays ``specter_split`` on the evaluation traces of
``scripts/closer_to_bound.py`` at a fixed K, with the governor as shipped, and with the governor's fields changed
(``KGovernor(**fields)`` for the length of the replay, by wrapping ``specter_lab.routing.replay.KGovernor``):

* ``measured_after=0``: the priced rule alone, the governor before 2026-12-06's second change;
* ``extrapolate=False``: only K measured in a window count, no longer K priced off the line through them;
* ``explore_every=8``: the measured rule trying a neighbour half as often (a what-if: the default stays 4).

Prints a markdown table of × of the bound (the bound's mean TPOT over the row's mean) per cell, and how far the
governor is from the best fixed K of the columns::

    nice python scripts/closer_to_bound.py --save-traces /tmp/ctb   # the traces are written in the first minute
    nice python scripts/governor_whatif.py /tmp/ctb   # ~2 minutes
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
from specter_lab.routing import replay as replay_module
from specter_lab.routing.bound import bound_tpots

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", help="the folder closer_to_bound.py --save-traces wrote")
    ap.add_argument("--row", default="specter_split", help="a speculative strategy with k='auto'")
    a = ap.parse_args()
    t0 = time.perf_counter()
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
