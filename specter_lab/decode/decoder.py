"""The decoder: model forwards in a mode, commits, step records, and the plain autoregressive loop.

The model runs unmodified with its own cache; what each forward is (target, draft or shadow; its phase and
position) goes to the runtime as one :class:`~specter_lab.offload.runtime.ForwardInfo`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..offload.runtime import ForwardInfo
from .kv import SequenceCache
from .sampling import Sampling

__all__ = ["Decoder", "StepInfo", "StopGeneration", "autoregressive", "reference_greedy"]


class StopGeneration(Exception):
    """Raised by a step callback (e.g. a widget's stop button) to end generation cleanly after a step."""


@dataclass
class StepInfo:
    """What a step callback sees after each decoding step (one token, or one draft/verify window)."""

    step: int
    tokens: list[int]  # all committed so far
    new_tokens: list[int]
    drafted: int = 0
    accepted: int = 0
    # Frames of the run so far (Trace.snapshot; ``kinds=`` limits which): call it inside the callback, where the
    # trace is consistent.
    snapshot: Callable[..., dict] | None = field(default=None, repr=False, compare=False)


class Decoder:
    """Shared plumbing of both loops: forwards, head cost, commits, step records, the stop rule."""

    def __init__(self, model, runtime, sampling: Sampling, eos: list[int], max_new_tokens: int,
                 callback: Callable[[StepInfo], None] | None = None, keep_cache: bool = True,
                 rewindable: bool = False, kv=None) -> None:
        self.model = model
        self.rt = runtime
        self.clock = runtime.clock
        self.trace = runtime.trace
        self.sampling = sampling
        self.eos = set(eos)
        self.max_new = max_new_tokens
        self.callback = callback
        self.keep_cache = keep_cache  # False (on_demand): nothing stays resident between steps
        # rewindable: speculative runs go back after a window (``kv``: another cache, e.g. a replay's positions)
        self.kv = kv if kv is not None else SequenceCache(model, rewindable)
        self.out: list[int] = []
        self.device = runtime.store.device
        self.gen = sampling.generator()
        self.step = 0

    def begin_step(self) -> int:
        """Start the next step (the trace records everything that follows under it)."""
        self.step += 1
        self.trace.begin_step(self.step)
        return self.step

    def forward(self, ids: list[int] | torch.Tensor, mode: str, phase: str, keep: int = 0) -> tuple[torch.Tensor, ForwardInfo]:
        """Run the model on ``ids`` after the cached prefix. Returns the logits [T_kept, V] where the model left
        them (on the device: tokens are chosen there, so only the chosen ids cross to the host) and the forward's
        info (its routing per layer)."""
        info = ForwardInfo(self.step, mode, phase, self.kv.length)
        x = ids if isinstance(ids, torch.Tensor) else torch.tensor([ids], dtype=torch.long)
        x = x.to(self.device)
        with self.rt.forward(info):
            out = self.model(input_ids=x, logits_to_keep=keep, **self.kv.inputs(x.shape[1], self.device))
        self.kv.fed(x.shape[1], out)
        if mode != "shadow":
            n_head = x.shape[1] if keep == 0 else keep
            span = self.rt.between_span(self.rt.cost.head_time(n_head, info.pos0))  # last layer's tail + the LM head
            self.trace.span("draft" if mode == "draft" else phase, -1, -1, span)
        return out.logits[0], info

    def commit(self, tokens: list[int], status: list[str]) -> None:
        t = self.clock.now()
        for tok, st in zip(tokens, status):
            self.trace.token(len(self.out), tok, st, True, t)
            self.out.append(tok)

    def done(self) -> bool:
        return len(self.out) >= self.max_new or (bool(self.out) and self.out[-1] in self.eos)

    def prefill(self, prompt: torch.Tensor) -> ForwardInfo:
        self.trace.begin_step(0)
        t0 = self.clock.now()
        logits, info = self.forward(prompt, "target", "prefill", keep=1)
        tok, _ = self.sampling.pick(logits[-1], self.gen)
        self.commit([tok], ["prefill"])
        self.trace.step_done("prefill", t0, self.clock.now())
        self.notify([tok])
        return info

    def notify(self, new: list[int], drafted: int = 0, accepted: int = 0) -> None:
        if self.callback is not None:
            self.callback(StepInfo(self.step, list(self.out), new, drafted, accepted,
                                   snapshot=lambda **kw: self.trace.snapshot(self.clock, **kw)))

    def end_step(self) -> None:
        if not self.keep_cache:
            self.rt.store.evict_all()


def autoregressive(dec: Decoder, prompt: torch.Tensor) -> list[int]:
    """One target forward per token (on_demand, lru, gate_lookahead)."""
    dec.prefill(prompt)
    dec.end_step()
    while not dec.done():
        dec.begin_step()
        t0 = dec.clock.now()
        logits, _ = dec.forward([dec.out[-1]], "target", "decode", keep=1)
        tok, _ = dec.sampling.pick(logits[-1], dec.gen)
        dec.commit([tok], ["decode"])
        dec.trace.step_done("decode", t0, dec.clock.now())
        dec.end_step()
        dec.notify([tok])
    return dec.out


def reference_greedy(model, runtime, prompt: torch.Tensor, n: int, eos: set[int]) -> list[int]:
    """A plain greedy pass of the target, one token per forward, exact experts from their host copies (shadow
    mode: off the clock, off the cache, unrecorded): what ``verify_lossless`` compares a run with."""
    kv = SequenceCache(model)
    device = runtime.store.device
    out: list[int] = []
    x = prompt.to(device)
    while len(out) < n and not (out and out[-1] in eos):
        with runtime.forward(ForwardInfo(-1, "shadow", "reference", kv.length, record=False)):
            result = model(input_ids=x, logits_to_keep=1, **kv.inputs(x.shape[1], device))
        kv.fed(x.shape[1], result)
        out.append(int(torch.argmax(result.logits[0, -1])))
        x = torch.tensor([[out[-1]]], device=device)
    return out
