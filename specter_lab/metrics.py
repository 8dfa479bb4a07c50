"""Every metric of a run, computed from its trace's frames (nothing is counted beside the trace).

Decode-phase metrics exclude the prefill (step 0), as TPOT does. Two TPOTs, side by side (``docs/paper.md``):

* ``tpot_ms`` – unbiased: time from the prefill's token to the last commit, over the tokens committed after the
  prefill's. Every token in the divisor is timed.
* ``tpot_ms_artifact`` – Specter's artifact (``benchmarks/token_timing.py``): ``(last commit − first commit) /
  (N − 1)``, where a speculative loop commits nothing at the prefill, so its first commit is its first window's,
  already holding up to K + 1 tokens that are counted in N but not timed. For an autoregressive run the first
  commit is the prefill's token and the two are equal; for a speculative one the artifact's is lower by exactly
  the first window's time over N − 1.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .trace import Trace

__all__ = ["compute_metrics", "forecast_quality", "forecast_hits"]


def compute_metrics(trace: Trace) -> dict[str, Any]:
    f = trace.frames()
    meta = trace.meta
    out: dict[str, Any] = {"clock": meta.get("clock"), **_latency(f["tokens"], f["steps"])}
    decode_tokens = max(out["new_tokens"] - 1, 1)
    out.update(_cache(f["cache"], int(meta.get("expert_bytes", 0))))
    out.update(_link(f["transfers"], decode_tokens))
    co = f["compute"]
    out["stall_ms_per_token"] = float(co[co.step >= 1].stall.sum()) / decode_tokens
    st = f["steps"]
    out["prefill_ms"] = float(st.end.iloc[0] - st.start.iloc[0]) if len(st) else float("nan")
    out.update(_windows(st, co, out["hit_rate"]))
    out.update(_rewinds(st, co, decode_tokens))
    out.update(_host(f["cache"], co, decode_tokens))
    out["recall"], out["precision"] = forecast_quality(f)
    return out


def _latency(tok: pd.DataFrame, st: pd.DataFrame) -> dict[str, Any]:
    committed = tok[tok.committed]
    n = len(committed)
    out: dict[str, Any] = {"new_tokens": n, "tpot_ms": float("nan"), "tokens_per_s": float("nan"),
                           "tpot_ms_artifact": float("nan"), "first_commit_tokens": 1}
    if n >= 2:
        out["tpot_ms"] = float(committed.time.iloc[-1] - committed.time.iloc[0]) / (n - 1)
        out["tokens_per_s"] = 1e3 / out["tpot_ms"] if out["tpot_ms"] > 0 else float("inf")
        out.update(_artifact_tpot(committed, st, n))
    return out


def _artifact_tpot(committed: pd.DataFrame, st: pd.DataFrame, n: int) -> dict[str, Any]:
    """The artifact's TPOT: its clock starts at the first commit. A speculative loop (window steps) commits
    nothing at the prefill, so that is the end of its first window, and the prefill's token and the first
    window's tokens are counted in ``n`` without being timed (``first_commit_tokens`` of them)."""
    windows = st[st.kind == "window"] if len(st) else st
    if not len(windows):
        return {"tpot_ms_artifact": float(committed.time.iloc[-1] - committed.time.iloc[0]) / (n - 1),
                "first_commit_tokens": 1}
    first = windows.step.iloc[0]
    t_first = float(committed[committed.step == first].time.max())
    return {"tpot_ms_artifact": (float(committed.time.iloc[-1]) - t_first) / (n - 1),
            "first_commit_tokens": int((committed.step <= first).sum())}


def _cache(ce: pd.DataFrame, expert_bytes: int) -> dict[str, Any]:
    dec = ce[ce.step >= 1]
    hits, misses = int((dec.event == "hit").sum()), int((dec.event == "miss").sum())
    n_pref = int((ce.event == "prefetch").sum())
    return {"hit_rate": hits / (hits + misses) if hits + misses else float("nan"),
            "demand_hits": hits, "demand_misses": misses,
            "prefetch_waste_bytes": int((ce.event == "prefetch_wasted").sum()) * expert_bytes,
            "prefetch_used_fraction": int((ce.event == "prefetch_used").sum()) / n_pref if n_pref else float("nan")}


