"""Sweeps on a live model, replayed where a replay is the live run: the model's routing over the prompts recorded
once for the non-speculative cells, its draft chains drafted on demand for the speculative ones
(:func:`~specter_lab.analysis.lazy_record.record_on_demand`), each cell then a replay. A replay is the live run
(greedy, simulated clock: ``tests/test_replay.py``), so every cell's metrics are what running it live gives, for a
fraction of the model's forwards: the planner's calibration in notebook 04 ran 3,600 forwards of the bundled
model for its 46 candidates live, ~1,000 here. Cells a replay cannot stand for run live, as before: a measured
clock, a draft that computes with what the cache holds (``resident``, ``hybrid``, ``host``), a K past the
chains kept (16), a model whose cache cannot be rewound for drafting.

What was recorded is kept with the model for the next sweep on the same prompts (:class:`_Kept`): the routing and
every chain drafted so far, as plain arrays, under the model's identity (its config and a fingerprint of its
weights, :func:`~specter_lab.model.identity.model_identity`), device and CPU threads. A second ``sl.plan`` on the
same model, at another budget or on other hardware, replays what the first drafted and drafts only what it asks
beyond that; a model whose weights changed in between is recorded again.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field, replace

import torch

from ..analysis.lazy_record import record_on_demand
from ..analysis.record import _encode
from ..analysis.replay import replay_runs
from ..decode.kv import SequenceCache
from ..model import inspect_model
from ..model.identity import model_identity
from ..predict import KGovernor
from ..run.assembly import uses_gate_predictions
from ..traces.trace_file import RoutingTrace
from .runs import Cell, DoesNotFit, LiveSource, PromptRuns, TraceSource, run_prompts

__all__ = ["ReplayedLiveSource", "as_source", "K_MAX"]

K_MAX = 16  # the longest chain drafted on demand: the planner's longest K and the governor's


@dataclass
class _Kept:
    """One model's recordings on one set of prompts: the autoregressive routing per EOS rule, and per (EOS rule,
    draft) the chains drafted so far (no model state: nothing here holds a cache or a draft's weights)."""

    identity: tuple
    base: dict = field(default_factory=dict)  # stops at EOS? -> the autoregressive recording
    chains: dict = field(default_factory=dict)  # stops at EOS? -> {QuantSpec: [Chains per prompt]}


# model -> {(prompt ids, max_new_tokens): _Kept}; an entry goes with its model
_KEPT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _kept(model, tokenizer, prompts, max_new_tokens: int) -> _Kept:
    """What earlier sweeps recorded of ``model`` on these prompts, if its weights, config and device are the same
    as then; else a new, empty entry in its place."""
    vocab = inspect_model(model).vocab
    key = (tuple(tuple(_encode(p, tokenizer, vocab)) for p in prompts), max_new_tokens)
    device = model.get_input_embeddings().weight.device
    # the CPU's thread count too: where an op splits across threads, its rounding can depend on how many
    threads = torch.get_num_threads() if device.type == "cpu" else None
    identity = (tuple(sorted(model_identity(model).items())), str(device), threads)
    per_model = _KEPT.setdefault(model, {})
    kept = per_model.get(key)
    if kept is None or kept.identity != identity:
        kept = per_model[key] = _Kept(identity)
    return kept


@dataclass
class ReplayedLiveSource(LiveSource):
    """A :class:`~specter_lab.studies.runs.LiveSource` whose cells run as replays of routing recorded from the
    model on demand, where a replay is the live run (module docstring); the rest run live. The recording is made
    on the first cell that needs it and kept for the others."""

    label: str = "live"
    _kept: "_Kept | None" = field(default=None, repr=False)  # the model's recordings on these prompts (shared)
    _drafts: dict = field(default_factory=dict, repr=False)  # (stops at EOS?, QuantSpec) → its chains on demand
    _rewinds: bool | None = field(default=None, repr=False)

    def run(self, cell: Cell) -> "PromptRuns | DoesNotFit":
        eng = self.engine(cell)  # every check the live run makes (budget, exactness, the draft's fit) still runs
        if isinstance(eng, DoesNotFit):
            return eng
        return self.run_engine(eng)

    def order(self, cells: "list[Cell]") -> list[int]:
        """The order to run ``cells`` in: the longest fixed K of each draft first, so a shorter one's window finds
        its chain already drafted far enough (drafting one again, longer, costs its forwards twice); the governor's
        (``k="auto"``, whose windows grow a step at a time) last."""
        def key(i: int):
            kw = cells[i].kwargs
            k = kw.get("k", 0)
            return (str(kw.get("draft")), -1 if k == "auto" else -(k or 0), i)

        return sorted(range(len(cells)), key=key)

    def run_engine(self, eng, bar=None) -> PromptRuns:
        """``eng``'s runs over the prompts: replayed where that is the live run, else live (``bar``: a tqdm bar
        advanced once per prompt)."""
        t0 = time.perf_counter()
        if self.replays(eng):
            setup = replace(eng.setup, trace_level="steps")  # a sweep reads metrics: the same at every level
            results = replay_runs(self._trace(eng), setup, eng.info, tokenizer=self.tokenizer, plan=eng.plan)
            runs = PromptRuns([r.metrics for r in results])
            if bar is not None:
                bar.update(len(results))
        else:
            runs = run_prompts(eng, self.prompts, self.max_new_tokens, bar)
        runs.seconds = time.perf_counter() - t0
        return runs

    def replays(self, eng) -> bool:
        """Does a replay give ``eng``'s runs exactly (module docstring)? Else they run live."""
        setup, st = eng.setup, eng.strategy
        if setup.measured or setup.host_budget is not None or setup.verify != "batched":
            return False
        if uses_gate_predictions(st) and not any(l.router is not None for l in eng.info.layers[1:]):
            return False  # no router to record a gate prediction with (a live run predicts nothing either)
        if not st.speculative:
            return True
        if not eng.draft_cfg.recordable or eng.draft_cfg.variant != "quantized":
            return False
        return (KGovernor().k_max if st.k == "auto" else st.k) <= K_MAX and self._can_rewind()

    def _trace(self, eng):
        """The recording that replays ``eng``'s runs (made on first use): to EOS, or the whole length where the
        engine ignores EOS (a benchmark protocol's fixed length)."""
        stop = not eng.setup.ignore_eos
        if not eng.strategy.speculative:
            return self.routing(stop)
        key = (stop, eng.draft_spec)
        if key not in self._drafts:  # this sweep's drafters (each with its own cache), on the chains kept
            self._drafts[key] = record_on_demand(self.model, self.tokenizer, self.prompts, drafts=[key[1]],
                                                 max_new_tokens=self.max_new_tokens, k_max=K_MAX,
                                                 base=self.routing(stop),
                                                 chains=self._kept.chains.setdefault(stop, {}))[1][key[1]]
        return self._drafts[key]

    def routing(self, stop_at_eos: bool = True):
        """The model's greedy routing over the prompts, no chains (what ``sl.record(..., k_max=0)`` writes), recorded
        on first use and kept with the model; ``stop_at_eos=False``: every continuation runs ``max_new_tokens``."""
        if self._kept is None:  # checked once per sweep: the weights cannot change while it runs
            self._kept = _kept(self.model, self.tokenizer, self.prompts, self.max_new_tokens)
        base = self._kept.base
        if stop_at_eos not in base:
            base[stop_at_eos] = record_on_demand(self.model, self.tokenizer, self.prompts, drafts=(),
                                                 max_new_tokens=self.max_new_tokens, stop_at_eos=stop_at_eos)[0]
        return base[stop_at_eos]

    def _can_rewind(self) -> bool:
        """Drafting needs a cache cropped back to a window's start: attention layers only (as ``sl.record``)."""
        if self._rewinds is None:
            self._rewinds = not SequenceCache(self.model, True).recurrent
        return self._rewinds


def as_source(model, tokenizer, prompts, max_new_tokens: int,
              trace: RoutingTrace | None) -> "ReplayedLiveSource | TraceSource":
    """The source a sweep (``sl.compare``, the regime map) evaluates on: the trace when given (then ``prompts`` must
    be None: they are its own), else the model's runs, each replayed where a replay is the live run (the same
    table as running every cell live: ``tests/test_on_demand.py``)."""
    if trace is None:
        if model is None:
            raise ValueError("model is None and no trace= was given: pass a model, or a recorded trace to replay.")
        return ReplayedLiveSource(model, tokenizer, list(prompts), max_new_tokens)
    if not isinstance(trace, RoutingTrace):
        raise TypeError(f"trace= must be a sl.RoutingTrace (sl.record(...) or sl.load_trace(path)), got "
                        f"{type(trace).__name__}.")
    if prompts is not None:
        raise ValueError("prompts= and trace= both given: a trace replays its own recorded prompts; drop prompts=.")
    return TraceSource(trace, tokenizer)
