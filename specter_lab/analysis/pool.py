"""A local process pool for replays: one worker per core, each started with what every task reads (a trace), so a
task sent to it is a few bytes. What the sweeps (``studies/runs.py``) and the estimate (``estimator/core.py``)
replay their cells and rows on."""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["cores", "start_method", "process_pool", "install", "installed"]


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def start_method() -> str:
    """``fork`` on Linux before Python 3.12 (workers start in milliseconds with everything imported); from 3.12,
    where forking a process with threads (torch's) is deprecated, ``forkserver`` with the package preloaded;
    ``spawn`` elsewhere (macOS, Windows)."""
    if sys.platform == "linux":
        return "fork" if sys.version_info < (3, 12) else "forkserver"
    return "spawn"


@contextmanager
def process_pool(workers: int | None = None, initializer: "Callable | None" = None, initargs: tuple = (),
                 method: str | None = None) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` processes (default one per core), each run ``initializer(*initargs)`` once."""
    ctx = multiprocessing.get_context(method or start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["specter_lab"])
    with ProcessPoolExecutor(workers or cores(), mp_context=ctx, initializer=initializer,
                             initargs=initargs) as pool:
        yield pool


def installed() -> Any:
    """What this worker was started with (None outside a pool's worker)."""
    return _INSTALLED


_INSTALLED: Any = None


def install(value: Any) -> None:
    """A worker's initializer: keep ``value`` for its tasks (read with :func:`installed`)."""
    global _INSTALLED
    _INSTALLED = value