def _link(tr: pd.DataFrame, decode_tokens: int) -> dict[str, float]:
    trd = tr[tr.step >= 1]
    wb = trd.reason == "writeback"  # device→host (Mixtral-Offloading's swap), the rest host→device
    return {"h2d_bytes_per_token": float(trd[~wb].bytes.sum()) / decode_tokens,
            "d2h_bytes_per_token": float(trd[wb].bytes.sum()) / decode_tokens,
            "demand_bytes_per_token": float(trd[trd.reason == "demand"].bytes.sum()) / decode_tokens,
            "prefetch_bytes_per_token": float(trd[trd.reason == "prefetch"].bytes.sum()) / decode_tokens}


def _windows(st: pd.DataFrame, co: pd.DataFrame, hit_rate: float) -> dict[str, Any]:
    windows = st[st.kind == "window"]
    if not len(windows):
        return {"acceptance_rate": float("nan"), "mean_accepted": float("nan")}
    drafted, accepted = int(windows.drafted.sum()), int(windows.accepted.sum())
    dr = co[(co.phase == "draft") & (co.step >= 1)]
    return {"acceptance_rate": accepted / drafted if drafted else float("nan"),
            "mean_accepted": float(windows.accepted.mean()), "mean_k": float(windows.drafted.mean()),
            "accept_hist": {int(k): int(v) for k, v in windows.accepted.value_counts().sort_index().items()},
            "coverage": hit_rate,
            # what one draft token costs: every draft span (dense parts, experts, head) over the tokens drafted
            "draft_step_ms": float((dr.end - dr.start).sum()) / drafted if drafted else float("nan")}


def _rewinds(st: pd.DataFrame, co: pd.DataFrame, decode_tokens: int) -> dict[str, Any]:
    """What exact rewinding cost on hybrid (recurrent) models: tokens fed again after a state restore, and the
    time of those recompute passes and of the state checkpoints / restores (zero on attention-only models)."""
    dec = co[co.step >= 1]
    ms = lambda phase: float((dec[dec.phase == phase].end - dec[dec.phase == phase].start).sum()) / decode_tokens
    return {"recompute_tokens": int(st.recomputed.sum()) if "recomputed" in st else 0,
            "recompute_ms_per_token": ms("recompute"), "snapshot_ms_per_token": ms("snapshot")}


def _host(ce: pd.DataFrame, co: pd.DataFrame, decode_tokens: int) -> dict[str, float]:
    """Host execution: missed experts computed on the host CPU per token, and the host lane's busy time."""
    host = co[(co.step >= 1) & (co.lane == "host")] if "lane" in co else co.iloc[:0]
    return {"host_experts_per_token": int(((ce.step >= 1) & (ce.event == "host")).sum()) / decode_tokens,
            "host_ms_per_token": float((host.end - host.start).sum()) / decode_tokens}


def forecast_hits(frames: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(used, predicted, both): distinct (step, layer, expert) the target used in forecast steps, that the
    forecast named, and both. Recall and precision, per run or per step, are ratios of their sizes."""
    fc, ro = frames["forecast"], frames["routing"]
    cols = ["step", "layer", "expert"]
    used = ro[(ro.source == "target") & ro.step.isin(fc.step.unique())][cols].drop_duplicates()
    pred = fc[cols].drop_duplicates()
    return used, pred, used.merge(pred, on=cols)


def forecast_quality(frames: dict[str, pd.DataFrame]) -> tuple[float, float]:
    """Micro-averaged recall |P∩U|/|U| and precision |P∩U|/|P| of the forecast against the experts the target
    used, per (step, layer), over the steps that had a forecast."""
    if frames["forecast"].empty or frames["routing"].empty:
        return float("nan"), float("nan")
    used, pred, both = forecast_hits(frames)
    recall = len(both) / len(used) if len(used) else float("nan")
    precision = len(both) / len(pred) if len(pred) else float("nan")
    return recall, precision
