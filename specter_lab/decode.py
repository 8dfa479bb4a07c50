"""Decode loops: autoregressive and speculative (draft K / verify K+1), over the unmodified HF model.

Both loops drive the HF model with its own DynamicCache. The draft is the same model with the runtime in draft
mode (quantized routed experts); it continues from the target's committed cache, which is cut back to the
committed length before verification. Greedy verification accepts while the target's argmax equals the draft
token; sampling uses standard speculative rejection sampling, so the output distribution is the target's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .predict import KGovernor, LookaheadPlanner, WindowForecast

__all__ = ["Sampling", "StepInfo", "autoregressive", "speculative"]


class StopGeneration(Exception):
    """Raised by a step callback (e.g. a widget's stop button) to end generation cleanly after a step."""


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution the target samples from: softmax(logits / T), nucleus-filtered (HF's order)."""
        logits = logits.float() / self.temperature
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            remove_sorted = cum <= (1 - self.top_p)
            remove_sorted[..., -1:] = False  # keep at least one token
            remove = remove_sorted.scatter(-1, order, remove_sorted)
            logits = logits.masked_fill(remove, -math.inf)
        return logits.softmax(-1)

    def pick(self, logits: torch.Tensor, gen: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
        if not self.do_sample:
            return int(torch.argmax(logits, dim=-1)), None
        p = self.probs(logits)
        return int(torch.multinomial(p, 1, generator=gen)), p


@dataclass
class StepInfo:
    """What a step callback sees after each decoding step (one token, or one draft/verify window)."""

    step: int
    tokens: list[int]  # all committed so far
    new_tokens: list[int]
    drafted: int = 0
    accepted: int = 0
    # Frames of the run so far (Trace.snapshot): call it inside the callback, where the trace is consistent.
    snapshot: Callable[[], dict] | None = field(default=None, repr=False, compare=False)


class Decoder:
    """Shared plumbing for both loops: model forward in a mode, head cost, commits, step records."""

    def __init__(self, model, runtime, sampling: Sampling, eos: list[int], max_new_tokens: int,
                 callback: Callable[[StepInfo], None] | None) -> None:
        from transformers import DynamicCache

        self.model = model
        self.rt = runtime
        self.clock = runtime.clock
        self.trace = runtime.trace
        self.sampling = sampling
        self.eos = set(eos)
        self.max_new = max_new_tokens
        self.callback = callback
        self.cache = DynamicCache(config=model.config)
        # Sliding-window layers must keep their past until we crop, or a rejected draft cannot be rolled back.
        self.cache.activate_past_recording()
        self.out: list[int] = []
        # transformers 5.x renames `past_key_values` to `cache`; use whichever this version's forward takes.
        import inspect

        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.device = runtime.store.device
        self.gen = None
        if sampling.do_sample:
            self.gen = torch.Generator(device="cpu")
            self.gen.manual_seed(0 if sampling.seed is None else sampling.seed)

    def forward(self, ids: list[int] | torch.Tensor, mode: str, phase: str, keep: int = 0) -> torch.Tensor:
        """Run the model on ``ids`` after the cached prefix; returns float logits [T_kept, V] on the CPU."""
        rt = self.rt
        rt.mode, rt.phase = mode, phase
        rt.context = self.cache.get_seq_length()
        rt.pos0 = rt.context
        rt.routing = {}
        x = ids if isinstance(ids, torch.Tensor) else torch.tensor([ids], dtype=torch.long)
        x = x.to(self.device)
        try:
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=keep, **{self.cache_kw: self.cache})
        finally:
            rt.mode = "target"
        if mode != "shadow":
            n_head = x.shape[1] if keep == 0 else keep
            span, _ = self.clock.compute(self.rt.cost.head_time(n_head))
            self.trace.span(rt.step, "draft" if mode == "draft" else phase, -1, -1, span)
        return out.logits[0].float().cpu()

    def commit(self, tokens: list[int], status: list[str]) -> None:
        t = self.clock.now()
        for tok, st in zip(tokens, status):
            self.trace.tokens.append((len(self.out), self.rt.step, tok, st, True, t))
            self.out.append(tok)

    def done(self) -> bool:
        return len(self.out) >= self.max_new or (bool(self.out) and self.out[-1] in self.eos)

    def prefill(self, prompt: torch.Tensor) -> None:
        self.rt.step = 0
        self.rt.store.step = 0
        t0 = self.clock.now()
        logits = self.forward(prompt, "target", "prefill", keep=1)
        tok, _ = self.sampling.pick(logits[-1], self.gen)
        self.commit([tok], ["prefill"])
        self.trace.steps.append((0, "prefill", t0, self.clock.now(), 0, 0, 1))
        self._notify(0, [tok])

    def _notify(self, step: int, new: list[int], drafted: int = 0, accepted: int = 0) -> None:
        if self.callback is not None:
            self.callback(StepInfo(step, list(self.out), new, drafted, accepted,
                                   snapshot=lambda: self.trace.snapshot(self.clock)))

    def end_step(self) -> None:
        if not self.rt.keep_cache:
            for layer, s in enumerate(self.rt.store.slots):
                for slot in range(s.size):
                    self.rt.store.evict(layer, slot)


def autoregressive(dec: Decoder, prompt: torch.Tensor) -> list[int]:
    """One target forward per token (on_demand, lru, gate_lookahead)."""
    dec.prefill(prompt)
    dec.end_step()
    step = 0
    while not dec.done():
        step += 1
        dec.rt.step = dec.rt.store.step = step
        t0 = dec.clock.now()
        logits = dec.forward([dec.out[-1]], "target", "decode", keep=1)
        tok, _ = dec.sampling.pick(logits[-1], dec.gen)
        dec.commit([tok], ["decode"])
        dec.trace.steps.append((step, "decode", t0, dec.clock.now(), 0, 0, 1))
        dec.end_step()
        dec._notify(step, [tok])
    return dec.out


def _verify_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int, str]:
    """Returns (accepted, next token, 'corrected'|'bonus')."""
    target = torch.argmax(logits, dim=-1).tolist()
    for i, d in enumerate(drafts):
        if target[i] != d:
            return i, target[i], "corrected"
    return len(drafts), target[len(drafts)], "bonus"


def _verify_sampling(dec: Decoder, logits: torch.Tensor, drafts: list[int], q: list[torch.Tensor]):
    """Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023)."""
    for i, d in enumerate(drafts):
        p = dec.sampling.probs(logits[i])
        r = float(torch.rand(1, generator=dec.gen))
        if q[i][d] <= 0 or r < min(1.0, float(p[d] / q[i][d])):
            continue
        residual = torch.clamp(p - q[i], min=0)
        total = residual.sum()
        residual = residual / total if total > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=dec.gen)), "corrected"
    p = dec.sampling.probs(logits[len(drafts)])
    return len(drafts), int(torch.multinomial(p, 1, generator=dec.gen)), "bonus"


