"""Replay: price any strategy on recorded routing in seconds, with the same code as a live run.

:func:`replay` resolves the same :class:`~specter_lab.run.setup.RunSetup` a live run would (strategy, budget
split, cost model, clock) from a model skeleton made from the trace's config on the ``meta`` device (no
weights), and builds the live run's parts with :func:`~specter_lab.run.setup.prepare_run` (no Engine, no
exactness probe: a replay runs no model), a store without tensors, and a :class:`ReplayDecoder` that, for every
forward the decode loop asks for, hands the layer schedule the recorded routing and the decode loop the recorded
tokens. Store, eviction, prefetch, governor, host execution and clock are the live run's own code, so the trace
records and metrics are the same (greedy; ``tests/test_replay.py`` checks every strategy). Sampling is not
replayed: run it live.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..decode import Decoder
from ..decode.sampling import Sampling
from ..model import MoEModelInfo
from ..model.skeleton import skeleton, skeleton_info  # noqa: F401 - re-exported (sl's replay callers)
from ..offload.clock import is_measured
from ..offload.hostcache import HostExpertCache
from ..offload.schedule import ForwardInfo, counts_of, rank_prediction
from ..predict import KGovernor
from ..run.assembly import uses_gate_predictions
from ..run.drafts import as_draft_spec
from ..run.quant import QuantSpec
from ..run.setup import GenerationResult, RunSetup, prepare_run, resolve
from ..traces.trace_file import RoutedSequence, RoutingTrace, TraceError

__all__ = ["replay", "replay_runs", "replay_setup", "ReplayDecoder", "skeleton", "skeleton_info", "ReplayMismatch",
           "refusal"]


class ReplayMismatch(RuntimeError):
    """The decode loop asked for a forward the trace does not hold (a bug, or a trace of another run)."""


class _Argmax:
    """Logits as the decode loops read them, for known tokens: ``torch.argmax`` of a row (or rows) gives the
    recorded token ids without a vocabulary-sized tensor (``__torch_function__``, torch's extension point)."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = np.asarray(tokens)  # [T] rows, or a scalar: one row

    def __getitem__(self, i) -> "_Argmax":
        return _Argmax(self.tokens[i])

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.argmax:
            return torch.as_tensor(args[0].tokens.astype(np.int64))
        raise TypeError(f"a replayed forward has no logits: {func.__name__} needs a live run (replay is greedy).")


class _Recorded(Sampling):
    """Greedy sampling of a replay: the recorded token, read off the :class:`_Argmax` row without torch's
    function-override dispatch (~3 % of a replay, one per token)."""

    def pick(self, logits, gen):
        return int(logits.tokens), None


class _Positions:
    """The cache a replay decodes with: only its length (crops are exact; no recurrent state is replayed)."""

    recurrent = False

    def __init__(self) -> None:
        self.length = 0

    def checkpoint(self):
        return None

    def rewind(self, length: int, checkpoint=None) -> int:
        if length > self.length:
            raise ValueError(f"cannot rewind a cache of {self.length} tokens forward to {length}")
        self.length = length
        return 0


class _GateMath:
    """The tensor side of a replayed layer: nothing to compute, and the recorded gate-lookahead predictions."""

    def __init__(self, gate: np.ndarray | None, top_k: list[int]) -> None:
        self.gate, self.top_k = gate, top_k  # gate: [T, L, k] rows of this forward

    def device(self, e, weights):
        return None

    def host(self, e, weights):
        return None

    def gate_prediction(self, layer: int) -> list[tuple[int, int]]:
        if self.gate is None:
            return []
        ids = self.gate[:, layer - 1, : self.top_k[layer]]  # row l holds layer l+1's router on layer l's input
        return [] if (ids < 0).any() else rank_prediction(ids)  # -1: that layer has no router to call


class ReplayDecoder(Decoder):
    """A :class:`~specter_lab.decode.Decoder` whose forwards are looked up in a :class:`RoutedSequence`."""

    def __init__(self, seq: RoutedSequence, model, runtime, sampling, eos, max_new_tokens, callback=None,
                 keep_cache: bool = True, rewindable: bool = False) -> None:
        if sampling.do_sample:
            raise ValueError("do_sample=True: a replay is greedy (sampled tokens are not recorded); run it live.")
        super().__init__(None, runtime, _Recorded(), eos, max_new_tokens, callback, keep_cache, rewindable,
                         kv=_Positions())
        self.seq = seq
        self._top_k = [l.top_k for l in runtime.info.layers]

    def forward(self, ids, mode: str, phase: str, keep: int = 0):
        ids = ids[0].tolist() if isinstance(ids, torch.Tensor) else list(ids)
        info = ForwardInfo(self.step, mode, phase, self.kv.length)
        routing, tokens, gate = self._lookup(mode, phase, self.kv.length, ids)
        sched = self.rt.schedule
        math = _GateMath(gate, self._top_k) if sched.gate_lookahead else None
        counts = _layer_counts(routing, self._top_k) if mode != "shadow" else None
        with self.rt.forward(info):
            for layer, k in enumerate(self._top_k):
                sched.routed(info, layer, routing[:, layer, :k])
                if counts is not None:
                    sched.layer(info, layer, counts[layer], len(ids), math)
        self.kv.length += len(ids)
        if mode != "shadow":
            n_head = len(ids) if keep == 0 else keep
            span = self.rt.between_span(self.rt.cost.head_time(n_head, info.pos0))  # last layer's tail + the LM head
            self.trace.span("draft" if mode == "draft" else phase, -1, -1, span)
        return _Argmax(tokens[-keep:] if keep else tokens), info

    def _lookup(self, mode: str, phase: str, pos: int, ids: list[int]):
        """(routing [T, L, k], argmax [T], gate rows or None) of the forward the loop asks for."""
        s, p = self.seq, len(self.seq.prompt)
        if phase == "prefill":
            self._expect(ids, s.prompt.tolist(), "prefill")
            return s.prefill, s.tokens[:1], s.gate[:p] if s.gate is not None else None
        if phase == "decode":
            i = pos - p
            self._expect(ids, [int(s.tokens[i])], f"decode at position {pos}")
            gate = s.gate[p + i: p + i + 1] if s.gate is not None else None
            return s.decode[i: i + 1], s.tokens[i + 1: i + 2], gate
        if phase == "recompute":
            raise ReplayMismatch("a recurrent cache's recompute is not recorded: replay needs an attention-only model.")
        if not s.speculative:
            raise ReplayMismatch("this trace has no draft chains (recorded with k_max=0 or imported without a "
                                 "modeled draft): speculative strategies cannot replay from it.")
        w = len(self.out) - 1  # the window starts at the last committed token (its position: n)
        n = p + w
        if mode == "draft":
            j = pos - n
            d_tok, d_route = s.drafts(w, j + 1)
            want = [int(s.tokens[w])] if j == 0 else [int(d_tok[j - 1])]
            self._expect(ids, want, f"draft step {j} of the window at {n}")
            return d_route[j: j + 1], d_tok[j: j + 1], None
        t = len(ids)  # verification (or the oracle's look) over [last, d1..dK]
        d_tok = s.drafts(w, t - 1)[0] if t > 1 else ()
        self._expect(ids, [int(s.tokens[w])] + [int(d) for d in d_tok[: t - 1]], f"verification at {n}")
        v_route, v_tok = s.verification(w, t)
        return v_route[:t], v_tok[:t], None

    @staticmethod
    def _expect(ids: list[int], want: list[int], what: str) -> None:
        if ids != want:
            raise ReplayMismatch(f"{what}: the loop fed {ids[:8]}, the trace recorded {want[:8]}.")


def _layer_counts(routing: np.ndarray, top_k: list[int]) -> list[dict[int, int]]:
    """:func:`~specter_lab.offload.schedule.counts_of` of every layer of a forward's routing ``[T, L, k]``; for one
    token (decode, a draft step) from one read-back of the whole row, not a numpy slice per layer."""
    if routing.shape[0] != 1:
        return [counts_of(routing[:, layer, :k]) for layer, k in enumerate(top_k)]
    if top_k[0] == routing.shape[2] and len(set(top_k)) == 1:  # every layer's k ids, sorted in one call
        srt = np.sort(routing[0], axis=-1)
        if srt[:, 0].min() >= 0 and not (srt[:, 1:] == srt[:, :-1]).any():  # no -1 slot, no repeated id
            return [dict.fromkeys(row, 1) for row in srt.tolist()]
    out = []
    for row, k in zip(routing[0].tolist(), top_k):
        ids = sorted(row[:k])
        if ids[0] < 0:  # -1: a slot an imported trace did not record
            ids = [e for e in ids if e >= 0]
        out.append(dict.fromkeys(ids, 1) if len(set(ids)) == len(ids) else counts_of(np.asarray([row[:k]])))
    return out


def _trace_model(trace: RoutingTrace) -> MoEModelInfo:
    """The trace's model, from its header's config; a config that builds no model a replay can size is the trace's
    fault (a TraceError naming the field)."""
    try:
        return skeleton_info(trace.config, "trace.config")
    except TraceError:
        raise
    except ValueError as exc:  # ConfigError (a field transformers refuses), or no MoE layers to size
        raise TraceError(str(exc)) from exc


def replay_setup(trace: RoutingTrace, strategy="lru", *, draft: "QuantSpec | None" = None, trace_level: str = "full",
                 check: bool = True, **options) -> tuple[RunSetup, MoEModelInfo]:
    """The run set-up a replay of ``strategy`` on ``trace`` prices with, and its model's info; raises (before any
    run) where the trace cannot replay it (``check=False``: only the set-up, e.g. for the bound, which reads its
    budget split and prices alone). ``strategy`` may be a plan (``sl.plan(..., trace=trace)``)."""
    if not isinstance(trace, RoutingTrace):
        raise TypeError(f"trace must be a sl.RoutingTrace (sl.record(...) or sl.load_trace(path)), got "
                        f"{type(trace).__name__}.")
    if is_measured(options.get("hardware")):
        raise ValueError("hardware='cuda' measures a live run; a replay prices on a simulated profile: give one.")
    if options.get("verify", "batched") != "batched":
        raise ValueError(f"verify={options['verify']!r}: a trace holds each window's one K+1-token verification "
                         "pass (verify='batched'); the exact mode's one-token passes are run live.")
    if strategy == "auto":
        raise ValueError("strategy='auto' plans on a model; on a trace plan first, then replay the plan: "
                         "sl.replay(trace, sl.plan(None, None, trace=trace, ...)).")
    if hasattr(strategy, "engine_kwargs"):  # a plan: the strategy, draft and K it chose
        chosen = strategy.engine_kwargs()
        strategy, draft, options["k"] = chosen.pop("strategy"), chosen.get("draft", draft), chosen.get("k")
    info = _trace_model(trace)
    setup = resolve(info, strategy, draft=_recorded_draft(trace, draft), trace=trace_level, **options)
    if check:
        _check_replayable(setup, info, trace)
    return setup, info


def replay(trace: RoutingTrace, strategy="lru", *, tokenizer=None, sequences: "Sequence[int] | None" = None,
           draft: "QuantSpec | None" = None, callback: Callable | None = None, trace_level: str = "full",
           **options) -> list[GenerationResult]:
    """Replay ``strategy`` on every recorded sequence (or those in ``sequences``): one
    :class:`~specter_lab.run.setup.GenerationResult` each, with the live run's trace records and metrics.

    ``options`` are the Engine's (``expert_budget``, ``cache_slots``, ``hardware`` — a simulated profile —,
    ``cost_shape``, ``k``, ``eviction``, ``host_budget`` — the disk tier, priced from a cache without memory —, …).
    Speculative strategies need a trace with draft chains, replay the draft it was recorded with, and K ≤ the
    trace's ``k_max``. ``trace_level``: the Engine's ``trace=``; ``"steps"`` keeps no per-op record (the metrics
    are the same: what a sweep runs)."""
    plan = strategy if hasattr(strategy, "engine_kwargs") else None
    setup, info = replay_setup(trace, strategy, draft=draft, trace_level=trace_level, check=False, **options)
    return replay_runs(trace, setup, info, tokenizer=tokenizer, sequences=sequences, callback=callback, plan=plan)


def replay_runs(trace: RoutingTrace, setup: RunSetup, info: MoEModelInfo, *, tokenizer=None,
                sequences: "Sequence[int] | None" = None, callback: Callable | None = None,
                plan=None) -> list[GenerationResult]:
    """:func:`replay` of a set-up already resolved: :func:`replay_setup`'s, or a live
    :class:`~specter_lab.run.engine.Engine`'s own (``engine.setup``, ``engine.info``: what a sweep on a live model
    replays instead of generating, :mod:`specter_lab.studies.calibration`). ``plan``: the plan the set-up came
    from (its label goes in the metrics, as a live run's). Refused, before any run, where the trace cannot
    replay the set-up."""
    _check_replayable(setup, info, trace)
    governor = KGovernor() if setup.strategy.k == "auto" else None  # learns across the sequences, as live
    # the disk tier (host_budget=): one host cache across the sequences, warm as a live engine's; no memory, no files
    host_cache = HostExpertCache.tensorless(info, setup.host_budget) if setup.host_budget is not None else None
    picked = range(len(trace.sequences)) if sequences is None else list(sequences)
    with _cycles_uncollected():
        return [_replay_one(trace, i, setup, info, governor, host_cache, callback, tokenizer, plan) for i in picked]


def _replay_one(trace: RoutingTrace, i: int, setup: RunSetup, info: MoEModelInfo, governor, host_cache, callback,
                tokenizer, plan) -> GenerationResult:
    """One recorded sequence replayed (see :func:`replay`)."""
    seq = trace.sequences[i]
    run = prepare_run(setup, info, seq.prompt.tolist(), len(seq.tokens), device=torch.device("meta"),
                      draft=setup.draft_source(), governor=governor, callback=callback,
                      replay=partial(ReplayDecoder, seq), host_cache=host_cache)
    run.tokenizer = tokenizer
    if plan is not None:
        run.finish = lambda m: m.update({"strategy": "auto", "plan": plan.label})
    try:
        result = run.execute()
    finally:
        run.store.release()
    if result.token_ids != seq.tokens.tolist():
        raise ReplayMismatch(f"sequence {i}: the replay committed other tokens than recorded (a bug).")
    result.metrics["routing_source"] = trace.source
    result.trace.meta["routing_source"] = trace.source
    return result


@contextmanager
def _cycles_uncollected():
    """Python's cyclic garbage collector paused while a replay runs. A replay allocates hundreds of thousands of
    small records that form no cycle (freed by reference counting as always), and at ``trace_level="full"`` the
    collector's passes over the ones the trace keeps were ~45 % of a replay's time. Cycles made meanwhile are
    collected once it is back on, by the oldest generation's passes: the replay's survivors are handed to it
    unscanned (``gc.freeze`` + ``gc.unfreeze`` splice the young lists onto the old one in O(1)), where re-enabling
    alone made the next young pass walk every one of them, ~10 % of a ``trace_level="full"`` replay."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:  # unfreeze would also thaw what the caller froze (a pre-fork server)
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _recorded_draft(trace: RoutingTrace, draft) -> "QuantSpec | None":
    """The draft the chains were recorded with (a different one cannot be replayed from them)."""
    cfg = as_draft_spec(draft) if draft is not None else None
    if cfg is not None and not cfg.recordable:
        raise ValueError(f"draft={cfg.variant!r}: that draft computes with whatever the cache holds, so its routing "
                         "depends on the strategy and cannot be recorded apart from it; replay the quantized "
                         "draft, or run this one live.")
    d = trace.draft or {}
    if "bits" not in d:
        return cfg.quant if cfg is not None else None
    recorded = QuantSpec(d["bits"], d["group_size"], d["method"])
    if cfg is not None and cfg.quant != recorded:
        raise ValueError(f"draft={cfg.quant.label}: the trace's chains were drafted by {recorded.label}; replay that "
                         "draft or record the trace again with this one.")
    return recorded


def _check_replayable(setup: RunSetup, info: MoEModelInfo, trace: RoutingTrace) -> None:
    if trace.num_layers != info.num_layers:
        raise TraceError(f"trace has {trace.num_layers} MoE layers, its config's model {info.num_layers}: "
                         "the config is of another model.")
    trace.validate([l.num_experts for l in info.layers])
    why = refusal(setup, trace)
    if why:
        raise ValueError(why)


def refusal(setup: RunSetup, trace: RoutingTrace) -> str | None:
    """Why ``trace`` cannot replay ``setup``'s strategy (None: it can)."""
    st = setup.strategy
    if uses_gate_predictions(st) and not trace.gated:
        return (f"strategy={st.name!r} prefetches with the next layer's router, whose predictions this trace does "
                "not hold: replay another strategy, record the model with sl.record (it keeps them), or model them "
                "on an import with sl.import_routing(..., gate_recall=r).")
    if not st.speculative:
        return None
    if not trace.speculative:
        return (f"strategy={st.name!r} speculates, but this trace has no draft chains (recorded with k_max=0): "
                "record with k_max > 0, or replay a non-speculative strategy.")
    k_need = KGovernor().k_max if st.k == "auto" else st.k
    if k_need > trace.k_max:
        return (f"k={st.k!r} needs chains of {k_need} drafts; this trace holds {trace.k_max}: use "
                f"k <= {trace.k_max}, or record with k_max={k_need}.")
    return None
