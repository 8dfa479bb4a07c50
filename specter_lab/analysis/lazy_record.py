"""Record on demand: the autoregressive routing at once, each draft chain only when a replay first asks for it.

:func:`~specter_lab.analysis.record.record` drafts a chain of ``k_max`` tokens from every window start, about
``k_max + 2`` forwards per token, whether or not a strategy ever starts a window there or drafts that far. A
planner's calibration replays a few dozen candidates on two short prompts, and between them they start windows
at some positions only, each to its own K. :func:`record_on_demand` runs the autoregressive pass at once (every
non-speculative strategy replays from it) and returns a trace per draft whose chains are drafted by the model
when a replay first asks for a window start, as far as it asks, then kept for the next replay; the target's
verification pass over a chain likewise. A replay of such a trace prices exactly what it would on the trace
``sl.record`` writes: the same expert code (:class:`~specter_lab.analysis.record._Recorder`), the same cache,
drafting from the same committed prefix. Its chains rest on the assumption every replay of a recorded trace
already makes (``tests/test_replay.py`` holds replays at every K equal to live runs): a row's result does not
depend on how many rows its pass has, nor on which pass of two rows or more wrote the cache entries before it.
``tests/test_planner_speed.py`` holds these chains equal to ``sl.record``'s.

The traces live in memory with the model (they call it): they cannot be saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from ..model import attached, inspect_model
from ..run.quant import QuantSpec, shared_draft
from ..traces.trace_file import RoutedSequence, RoutingTrace
from .record import _autoregressive, _encode, _Pass, _Recorder

__all__ = ["record_on_demand", "OnDemandSequence", "Chains"]


class _Quiet:
    """The progress bar :class:`_Pass` advances: none here."""

    def update(self, n: int = 1) -> None:
        pass


@dataclass
class Chains:
    """What one prompt's chains for one draft have given so far: plain arrays, no model state, so they can outlive
    the drafter that drafted them (a later plan on the same model and prompts starts from them:
    :mod:`~specter_lab.studies.calibration`)."""

    tokens: dict[int, list[int]] = field(default_factory=dict)  # window start -> its drafts so far
    routing: dict[int, list[np.ndarray]] = field(default_factory=dict)  # window start -> their routing [1, L, k] each
    verified: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # start -> (routing, argmax)


class _Drafter:
    """One prompt's chains for one draft, drafted as replays ask into its :class:`Chains`. The model's cache (made on
    the first forward: a drafter whose chains already hold what is asked runs none) holds the committed prefix up to
    ``committed`` (written by the prompt's own pass and then by target passes of two rows or more), and past it the
    drafts of the chain from window start ``open`` (None: no draft in it)."""

    def __init__(self, model, info, draft_of: "Callable[[], object]", prompt: list[int], tokens: list[int],
                 chains: "Chains | None" = None) -> None:
        self.model, self.info, self._draft_of = model, info, draft_of
        self.device = model.get_input_embeddings().weight.device
        self.seq = list(prompt) + list(tokens)
        self.P, self.tokens = len(prompt), list(tokens)
        self.committed = 0
        self.open: int | None = None
        self.chains = chains if chains is not None else Chains()
        self.forwards = 0
        self._step: "_Pass | None" = None

    @property
    def step(self) -> _Pass:
        """The pass on the model's own cache, with the draft's recorder: made when a forward first needs it."""
        if self._step is None:
            self.rec = _Recorder(self.info, self._draft_of())
            self._step = _Pass(self.model, self.rec, self.device, True, _Quiet())
        return self._step

    def _forward(self, ids: list[int], mode: str, keep: int = 1):
        self.forwards += 1
        step = self.step
        with attached(self.model, self.info, self.rec), torch.no_grad():
            return step(ids, mode, keep)

    def _goto(self, n: int) -> None:
        """The cache holds exactly the committed prefix of length ``n``: cropped back, or fed forward by the
        prompt's own pass (as ``sl.record``'s prefill) and then by one target pass of two rows or more (a single
        token to feed takes the one before it again: a one-row pass could round otherwise)."""
        kv = self.step.kv
        keep = min(n, self.committed)
        if keep < n and n - keep == 1 and keep > self.P:
            keep -= 1
        if kv.length > keep:
            kv.rewind(keep, None)
        self.committed, self.open = keep, None
        if keep < self.P:
            if keep:  # a prefill is one pass over the whole prompt
                kv.rewind(0, None)
            self._forward(self.seq[: self.P], "target")
            keep = self.committed = self.P
        if keep < n:
            self._forward(self.seq[keep:n], "target")
            self.committed = n

    def drafts(self, w: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``n`` (or more) drafts of the chain from window start ``w``: tokens ``[n']`` and routing
        ``[n', L, k]``."""
        have, routes = self.chains.tokens.get(w, []), self.chains.routing.get(w, [])
        if len(have) < n:
            start = self.P + w
            if self.open != w or self.step.kv.length != start + len(have):  # draft again from the start: greedy,
                kept, have, routes = have, [], []  # so the same tokens and routing as before
                self._goto(start)
            else:
                kept = None
            x = have[-1] if have else self.tokens[w]
            while len(have) < n:
                nxt, routing, _ = self._forward([x], "draft")
                x = int(nxt[-1])
                have.append(x)
                routes.append(routing)
            if kept is not None and have[: len(kept)] != kept:
                raise RuntimeError(f"window start {w}: drafting again gave other tokens (a non-deterministic draft)")
            self.open, self.chains.tokens[w], self.chains.routing[w] = w, have, routes
        return np.asarray(have, dtype=np.int32), np.concatenate(routes)

    def verification(self, w: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The target's routing ``[t', L, k]`` and argmax ``[t']`` over ``[last, d1..]`` from window start ``w``,
        ``t' >= t`` rows (one pass over every draft kept for that start)."""
        got = self.chains.verified.get(w)
        if got is None or len(got[1]) < t:
            drafts = self.drafts(w, t - 1)[0].tolist() if t > 1 else self.chains.tokens.get(w, [])
            start = self.P + w
            self._goto(start)
            nxt, routing, _ = self._forward([self.tokens[w]] + drafts, "target", keep=0)
            got = self.chains.verified[w] = (routing, np.asarray(nxt, dtype=np.int32))
            # `last` stays, as the target wrote it, and so do the drafts that are the committed tokens after it
            # (as a live window keeps what it accepted): the next window starts there without feeding them again
            same = 0
            while same < len(drafts) and w + 1 + same < len(self.tokens) and drafts[same] == self.tokens[w + 1 + same]:
                same += 1
            self.step.kv.rewind(start + 1 + same, None)
            self.committed = start + 1 + same
        return got


class OnDemandSequence(RoutedSequence):
    """A :class:`~specter_lab.traces.trace_file.RoutedSequence` whose chains are drafted when first asked
    (:meth:`drafts`, :meth:`verification`); its chain arrays stay None."""

    drafter: _Drafter

    @property
    def speculative(self) -> bool:
        return True

    def drafts(self, w: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.drafter.drafts(w, n)

    def verification(self, w: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        return self.drafter.verification(w, t)


def record_on_demand(model, tokenizer, prompts: Sequence, *, max_new_tokens: int, drafts: Sequence[QuantSpec],
                     k_max: int = 16, base: "RoutingTrace | None" = None, stop_at_eos: bool = True,
                     chains: "dict[QuantSpec, list[Chains]] | None" = None) -> "tuple[RoutingTrace, dict]":
    """The autoregressive routing of ``model`` over ``prompts`` (a trace with no chains: ``base`` when given, a
    recording of the same prompts already made), and per draft in ``drafts`` a trace with the same routing whose
    chains (up to ``k_max``) are drafted on demand (module docstring). ``stop_at_eos=False``: every continuation
    runs ``max_new_tokens`` (what an engine with ``ignore_eos=True`` replays). ``chains``: per draft, one
    :class:`Chains` per prompt that earlier drafting of the same model, prompts and ``base`` filled (used and filled
    further; a draft not in it gets new ones, put in it)."""
    info = inspect_model(model)
    device = model.get_input_embeddings().weight.device
    name = getattr(model.config, "_name_or_path", "") or info.model_type
    config = model.config.to_dict()
    if base is None:
        rec, plain = _Recorder(info, None), []
        with attached(model, info, rec), torch.no_grad():
            for p in prompts:
                ids = _encode(p, tokenizer, info.vocab)
                prefill, tokens, decode, gate = _autoregressive(_Pass(model, rec, device, False, _Quiet()), ids,
                                                                max_new_tokens,
                                                                set(info.eos_token_ids) if stop_at_eos else set())
                plain.append(RoutedSequence(np.asarray(ids, np.int32), np.asarray(tokens, np.int32), prefill,
                                            decode, gate))
        base = RoutingTrace(config, plain, 0, None, f"recorded: {name} on {device}", {"on_demand": True})
    traces = {}
    kept = chains if chains is not None else {}
    for spec in drafts:
        draft_of = lambda spec=spec: shared_draft(model, info, spec, device)  # quantized at the first draft forward
        per_prompt = kept.setdefault(spec, [Chains() for _ in base.sequences])
        seqs = []
        for s, c in zip(base.sequences, per_prompt):
            lazy = OnDemandSequence(s.prompt, s.tokens, s.prefill, s.decode, s.gate)
            lazy.drafter = _Drafter(model, info, draft_of, s.prompt.tolist(), s.tokens.tolist(), c)
            seqs.append(lazy)
        traces[spec] = RoutingTrace(config, seqs, k_max, {"bits": spec.bits, "group_size": spec.group_size,
                                                          "method": spec.method},
                                    f"recorded on demand: {name} on {device}, draft {spec.label}",
                                    {"on_demand": True})
    return base, traces