def speculative(dec: Decoder, prompt: torch.Tensor, strategy, planner: LookaheadPlanner | None,
                governor: KGovernor | None) -> list[int]:
    """Chain drafting of K tokens, multi-step lookahead prefetch during drafting, one verification pass."""
    rt, clock, trace = dec.rt, dec.clock, dec.trace
    num_layers = rt.info.num_layers
    dec.prefill(prompt)
    if governor is not None:  # the prompt's routing seeds the governor's distinct-experts curve
        governor.observe_routing([rt.routing[l] for l in sorted(rt.routing)], int(prompt.shape[-1]))
    rt.choose_hybrid_sets()
    step = 0
    k_fixed = None if strategy.k == "auto" else int(strategy.k)
    while not dec.done():
        step += 1
        rt.step = rt.store.step = step
        t0 = clock.now()
        n = dec.cache.get_seq_length()
        last = dec.out[-1]
        remaining = dec.max_new - len(dec.out)
        k_cap = min(k_fixed if k_fixed is not None else governor.k_max, remaining - 1)
        forecast = WindowForecast(num_layers)
        rt.forecast = forecast
        if governor is not None:
            governor.begin_window()
            n_transfers, n_compute = len(trace.transfers), len(trace.compute)
        if planner is not None:
            planner.begin_window(max(k_cap, 1))
        drafts: list[int] = []
        qs: list[torch.Tensor] = []
        step_ends = []
        x = last
        for j in range(k_cap):
            ts = clock.now()
            logits = dec.forward([x], "draft", "draft", keep=1)
            forecast.add(rt.routing, j)
            d, q = dec.sampling.pick(logits[-1], dec.gen)
            drafts.append(d)
            if q is not None:
                qs.append(q)
            x = d
            te = clock.now()
            step_ends.append(te)
            if planner is not None:
                if clock.kind == "simulated":
                    planner.observe_step(clock.elapsed(ts, te))
                if strategy.prefetch == "draft" and planner.due(j + 1):
                    planner.boundary(j + 1, forecast)
            if d in dec.eos:
                break
            if k_fixed is None:
                uncovered = sum(len(set(forecast.counts[l]) - rt.store.resident(l)) for l in range(num_layers))
                miss = uncovered / max(1, forecast.union_size())
                t_draft = planner.step_time_avg if planner and planner.step_time_avg else clock_elapsed(clock, ts, te)
                if not governor.keep_drafting(j + 1, t_draft, rt.verify_estimate,
                                              rt.cost.copy_time(rt.cost.expert_bytes), uncovered, miss):
                    break
        crop_to(dec.cache, n)
        window_forecast = forecast
        if strategy.prefetch == "oracle":
            # The bound: look at the target's true routing for this window (off the clock), then issue the same
            # boundary schedule with that knowledge, at the times the boundaries happened.
            dec.forward([last] + drafts, "shadow", "verify")
            crop_to(dec.cache, n)
            window_forecast = WindowForecast(num_layers)
            window_forecast.add(rt.routing, 0)
            rt.forecast = window_forecast
            if planner is not None and drafts:
                planner.begin_window(len(drafts))
                for j, te in enumerate(step_ends):
                    if planner.due(j + 1):
                        planner.boundary(j + 1, window_forecast, issue_at=te)
        for layer, counts in enumerate(window_forecast.counts):
            for e, c in counts.items():
                trace.forecast.append((step, layer, e, c))
        logits = dec.forward([last] + drafts, "target", "verify", keep=0)
        verify_routing = [rt.routing[l] for l in sorted(rt.routing)] if governor is not None else None
        if dec.sampling.do_sample:
            acc, nxt, kind = _verify_sampling(dec, logits, drafts, qs)
        else:
            acc, nxt, kind = _verify_greedy(logits, drafts)
        new = drafts[:acc] + [nxt]
        status = ["accepted"] * acc + [kind]
        # Stop at the first EOS, exactly as HF generate does.
        for i, tok in enumerate(new):
            if tok in dec.eos:
                new, status = new[: i + 1], status[: i + 1]
                break
        tr = clock.now()
        for i, d in enumerate(drafts[acc:]):
            trace.tokens.append((len(dec.out) + acc + i, step, d, "rejected", False, tr))
        dec.commit(new, status)
        crop_to(dec.cache, n + len(new))  # KV for `last` and the accepted drafts; the new last token has none yet
        trace.steps.append((step, "window", t0, clock.now(), len(drafts), acc, len(new)))
        if governor is not None:
            governor.update_acceptance(acc, len(drafts))
            governor.observe_routing(verify_routing, acc + 1)  # rows of `last` and the accepted drafts
            if clock.kind == "simulated":  # CUDA event times are not readable mid-run without a sync
                stall = sum(a - r for *_, a, _z, r in trace.compute[n_compute:] if r is not None)
                governor.observe_window(len(trace.transfers) - n_transfers, stall,
                                        rt.cost.copy_time(rt.cost.expert_bytes))
        dec.end_step()
        dec._notify(step, new, len(drafts), acc)
    return dec.out


def crop_to(cache, length: int) -> None:
    """Cut the KV cache back to ``length`` tokens (transformers ≥5 crops by a negative count to remove)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def clock_elapsed(clock, a, b) -> float:
    return clock.elapsed(a, b) if clock.kind == "simulated" else 1e-3
