"""Sweeps on a live model, replayed where a replay is the live run: the model's routing over the prompts recorded
once for the non-speculative cells, its draft chains drafted on demand for the speculative ones
(:func:`~specter_lab.analysis.lazy_record.record_on_demand`), each cell then a replay. A replay is the live run
(greedy, simulated clock: ``tests/test_replay.py``), so every cell's metrics are what running it live gives, for a
fraction of the model's forwards: the planner's calibration in notebook 04 ran 3,600 forwards of the bundled
model for its 46 candidates live, ~1,000 here. Cells a replay cannot stand for run live, as before: a measured
clock, a draft that computes with what the cache holds (``resident``, ``hybrid``, ``host``), a K past the
chains kept (16), a model whose cache cannot be rewound for drafting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..analysis.lazy_record import record_on_demand
from ..analysis.replay import replay
from ..decode.kv import SequenceCache
from ..predict import KGovernor
from ..run.assembly import uses_gate_predictions
from .runs import Cell, DoesNotFit, LiveSource, PromptRuns, run_prompts

__all__ = ["ReplayedLiveSource", "K_MAX"]

K_MAX = 16  # the longest chain drafted on demand: the planner's longest K and the governor's


@dataclass
class ReplayedLiveSource(LiveSource):
    """A :class:`~specter_lab.studies.runs.LiveSource` whose cells run as replays of routing recorded from the
    model on demand, where a replay is the live run (module docstring); the rest run live. The recording is made
    on the first cell that needs it and kept for the others."""

    label: str = "live"
    _base: object = field(default=None, repr=False)  # the autoregressive recording (non-speculative cells)
    _drafts: dict = field(default_factory=dict, repr=False)  # QuantSpec → its trace with chains on demand
    _rewinds: bool | None = field(default=None, repr=False)

    def run(self, cell: Cell) -> "PromptRuns | DoesNotFit":
        eng = self.engine(cell)  # every check the live run makes (budget, exactness, the draft's fit) still runs
        if isinstance(eng, DoesNotFit):
            return eng
        t0 = time.perf_counter()
        if self.replays(eng):
            results = replay(self._trace(eng), cell.strategy, tokenizer=self.tokenizer, trace_level="steps",
                             **cell.kwargs)
            runs = PromptRuns([r.metrics for r in results])
        else:
            runs = run_prompts(eng, self.prompts, self.max_new_tokens)
        runs.seconds = time.perf_counter() - t0
        return runs

    def replays(self, eng) -> bool:
        """Does a replay give ``eng``'s runs exactly (module docstring)? Else they run live."""
        setup, st = eng.setup, eng.strategy
        if setup.measured or setup.ignore_eos or setup.host_budget is not None or setup.verify != "batched":
            return False
        if uses_gate_predictions(st) and not any(l.router is not None for l in eng.info.layers[1:]):
            return False  # no router to record a gate prediction with (a live run predicts nothing either)
        if not st.speculative:
            return True
        if not eng.draft_cfg.recordable or eng.draft_cfg.variant != "quantized":
            return False
        return (KGovernor().k_max if st.k == "auto" else st.k) <= K_MAX and self._can_rewind()

    def _trace(self, eng):
        """The recording that replays ``eng``'s runs (made on first use)."""
        if not eng.strategy.speculative:
            return self._recording()[0]
        spec = eng.draft_spec
        if spec not in self._drafts:
            self._drafts.update(record_on_demand(self.model, self.tokenizer, self.prompts,
                                                 max_new_tokens=self.max_new_tokens, drafts=[spec],
                                                 k_max=K_MAX, base=self._recording()[0])[1])
        return self._drafts[spec]

    def _recording(self):
        if self._base is None:
            self._base = record_on_demand(self.model, self.tokenizer, self.prompts,
                                          max_new_tokens=self.max_new_tokens, drafts=())[0]
        return self._base, self._drafts

    def _can_rewind(self) -> bool:
        """Drafting needs a cache cropped back to a window's start: attention layers only (as ``sl.record``)."""
        if self._rewinds is None:
            self._rewinds = not SequenceCache(self.model, True).recurrent
        return self._rewinds
