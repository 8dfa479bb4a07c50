"""What cancelling wrong pre-gated prefetches could be worth at most (issue 36), a what-if on the simulated clock.

Fate and PreScope cancel a prefetch once the router shows it is not needed, so that its copy stops holding the link
(and its slot's expert stays). ``pregate_split`` does not: its wrong prefetches (about half of them at the bundled
predictor's recall) hold the link until they land. Before building cancellation, this measures its ceiling: the
same replay with every pre-gated prediction cut to the experts the next layer really routes to (precision 1, the
same recall), so that a wrong prefetch is never issued at all, which no cancellation can beat. The cut is made by
wrapping the replay's gate predictions (``specter_lab.routing.replay._GateMath``) for the length of this script.

Reads the evaluation traces that ``scripts/closer_to_bound.py --save-traces DIR`` writes; prints a markdown table
of × of the bound (the bound's mean TPOT over the rows' mean, as ``bench`` reads it) per compiled cell::

    nice python scripts/closer_to_bound.py --save-traces /tmp/ctb   # the traces are written in the first minute
    nice python scripts/precise_pregate_whatif.py /tmp/ctb
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Iterator

import numpy as np

import specter_lab as sl
from specter_lab.routing import replay as replay_module
from specter_lab.routing.bound import bound_tpots

SHAPE = "deepseek-v2-lite@full"
ROUTINGS = {"DeepSeek-V2-Lite-local": "deepseek-v2-lite-local", "Mixtral-local": "mixtral-local"}
BUDGETS = {0.25: 2, 0.5: 4}  # budget → the draft bits its trace was imported with (closer_to_bound.py's BITS)
PROFILES = ("rtx4090-pcie4@compiled", "a100-40g-pcie4@compiled")


@contextlib.contextmanager
def precise_gate() -> Iterator[None]:
    """Within the block, a replayed gate prediction names only experts its layer really routes to."""
    decoder, gate_math = replay_module.ReplayDecoder, replay_module._GateMath
    lookup, predict = decoder._lookup, gate_math.gate_prediction
    routing: dict[str, np.ndarray] = {}

    def remember(self, *args, **kwargs):
        out = lookup(self, *args, **kwargs)
        routing["now"] = out[0]  # [T, L, k] of the forward being replayed
        return out

    def cut(self, layer: int):
        used = set(np.asarray(routing["now"][:, layer, : self.top_k[layer]]).ravel().tolist())
        return [(e, c) for e, c in predict(self, layer) if e in used]

    decoder._lookup, gate_math.gate_prediction = remember, cut
    try:
        yield
    finally:
        decoder._lookup, gate_math.gate_prediction = lookup, predict


def times_of_bound(trace, budget: float, hardware: str) -> float:
    tpot = np.mean([r.metrics["tpot_ms"] for r in sl.replay(trace, "pregate_split", expert_budget=budget,
                                                                hardware=hardware, cost_shape=SHAPE)])
    return float(np.mean(bound_tpots(trace, budget, hardware, SHAPE)) / tpot)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, help="the folder closer_to_bound.py --save-traces wrote")
    a = ap.parse_args()
    print("| routing | profile · budget | `pregate_split` × | the same, wrong predictions never issued × | Δ |")
    print("|---|---|---|---|---|")
    for label, stem in ROUTINGS.items():
        for budget, bits in BUDGETS.items():
            trace = sl.load_trace(a.traces / f"{stem}-int{bits}.npz")
            for hw in PROFILES:
                now = times_of_bound(trace, budget, hw)
                with precise_gate():
                    ceiling = times_of_bound(trace, budget, hw)
                print(f"| {label} | {hw} · {budget} | {now:.3f} | {ceiling:.3f} | {ceiling - now:+.3f} |", flush=True)


if __name__ == "__main__":
    main()
