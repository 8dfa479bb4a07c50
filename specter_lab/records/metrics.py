"""Every metric of a run, from its trace: the step and token records plus the :class:`~specter_lab.records.tally.Tally`
counted as it ran. Both are kept at every trace level, so ``trace="steps"`` (a sweep, a speed run) gives the
same metrics as ``trace="full"`` without paying for a per-op record or a pandas frame.

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

from collections import Counter
from typing import Any

from .tally import Tally
from .trace import AHEAD, StepRecord, TokenRecord, Trace

__all__ = ["compute_metrics", "later_half_rate"]

NAN = float("nan")


def compute_metrics(trace: Trace) -> dict[str, Any]:
    """The run's metrics (``trace`` finalized)."""
    if not trace._finalized:
        raise RuntimeError("compute_metrics needs a finalized trace (Trace.finalize(clock) first).")
    tally, steps = trace.tally, trace.steps
    out: dict[str, Any] = {"clock": trace.meta.get("clock"), **_latency(trace.tokens, steps)}
    decode_tokens = max(out["new_tokens"] - 1, 1)
    out.update(_cache(tally, int(trace.meta.get("expert_bytes", 0))))
    out.update(_link(tally, decode_tokens))
    out["stall_ms_per_token"] = tally.ms["stall"] / decode_tokens
    out["prefill_ms"] = float(steps[0].end - steps[0].start) if steps else NAN
    out.update(_windows(steps, tally, out["hit_rate"]))
    out.update(_rewinds(steps, tally, decode_tokens))
    out.update(_host(tally, decode_tokens))
    out.update(_disk(tally, decode_tokens))
    out["recall"], out["precision"] = tally.recall_precision()
    return out


def later_half_rate(tokens: list[TokenRecord]) -> float:
    """Tokens/s over the later half of a run's decode tokens: from the commit that ends the first half (the
    prefill's token is the clock's start, as TPOT's) to the last, over the tokens committed after it. A window that
    commits across the middle counts wholly in the half it ends in, so no token is counted untimed. (Not in
    :func:`compute_metrics`: the estimate reads it for its decode-length unknown.)"""
    committed = [t for t in tokens if t.committed]
    if len(committed) < 3:
        return NAN
    mid = committed[(len(committed) - 1) // 2].time
    after = sum(1 for t in committed if t.time > mid)
    span = float(committed[-1].time - mid)
    return 1e3 * after / span if after and span > 0 else NAN


def _latency(tokens: list[TokenRecord], steps: list[StepRecord]) -> dict[str, Any]:
    committed = [t for t in tokens if t.committed]
    n = len(committed)
    out: dict[str, Any] = {"new_tokens": n, "tpot_ms": NAN, "tokens_per_s": NAN, "tpot_ms_artifact": NAN,
                           "first_commit_tokens": 1}
    if n >= 2:
        out["tpot_ms"] = float(committed[-1].time - committed[0].time) / (n - 1)
        out["tokens_per_s"] = 1e3 / out["tpot_ms"] if out["tpot_ms"] > 0 else float("inf")
        out.update(_artifact_tpot(committed, steps, n))
    return out


def _artifact_tpot(committed: list[TokenRecord], steps: list[StepRecord], n: int) -> dict[str, Any]:
    """The artifact's TPOT: its clock starts at the first commit. A speculative loop (window steps) commits
    nothing at the prefill, so that is the end of its first window, and the prefill's token and the first
    window's tokens are counted in ``n`` without being timed (``first_commit_tokens`` of them)."""
    first = next((s.step for s in steps if s.kind == "window"), None)
    if first is None:
        return {"tpot_ms_artifact": float(committed[-1].time - committed[0].time) / (n - 1),
                "first_commit_tokens": 1}
    t_first = float(max(t.time for t in committed if t.step == first))
    return {"tpot_ms_artifact": (float(committed[-1].time) - t_first) / (n - 1),
            "first_commit_tokens": sum(t.step <= first for t in committed)}


def _cache(tally: Tally, expert_bytes: int) -> dict[str, Any]:
    hits, misses = tally.count("hit", decode_only=True), tally.count("miss", decode_only=True)
    n_pref = tally.count("prefetch")
    return {"hit_rate": hits / (hits + misses) if hits + misses else NAN,
            "demand_hits": hits, "demand_misses": misses,
            "prefetch_waste_bytes": tally.count("prefetch_wasted") * expert_bytes,
            "prefetch_used_fraction": tally.count("prefetch_used") / n_pref if n_pref else NAN}


def _link(tally: Tally, decode_tokens: int) -> dict[str, float]:
    link = tally.link  # decode steps only; writeback is device→host (Mixtral-Offloading's swap)
    h2d = sum(b for reason, b in link.items() if reason != "writeback")
    return {"h2d_bytes_per_token": float(h2d) / decode_tokens,
            "d2h_bytes_per_token": float(link["writeback"]) / decode_tokens,
            "demand_bytes_per_token": float(link["demand"]) / decode_tokens,
            # every copy made ahead of its lookup (a forecast's prefetches and refreshes); the refreshes alone
            "prefetch_bytes_per_token": float(sum(link[r] for r in AHEAD)) / decode_tokens,
            "refresh_bytes_per_token": float(link["refresh"]) / decode_tokens}


def _windows(steps: list[StepRecord], tally: Tally, hit_rate: float) -> dict[str, Any]:
    windows = [s for s in steps if s.kind == "window"]
    if not windows:
        return {"acceptance_rate": NAN, "mean_accepted": NAN}
    drafted, accepted = sum(w.drafted for w in windows), sum(w.accepted for w in windows)
    return {"acceptance_rate": accepted / drafted if drafted else NAN,
            "mean_accepted": accepted / len(windows), "mean_k": drafted / len(windows),
            "accept_hist": dict(sorted(Counter(w.accepted for w in windows).items())),
            "coverage": hit_rate,
            # what one draft token costs: every draft span (dense parts, experts, head) over the tokens drafted
            "draft_step_ms": tally.ms["draft"] / drafted if drafted else NAN}


def _rewinds(steps: list[StepRecord], tally: Tally, decode_tokens: int) -> dict[str, Any]:
    """What exact rewinding cost on hybrid (recurrent) models: tokens fed again after a state restore, and the
    time of those recompute passes and of the state checkpoints / restores (zero on attention-only models)."""
    return {"recompute_tokens": sum(s.recomputed for s in steps),
            "recompute_ms_per_token": tally.ms["recompute"] / decode_tokens,
            "snapshot_ms_per_token": tally.ms["snapshot"] / decode_tokens}


def _host(tally: Tally, decode_tokens: int) -> dict[str, float]:
    """Host execution: missed experts computed on the host CPU per token, and the host lane's busy time."""
    return {"host_experts_per_token": tally.count("host", decode_only=True) / decode_tokens,
            "host_ms_per_token": tally.ms["host"] / decode_tokens}


def _disk(tally: Tally, decode_tokens: int) -> dict[str, float]:
    """The disk tier (a host expert cache smaller than the experts): reads from the checkpoint files, all run and
    per decode token, the bytes the clock priced and those really read, and the disk lane's busy time."""
    d = tally.disk
    reads = d["reads", False] + d["reads", True]
    return {"disk_reads": reads, "disk_reads_per_token": d["reads", True] / decode_tokens,
            "disk_bytes_per_token": float(d["bytes", True]) / decode_tokens,
            "disk_file_bytes": d["file_bytes", False] + d["file_bytes", True],
            "disk_ms_per_token": tally.ms["disk"] / decode_tokens}
