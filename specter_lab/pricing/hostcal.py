"""Measure this machine's host CPU the way host execution uses it, and combine it with any device profile.

:func:`calibrate_host` times one SwiGLU expert at a model's dimensions (gate/up/down, batch 1 and K+1 tokens,
each host dtype torch runs here) and the DRAM bandwidth one process gets; it needs no GPU. The host fields of a
profile (``cpu_mem_bandwidth``, ``cpu_flops``) are then fitted so that the cost model's host expert time
reproduces the measured times, and saved. ``hardware="rtx4090-pcie4+host"`` is that device profile with this
machine's host: every output names it (``…+host``), and ``host_profile()`` says what was measured.
``sl.estimate(..., host="calibrated")`` reads the same file's DRAM read bandwidth (measured on every core) as the
host's delivered bandwidth (:func:`specter_lab.pricing.hosts.calibrated_host`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..atomic import write_atomic
from .profiles import HOST_FILE, profile_dir, saved_host

__all__ = ["HostProfile", "calibrate_host", "host_profile", "dram_read_bandwidth"]


@dataclass
class HostProfile:
    """What :func:`calibrate_host` measured (seconds per expert call, bytes per second) and the fitted fields."""

    hidden: int
    intermediate: int
    tokens: list[int]
    expert_s: dict[str, list[float]]  # dtype → seconds per expert call, one per entry of ``tokens``
    dram_bandwidth: float  # one process reading a large tensor (sum)
    cpu_mem_bandwidth: float  # fitted: expert weight bytes / batch-1 time (the cost model's streaming rate)
    cpu_flops: float  # fitted: from the K+1-token time, where compute can show
    dtype: str  # the dtype the fit used (the fastest at batch 1)
    threads: int
    notes: str = ""
    dram_threads: int = 0  # threads the DRAM read ran on (all cores: what a decode engine uses)
    dram_bytes: int = 0  # bytes read per pass
    cores: int = 0
    cpu: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _expert_call(h: int, i: int, n: int, dtype: torch.dtype):
    gate_up = torch.randn(2 * i, h, dtype=dtype) * 0.02
    down = torch.randn(h, i, dtype=dtype) * 0.02
    x = torch.randn(n, h, dtype=dtype)

    def call():
        g, u = (x @ gate_up.T).chunk(2, dim=-1)
        return (torch.nn.functional.silu(g) * u) @ down.T

    return call


def _timed(fn, budget_s: float = 0.5, min_reps: int = 5) -> float:
    fn()
    reps, t0 = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - t0 < budget_s:
        fn()
        reps += 1
    return (time.perf_counter() - t0) / reps


def dram_read_bandwidth(nbytes: int = 256 << 20, threads: int | None = None) -> tuple[float, int, int]:
    """(bytes/s, threads, bytes): one process summing a ``nbytes`` tensor (well past every cache) on ``threads``
    threads (default: every core, as a decode engine runs), best of a 1 s budget. What ``sl.estimate``'s host
    lane reads as the host's delivered DRAM bandwidth (``host='calibrated'``)."""
    before = torch.get_num_threads()
    n = threads or os.cpu_count() or before
    torch.set_num_threads(n)
    try:
        big = torch.ones(nbytes, dtype=torch.uint8).view(torch.float32)
        return big.numel() * 4 / _timed(lambda: big.sum(), budget_s=1.0, min_reps=3), n, nbytes
    finally:
        torch.set_num_threads(before)


def calibrate_host(hidden: int = 2048, intermediate: int = 1408, k: int = 8, dtypes=("float32", "bfloat16"),
                   save: bool = True) -> HostProfile:
    """Time one expert (default: DeepSeek-V2-Lite's, H 2048, I 1408) at 1 and ``k + 1`` tokens in each dtype and
    the DRAM read bandwidth, fit the host fields, and save them (``hardware="<profile>+host"`` reads them)."""
    with torch.inference_mode():
        tokens = [1, k + 1]
        times = {d: [_timed(_expert_call(hidden, intermediate, n, getattr(torch, d))) for n in tokens] for d in dtypes}
        dram, dram_threads, dram_bytes = dram_read_bandwidth()
    params = 3 * hidden * intermediate
    best = min(dtypes, key=lambda d: times[d][0])
    wbytes = torch.finfo(getattr(torch, best)).bits // 8
    t1, tk = times[best]
    prof = HostProfile(hidden, intermediate, tokens, times, dram, cpu_mem_bandwidth=params * wbytes / t1,
                       cpu_flops=2.0 * params * tokens[1] / tk, dtype=best, threads=torch.get_num_threads(),
                       notes=f"calibrate_host on {torch.get_num_threads()} threads, torch {torch.__version__}; "
                             f"DRAM read on {dram_threads} threads (sl.estimate reads it: host='calibrated')",
                       dram_threads=dram_threads, dram_bytes=dram_bytes, cores=os.cpu_count() or 0,
                       cpu=platform.processor() or platform.machine())
    if save:
        profile_dir().mkdir(parents=True, exist_ok=True)
        write_atomic(profile_dir() / HOST_FILE, prof.to_json())  # a kill mid-save keeps the last calibration
    return prof


def host_profile(path: Path | None = None) -> HostProfile:
    """The saved host calibration (``calibrate_host()`` or ``specter-lab calibrate --host`` writes it)."""
    return HostProfile(**saved_host(path))
