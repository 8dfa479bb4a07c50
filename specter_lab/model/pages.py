"""Handing memory back to the OS once a pass is done with it: a mapped tensor's file pages, and the C heap's freed
holes.

A fused checkpoint's experts are mapped from the safetensors files (:mod:`.memory`: "mapped"); every page a pass
over them reads (the draft's quantizer reads all of them once) stays in the process's resident set until the
kernel needs the memory, which on a real-size model makes a mapped run look as big as a copied one (OLMoE-1B-7B:
12 GiB of expert pages after quantizing, ``docs/measured/real_checkpoint_olmoe.md``). ``madvise(MADV_PAGEOUT)``
(Linux ≥ 5.4) reclaims the range's clean file pages now; the next read pages them in again from the file. Only
ranges inside a file-backed mapping are advised: an anonymous tensor (a copy in RAM) is left alone, so this never
changes a value (``MADV_DONTNEED``, which would zero anonymous memory, is not used). Pages of a file written moments
ago are dirty until the kernel writes them back (about 30 s) and stay resident until then.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from functools import lru_cache

import torch

__all__ = ["release_file_pages", "file_backed", "trim_heap"]

_MADV_PAGEOUT = 21


@lru_cache(maxsize=1)
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def file_backed(t: torch.Tensor) -> str | None:
    """The file a CPU tensor's memory is mapped from (``/proc/self/maps``), or None (anonymous memory, another
    device, or not Linux)."""
    if t.device.type != "cpu" or t.numel() == 0 or not sys.platform.startswith("linux"):
        return None
    start, end = _span(t)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if lo <= start and end <= hi:
                    path = fields[5].strip() if len(fields) > 5 else ""
                    return path if fields[4] != "0" and path.startswith("/") else None
    except OSError:
        return None
    return None


def release_file_pages(t: torch.Tensor) -> int:
    """Reclaim the resident file pages under ``t`` when it is mapped from a file (module docstring); returns the
    bytes advised (0 when ``t`` is not file-backed or the OS lacks the call). Values are unchanged."""
    fn = _madvise()
    if fn is None or file_backed(t) is None:
        return 0
    start, end = _span(t)
    page = mmap.PAGESIZE
    lo, hi = start - start % page, -(-end // page) * page  # outward: still inside the same file mapping
    return hi - lo if fn(lo, hi - lo, _MADV_PAGEOUT) == 0 else 0


@lru_cache(maxsize=1)
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # glibc; absent under musl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim_heap() -> bool:
    """Return the C heap's free holes to the OS (glibc ``malloc_trim``; False where there is none).

    A pass that frees many mid-sized temporaries between long-lived allocations (the draft's quantizer: 16 MiB
    int32 codes per expert between each expert's 1 MiB packed weights) leaves holes glibc keeps: measured on four
    OLMoE-1B-7B-shaped layers, 1.06 GiB held for an 864 MiB draft, all of it returned by a trim."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False
