"""What cancelling wrong pre-gated prefetches could be worth (issue 36), what-ifs on the simulated clock.

Fate and PreScope cancel a prefetch once the router shows it is not needed, so that its copy stops holding the link
(and its slot's expert stays). ``pregate_split`` does not: its wrong prefetches (about half of them at the bundled
predictor's recall) hold the link until they land. Before building cancellation, this measures its ceiling: the
same replay with every pre-gated prediction cut to the experts the next layer really routes to (precision 1, the
same recall), so that a wrong prefetch is never issued at all, which no cancellation can beat. The cut is made by
wrapping the replay's gate predictions (``specter_lab.analysis.replay._GateMath``) for the length of this script.

Then cancellation itself, two ways (:func:`held_queue`): the schedule keeps a layer's pre-gated copies in a queue of
its own instead of handing them all to the link at once, and gives the link the next one only when it is idle. When
the layer's router asks, the copies still queued are settled: those it needs are issued then (as prefetches, so the
split still places them), the others are dropped, their slots' experts kept. The queue is fed either at the
schedule's own points (after each expert the device computes: a rule any clock that answers ``copy_idle`` can run,
CUDA included) or, as by a host thread that issues the moment the link frees, at that moment (the simulated clock
alone can say when it is).

Reads the evaluation traces that ``scripts/closer_to_bound.py --save-traces DIR`` writes; prints a markdown table
of × of the bound (the bound's mean TPOT over the rows' mean, as ``bench`` reads it) per compiled cell::

    nice python scripts/closer_to_bound.py --save-traces /tmp/ctb   # the traces are written in the first minute
    nice python scripts/precise_pregate_whatif.py /tmp/ctb   # 80 s
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Iterator

import numpy as np

import specter_lab as sl
from specter_lab.offload import schedule as schedule_module
from specter_lab.analysis import replay as replay_module
from specter_lab.analysis.bound import bound_tpots

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


@contextlib.contextmanager
def held_queue(thread: bool) -> Iterator[None]:
    """Within the block, ``pregate_split``'s pre-gated copies wait in the schedule's queue and are cancelled at their
    router (module docstring); ``thread``: fed the moment the link frees instead of at the schedule's points."""
    sched = schedule_module.LayerSchedule
    gate_prefetch, target, compute = sched._gate_prefetch, sched._target, sched._compute

    def feed(self) -> None:
        queue = getattr(self, "_queued", None)
        while queue and self.clock.copy_idle(self.clock.now()):
            layer, e, protect = queue.pop(0)
            at = max(self.clock.copy_t, self._asked) if thread else None
            self.store.prefetch(layer, e, protected=protect, issue_at=at)

    def queue_prefetches(self, nxt: int, predicted) -> None:
        # the schedule's own _gate_prefetch picks and counts the forecast; its copies are queued instead of issued
        store, queued = self.store, []

        def enqueue(layer: int, e: int, protected=(), **_) -> bool:
            if e not in store.slots[layer].where:
                queued.append((layer, e, protected))
            return False

        store.prefetch = enqueue  # shadows the method on this store only, for this call
        try:
            gate_prefetch(self, nxt, predicted)
        finally:
            del store.prefetch
        self._queued, self._asked = queued, self.clock.now()
        feed(self)

    def settle_then_target(self, fwd, layer, counts, n_tokens, math):
        queue = getattr(self, "_queued", None) or []
        self._queued = [q for q in queue if q[0] != layer]
        for _, e, protect in (q for q in queue if q[0] == layer and q[1] in counts):
            self.store.prefetch(layer, e, protected=protect)  # needed: issued now; the rest are dropped
        return target(self, fwd, layer, counts, n_tokens, math)

    def compute_then_feed(self, *args, **kwargs):
        out = compute(self, *args, **kwargs)
        feed(self)
        return out

    sched._gate_prefetch, sched._target, sched._compute = queue_prefetches, settle_then_target, compute_then_feed
    try:
        yield
    finally:
        sched._gate_prefetch, sched._target, sched._compute = gate_prefetch, target, compute


def times_of_bound(trace, budget: float, hardware: str) -> float:
    tpot = np.mean([r.metrics["tpot_ms"] for r in sl.replay(trace, "pregate_split", expert_budget=budget,
                                                                hardware=hardware, cost_shape=SHAPE)])
    return float(np.mean(bound_tpots(trace, budget, hardware, SHAPE)) / tpot)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, help="the folder closer_to_bound.py --save-traces wrote")
    a = ap.parse_args()
    print("| routing | profile · budget | `pregate_split` × | wrong predictions never issued × (Δ) "
          "| cancelled at the router, queue fed at the schedule's points × (Δ) "
          "| cancelled, queue fed as the link frees × (Δ) |")
    print("|---|---|---|---|---|---|")
    for label, stem in ROUTINGS.items():
        for budget, bits in BUDGETS.items():
            trace = sl.load_trace(a.traces / f"{stem}-int{bits}.npz")
            for hw in PROFILES:
                now = times_of_bound(trace, budget, hw)
                cells = []
                for variant in (precise_gate(), held_queue(thread=False), held_queue(thread=True)):
                    with variant:
                        x = times_of_bound(trace, budget, hw)
                    cells.append(f"{x:.3f} ({x - now:+.3f})")
                print(f"| {label} | {hw} · {budget} | {now:.3f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
