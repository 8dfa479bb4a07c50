"""Trace: plain records of one generation, turned into pandas DataFrames on demand; metrics are derived from the
frames, never kept twice.

Frames (all times in ms from the start of the run, on the clock named in ``trace.meta['clock']``):

* ``steps``     step, kind (prefill|decode|window), start, end, drafted, accepted, committed
* ``tokens``    index, step, token_id, status (prefill|decode|accepted|rejected|corrected|bonus), committed, time
* ``routing``   step, position, layer, expert, rank, source (draft|target|shadow)
* ``forecast``  step, layer, expert, count: what the predictor said the target would need in that step
* ``cache``     step, layer, expert, event (hit|miss|prefetch|prefetch_used|prefetch_wasted|evict), time
* ``transfers`` step, layer, expert, slot, bytes, start, end, reason (prefetch|demand)
* ``compute``   step, phase (prefill|decode|draft|verify|head), layer, expert (-1 = dense part), start, end, stall
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

COLUMNS = {
    "steps": ["step", "kind", "start", "end", "drafted", "accepted", "committed"],
    "tokens": ["index", "step", "token_id", "status", "committed", "time"],
    "routing": ["step", "position", "layer", "expert", "rank", "source"],
    "forecast": ["step", "layer", "expert", "count"],
    "cache": ["step", "layer", "expert", "event", "time"],
    "transfers": ["step", "layer", "expert", "slot", "bytes", "start", "end", "reason"],
    "compute": ["step", "phase", "layer", "expert", "start", "end", "stall"],
}
_TIME_COLS = {"steps": ("start", "end"), "tokens": ("time",), "cache": ("time",), "transfers": ("start", "end"),
              "compute": ("start", "end", "stall")}


@dataclass
class Trace:
    """Append-only records of one run. ``meta`` says which clock produced the times and what was priced."""

    meta: dict[str, Any] = field(default_factory=dict)
    steps: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    routing_raw: list = field(default_factory=list)  # (step, source, layer, pos0, int array [T, k])
    forecast: list = field(default_factory=list)
    cache_events: list = field(default_factory=list)
    transfers: list = field(default_factory=list)
    compute: list = field(default_factory=list)  # stall holds the 'ready' handle until finalize()
    record_routing: bool = True
    _finalized: bool = False
    _frames: dict | None = None

    # ----------------------------------------------------------- recording (hot path: tuples only)
    def cache(self, step, layer, expert, event, t) -> None:
        self.cache_events.append((step, layer, expert, event, t))

    def transfer(self, step, layer, expert, slot, nbytes, start, end, reason) -> None:
        self.transfers.append((step, layer, expert, slot, nbytes, start, end, reason))

    def span(self, step, phase, layer, expert, span) -> None:
        self.compute.append((step, phase, layer, expert, span.start, span.end, span.stall_from))

    def routed(self, step, source, layer, pos0, index_array) -> None:
        if self.record_routing:
            # A list, not the numpy view: views of tiny tensors pin small heap blocks between the KV-cache
            # reallocations and fragment the heap (+200 MB over 2,000 tokens, measured by scripts/long_run.py).
            self.routing_raw.append((step, source, layer, pos0, index_array.tolist()))

    # ----------------------------------------------------------- resolving
    def finalize(self, clock) -> "Trace":
        """Turn clock handles into ms (synchronising a CUDA clock once). Idempotent."""
        if self._finalized:
            return self
        clock.synchronize()
        ms = clock.to_ms
        self.steps = [(s, k, ms(a), ms(b), d, acc, c) for s, k, a, b, d, acc, c in self.steps]
        self.tokens = [(i, s, t, st, c, ms(h)) for i, s, t, st, c, h in self.tokens]
        self.cache_events = [(s, l, e, ev, ms(h)) for s, l, e, ev, h in self.cache_events]
        self.transfers = [(s, l, e, sl, b, ms(a), ms(z), r) for s, l, e, sl, b, a, z, r in self.transfers]
        self.compute = [(s, p, l, e, ms(a), ms(z), ms(a) - ms(r) if r is not None else 0.0)
                        for s, p, l, e, a, z, r in self.compute]
        self._finalized = True
        return self

    def snapshot(self, clock) -> dict[str, Any]:
        """Frames of the run *so far*, while it is still recording (what a live view draws), plus ``meta``.

        The records are copied and their times resolved on the copy, so the run goes on recording untouched.
        On a CUDA clock resolving a time synchronises the device: a live view that refreshes often perturbs
        the timings it shows, which is why views throttle their refreshes."""
        if self._finalized:
            return {**self.frames(), "meta": dict(self.meta)}
        copy = Trace(meta=dict(self.meta), steps=list(self.steps), tokens=list(self.tokens),
                     routing_raw=list(self.routing_raw), forecast=list(self.forecast),
                     cache_events=list(self.cache_events), transfers=list(self.transfers),
                     compute=list(self.compute), record_routing=self.record_routing)
        return {**copy.finalize(clock).frames(), "meta": copy.meta}

    def frames(self) -> dict[str, pd.DataFrame]:
        """All frames as pandas DataFrames (cached after the first call)."""
        if not self._finalized:
            raise RuntimeError("trace is still recording; frames() is available once generate() returned")
        if self._frames is None:
            routing = _routing_frame(self.routing_raw)
            self._frames = {
                "steps": pd.DataFrame(self.steps, columns=COLUMNS["steps"]),
                "tokens": pd.DataFrame(self.tokens, columns=COLUMNS["tokens"]),
                "routing": routing,
                "forecast": pd.DataFrame(self.forecast, columns=COLUMNS["forecast"]),
                "cache": pd.DataFrame(self.cache_events, columns=COLUMNS["cache"]),
                "transfers": pd.DataFrame(self.transfers, columns=COLUMNS["transfers"]),
                "compute": pd.DataFrame(self.compute, columns=COLUMNS["compute"]),
            }
        return self._frames


def _routing_frame(raw: list) -> pd.DataFrame:
    """Expand the compact per-forward routing arrays into one long frame (one numpy concat, not a frame each)."""
    if not raw:
        return pd.DataFrame(columns=COLUMNS["routing"])
    raw = [(s, src, l, p, np.asarray(idx, dtype=np.int64).reshape(len(idx), -1)) for s, src, l, p, idx in raw]
    sizes = [idx.size for *_, idx in raw]
    cols = {
        "step": np.repeat([r[0] for r in raw], sizes),
        "position": np.concatenate([np.repeat(np.arange(p, p + idx.shape[0]), idx.shape[1]) for _, _, _, p, idx in raw]),
        "layer": np.repeat([r[2] for r in raw], sizes),
        "expert": np.concatenate([idx.reshape(-1) for *_, idx in raw]),
        "rank": np.concatenate([np.tile(np.arange(idx.shape[1]), idx.shape[0]) for *_, idx in raw]),
        "source": np.repeat(np.array([r[1] for r in raw], dtype=object), sizes),
    }
    return pd.DataFrame(cols)


def compute_metrics(trace: Trace) -> dict[str, Any]:
    """Every metric from the frames. Decode-phase metrics exclude the prefill (step 0), as TPOT does."""
    f = trace.frames()
    meta = trace.meta
    tok = f["tokens"]
    committed = tok[tok.committed]
    n = len(committed)
    out: dict[str, Any] = {"clock": meta.get("clock"), "new_tokens": n}
    if n >= 2:
        span_ms = committed.time.iloc[-1] - committed.time.iloc[0]
        out["tpot_ms"] = float(span_ms) / (n - 1)
        out["tokens_per_s"] = 1e3 / out["tpot_ms"] if out["tpot_ms"] > 0 else float("inf")
    else:
        out["tpot_ms"] = float("nan")
        out["tokens_per_s"] = float("nan")
    decode_tokens = max(n - 1, 1)
    ce = f["cache"]
    dec = ce[ce.step >= 1]
    hits, misses = int((dec.event == "hit").sum()), int((dec.event == "miss").sum())
    out["hit_rate"] = hits / (hits + misses) if hits + misses else float("nan")
    out["demand_hits"], out["demand_misses"] = hits, misses
    tr = f["transfers"]
    trd = tr[tr.step >= 1]
    out["h2d_bytes_per_token"] = float(trd.bytes.sum()) / decode_tokens
    out["demand_bytes_per_token"] = float(trd[trd.reason == "demand"].bytes.sum()) / decode_tokens
    out["prefetch_bytes_per_token"] = float(trd[trd.reason == "prefetch"].bytes.sum()) / decode_tokens
    co = f["compute"]
    out["stall_ms_per_token"] = float(co[co.step >= 1].stall.sum()) / decode_tokens
    out["prefill_ms"] = float(f["steps"].end.iloc[0] - f["steps"].start.iloc[0]) if len(f["steps"]) else float("nan")
    out["prefetch_waste_bytes"] = int((ce.event == "prefetch_wasted").sum()) * int(meta.get("expert_bytes", 0))
    n_pref = int((ce.event == "prefetch").sum())
    out["prefetch_used_fraction"] = int((ce.event == "prefetch_used").sum()) / n_pref if n_pref else float("nan")

    st = f["steps"]
    windows = st[st.kind == "window"]
    if len(windows):
        drafted, accepted = int(windows.drafted.sum()), int(windows.accepted.sum())
        out["acceptance_rate"] = accepted / drafted if drafted else float("nan")
        out["mean_accepted"] = float(windows.accepted.mean())
        out["mean_k"] = float(windows.drafted.mean())
        out["accept_hist"] = {int(k): int(v) for k, v in windows.accepted.value_counts().sort_index().items()}
        out["coverage"] = out["hit_rate"]
        dr = co[(co.phase == "draft") & (co.step >= 1)]
        # what one draft token costs: every draft span (dense parts, experts, head) over the tokens drafted
        out["draft_step_ms"] = float((dr.end - dr.start).sum()) / drafted if drafted else float("nan")
    else:
        out["acceptance_rate"] = float("nan")
        out["mean_accepted"] = float("nan")
    rec, prec = forecast_quality(f)
    out["recall"], out["precision"] = rec, prec
    return out


def forecast_quality(frames: dict[str, pd.DataFrame]) -> tuple[float, float]:
    """Micro-averaged recall |P∩U|/|U| and precision |P∩U|/|P| of the forecast against the experts the target
    used, per (step, layer), over the steps that had a forecast."""
    fc, ro = frames["forecast"], frames["routing"]
    if fc.empty or ro.empty:
        return float("nan"), float("nan")
    used = ro[(ro.source == "target") & (ro.step.isin(fc.step.unique()))][["step", "layer", "expert"]].drop_duplicates()
    pred = fc[["step", "layer", "expert"]].drop_duplicates()
    both = used.merge(pred, on=["step", "layer", "expert"])
    recall = len(both) / len(used) if len(used) else float("nan")
    precision = len(both) / len(pred) if len(pred) else float("nan")
    return recall, precision
