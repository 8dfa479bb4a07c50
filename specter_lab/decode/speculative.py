"""The speculative loop: draft a window of K tokens → forecast → verify and commit, once per step.

The draft is the same model with the runtime in draft mode; it continues from the target's committed cache,
which is rewound to the committed length before verification, and after verification to what it accepted
(:class:`~specter_lab.decode.kv.SequenceCache`: attention crops; a recurrent state is restored from the window's
checkpoint and the kept tokens are recomputed, phase ``recompute``). During drafting the draft's routing is
counted per layer (the window forecast) and the lookahead prefetcher copies forecast experts at its boundaries.

Verification (``Speculation.verify``, the Engine's ``verify=``):

* ``"batched"`` (default): one target forward over the K+1 positions. Its matmuls have K+1 rows where decoding
  has one, so in bf16/fp16 its logits differ from token-by-token decoding by rounding: the committed tokens are
  the target's greedy choice under the verification's numerics, and can differ from HF ``generate`` only where
  the target's top two logits are within that rounding (a near-tie; see docs/lossless.md, measured in
  docs/measured/bf16_divergence.md). In float32 the difference does not reach the argmax on the tested models.
* ``"exact"``: the positions are verified by one-token target forwards, in order, stopping at the first
  rejection (greedy), so every logit is computed in the shapes decoding uses: the output equals token-by-token
  decoding (HF ``generate``) by construction, in every dtype. It costs up to K+1 forwards of the dense part per
  window instead of one (the experts, prefetched from the forecast, are the same).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..predict import KGovernor, LookaheadPrefetcher, WindowForecast, WindowOutcome
from .decoder import Decoder
from .kv import Checkpoint
from .sampling import verify_greedy, verify_sampling

__all__ = ["Speculation", "DraftWindow", "Verdict", "speculative", "ForecastSource", "DraftForecast",
           "OracleForecast", "VERIFY_MODES", "check_verify_mode"]

VERIFY_MODES = ("batched", "exact")


def check_verify_mode(verify: str) -> str:
    """``verify`` validated: ``"batched"`` (one K+1-token pass) or ``"exact"`` (one-token passes)."""
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify={verify!r}: use 'batched' (one target pass over the K+1 positions: the target's "
                         "greedy choice under that pass's rounding) or 'exact' (one-token passes: equal to "
                         "token-by-token decoding in every dtype, at up to K+1 dense forwards per window).")
    return verify


class DraftForecast:
    """The window's forecast is the draft's own routing; the prefetcher's boundaries run during drafting
    (``prefetch="draft"``; with no prefetcher, ``"none"``: the forecast only feeds eviction and the views)."""

    during_draft = True

    def forecast(self, dec: "Decoder", spec: "Speculation", w: "DraftWindow") -> WindowForecast:
        return w.forecast


class OracleForecast:
    """The bound (``prefetch="oracle"``): the target's true routing of the window, looked at off the clock,
    then the same boundary schedule issued at the times the boundaries happened."""

    during_draft = False

    def forecast(self, dec: "Decoder", spec: "Speculation", w: "DraftWindow") -> WindowForecast:
        return oracle_forecast(dec, spec, w)


ForecastSource = DraftForecast | OracleForecast


@dataclass
class Speculation:
    """How one strategy speculates: draft length (or ``"auto"``: the governor decides), where the window's
    forecast comes from, and the parts that carry state across windows."""

    k: int | str
    source: ForecastSource = field(default_factory=DraftForecast)
    prefetcher: LookaheadPrefetcher | None = None
    governor: KGovernor | None = None
    verify: str = "batched"  # VERIFY_MODES: one K+1-token pass, or one-token passes ("exact")


@dataclass
class DraftWindow:
    """The drafted tokens of one window. ``n``: cache length at its start (``last`` is not cached yet);
    ``context``: cache length at the last draft forward; ``step_ends``: clock handle after each draft step."""

    n: int
    last: int
    drafts: list[int] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)
    step_ends: list = field(default_factory=list)
    forecast: WindowForecast | None = None
    context: int = 0
    checkpoint: Checkpoint | None = None  # recurrent caches: the state at n, to rewind to


@dataclass
class Verdict:
    """What verification kept: ``new`` tokens (accepted drafts + the target's own) and their statuses, and the
    verification pass's routing per layer (ascending layer id)."""

    accepted: int
    new: list[int]
    status: list[str]
    routing: list


def speculative(dec: Decoder, prompt: torch.Tensor, spec: Speculation) -> list[int]:
    """Chain drafting of K tokens, multi-step lookahead prefetch during drafting, one verification pass."""
    info = dec.prefill(prompt)
    if spec.governor is not None:  # the prompt's routing seeds the governor's distinct-experts curve
        spec.governor.observe_routing(_by_layer(info.routing), int(prompt.shape[-1]))
    dec.rt.choose_hybrid_sets(info.routing)
    while not dec.done():
        dec.begin_step()
        t0, wall0 = dec.clock.now(), time.perf_counter()
        marks = (dec.trace.copies, len(dec.trace.tally.stalls))
        window = draft_window(dec, spec)
        rewind(dec, window, window.n)
        forecast = spec.source.forecast(dec, spec, window)
        for layer, counts in enumerate(forecast.counts):
            for e, c in counts.items():
                dec.trace.forecast_count(layer, e, c)
        verdict = verify(dec, window, spec.verify)
        commit_window(dec, window, verdict, t0)
        if spec.governor is not None:
            spec.governor.observe(_outcome(dec, window, verdict, marks, (t0, wall0)))
        dec.end_step()
        dec.notify(verdict.new, len(window.drafts), verdict.accepted)
    return dec.out


def _by_layer(routing: dict) -> list:
    return [routing[l] for l in sorted(routing)]


def draft_window(dec: Decoder, spec: Speculation) -> DraftWindow:
    """Draft up to K tokens (fewer at EOS, at max_new_tokens, or when the governor stops), counting the draft's
    routing into the window forecast and running the prefetcher's boundaries as drafting goes."""
    rt, clock, governor, prefetcher = dec.rt, dec.clock, spec.governor, spec.prefetcher
    k_fixed = None if spec.k == "auto" else int(spec.k)
    k_cap = min(k_fixed if k_fixed is not None else governor.k_max, dec.max_new - len(dec.out) - 1)
    w = DraftWindow(dec.kv.length, dec.out[-1], forecast=WindowForecast(rt.info.num_layers))
    w.checkpoint = _checkpoint(dec)
    rt.store.follow(w.forecast)
    if governor is not None:
        governor.begin_window()
        if k_fixed is None and governor.target is not None:  # K chosen for the whole window: plan copies for it
            k_cap = min(k_cap, governor.target)
    if prefetcher is not None:
        prefetcher.begin_window(max(k_cap, 1))
    x = w.last
    for j in range(k_cap):
        ts, wall = clock.now(), time.perf_counter()
        logits, info = dec.forward([x], "draft", "draft", keep=1)
        w.forecast.add(info.routing, j)
        w.context = info.pos0
        x, q = dec.sampling.pick(logits[-1], dec.gen)
        w.drafts.append(x)
        if q is not None:
            w.qs.append(q)
        te = clock.now()
        w.step_ends.append(te)
        step_s = clock.step_seconds(ts, te, time.perf_counter() - wall)  # readable mid-run, whatever the clock
        if prefetcher is not None:
            prefetcher.observe_step(step_s)
            if spec.source.during_draft and prefetcher.due(j + 1):
                prefetcher.boundary(j + 1, w.forecast)
        if x in dec.eos or (k_fixed is None and not _keep_drafting(dec, spec, w, j + 1, step_s)):
            break
    return w


def _keep_drafting(dec: Decoder, spec: Speculation, w: DraftWindow, j: int, step_s: float) -> bool:
    """The governor's stop rule after draft step j, on what this window has forecast so far."""
    rt, prefetcher = dec.rt, spec.prefetcher
    early = spec.governor.early(j)
    if early is not None:  # decided without costs: skip counting what the forecast leaves uncovered
        return early
    # Uncovered: forecast experts not landed on the device. A copy the prefetcher issued during this window is
    # still one the window pays for: counted as resident, a window whose forecast was all copied looked free.
    now, ready = dec.clock.now(), rt.schedule.ready_now
    uncovered = sum(not ready(l, e, now) for l in range(rt.info.num_layers) for e in w.forecast.counts[l])
    miss = uncovered / max(1, w.forecast.union_size())
    t_draft = prefetcher.step_time_avg if prefetcher is not None and prefetcher.step_time_avg else step_s
    context = w.context
    return spec.governor.keep_drafting(j, t_draft, lambda n, d=None: rt.verify_estimate(n, context, d),
                                       rt.cost.copy_time(rt.cost.expert_bytes), uncovered, miss)


def oracle_forecast(dec: Decoder, spec: Speculation, w: DraftWindow) -> WindowForecast:
    """The bound: look at the target's true routing of this window (off the clock), then issue the same boundary
    schedule with that knowledge, at the times the boundaries happened."""
    with dec.clock.excluded(dec.trace):  # a real forward on a measured clock: cut out of its timeline
        _, info = dec.forward([w.last] + w.drafts, "shadow", "verify")
        rewind(dec, w, w.n)
    forecast = WindowForecast(dec.rt.info.num_layers)
    forecast.add(info.routing, 0)
    dec.rt.store.follow(forecast)
    prefetcher = spec.prefetcher
    if prefetcher is not None and w.drafts:
        prefetcher.begin_window(len(w.drafts))
        for j, te in enumerate(w.step_ends):
            if prefetcher.due(j + 1):
                prefetcher.boundary(j + 1, forecast, issue_at=te)
    return forecast


def verify(dec: Decoder, w: DraftWindow, mode: str = "batched") -> Verdict:
    """One target pass over [last, d1..dK] (``mode="exact"``: one-token passes, :func:`_verify_stepwise`); keep
    the accepted drafts plus the target's own next token, and stop at the first EOS exactly as HF generate does."""
    if mode == "exact":
        logits, routing = _verify_stepwise(dec, w)
    else:
        logits, info = dec.forward([w.last] + w.drafts, "target", "verify", keep=0)
        routing = _by_layer(info.routing)
    if dec.sampling.do_sample:
        acc, nxt, kind = verify_sampling(dec.sampling, dec.gen, logits, w.drafts, w.qs)
    else:
        acc, nxt, kind = verify_greedy(logits, w.drafts)
    new, status = w.drafts[:acc] + [nxt], ["accepted"] * acc + [kind]
    for i, tok in enumerate(new):
        if tok in dec.eos:
            new, status = new[: i + 1], status[: i + 1]
            break
    return Verdict(acc, new, status, routing)


def _verify_stepwise(dec: Decoder, w: DraftWindow) -> tuple[torch.Tensor, list]:
    """The window's logits from one-token target forwards over [last, d1..], each exactly a decoding step. Greedy
    stops at the first position whose argmax rejects the draft (the cache then holds just the kept tokens: no
    rewind); sampling needs every position. Returns the logits rows computed and the routing per layer."""
    rows, routes = [], []
    for i, tok in enumerate([w.last] + w.drafts):
        logits, info = dec.forward([tok], "target", "verify", keep=1)
        rows.append(logits[-1])
        routes.append(info.routing)
        if not dec.sampling.do_sample and i < len(w.drafts) and int(torch.argmax(logits[-1])) != w.drafts[i]:
            break
    routing = [np.concatenate([r[l] for r in routes]) for l in sorted(routes[0])]
    return torch.stack(rows), routing


def commit_window(dec: Decoder, w: DraftWindow, v: Verdict, t0) -> None:
    """Record the rejected drafts, commit the kept tokens, and rewind the cache to them: it keeps `last` and the
    accepted drafts; the new last token has no cache entry yet."""
    t = dec.clock.now()
    for i, d in enumerate(w.drafts[v.accepted:]):
        dec.trace.token(len(dec.out) + v.accepted + i, d, "rejected", False, t)
    dec.commit(v.new, v.status)
    redo = 0 if dec.done() else rewind(dec, w, w.n + len(v.new))  # a finished run needs no cache
    dec.trace.step_done("window", t0, dec.clock.now(), len(w.drafts), v.accepted, len(v.new), redo)


def _checkpoint(dec: Decoder) -> Checkpoint | None:
    """A recurrent cache's state at the window start, priced as the device copy it is."""
    ck = dec.kv.checkpoint()
    if ck is not None and ck.nbytes:
        span, _ = dec.clock.compute(dec.rt.cost.state_copy_time(ck.nbytes))
        dec.trace.span("snapshot", -1, -1, span)
    return ck


def rewind(dec: Decoder, w: DraftWindow, length: int) -> int:
    """Rewind the cache to ``length`` tokens; where a recurrent state had to be restored, feed the kept tokens
    again (phase ``recompute``: a real target forward on the clock). Returns the tokens recomputed."""
    ck = w.checkpoint
    restores = ck is not None and dec.kv.length != length
    redo = dec.kv.rewind(length, ck)
    if restores and ck.nbytes:
        span, _ = dec.clock.compute(dec.rt.cost.state_copy_time(ck.nbytes))
        dec.trace.span("snapshot", -1, -1, span)
    if redo:
        dec.forward(([w.last] + w.drafts)[:redo], "target", "recompute", keep=1)
    return redo


def _outcome(dec: Decoder, w: DraftWindow, v: Verdict, marks: tuple[int, int], started: tuple) -> WindowOutcome:
    """What the governor learns from a window; ``started``: the clock's and the wall clock's time at its start."""
    cost, trace = dec.rt.cost, dec.trace
    stall = None
    if dec.clock.readable_midrun:  # CUDA event times are not readable mid-run without a sync
        stall = sum(trace.tally.stalls[marks[1]:])
    # On CUDA the wall time: verification read its logits on the host (a sync), so it has seen the whole window.
    elapsed = dec.clock.step_seconds(started[0], dec.clock.now(), time.perf_counter() - started[1])
    return WindowOutcome(v.accepted, len(w.drafts), v.routing, trace.copies - marks[0], stall,
                         cost.copy_time(cost.expert_bytes), elapsed)
