"""hqq imported with its ``torch.compile`` decorators made lazy, so a process that only builds or loads a model
does not import PyTorch's inductor.

transformers imports hqq's quantizer whenever hqq is installed (``transformers.cache_utils``: its quantized KV
cache), and hqq decorates methods with ``@torch.compile()`` when its classes are created, which imports inductor:
about 3.4 s of every process that builds a model on this machine (``python -X importtime``), for compiled forwards
specter_lab never calls (its drafts use hqq's quantizer and bit packing, not hqq's layers). Importing hqq once with
``torch.compile`` replaced by a decorator that compiles on first call keeps those methods' behaviour and moves the
cost to where it is paid, if ever.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

__all__ = ["import_hqq_lazily"]


def _lazy_compile(real: Callable) -> Callable:
    def compile_(fn: Callable | None = None, **options: Any) -> Callable:
        if fn is None:  # used as @torch.compile(...)
            return lambda f: compile_(f, **options)
        compiled = None

        @functools.wraps(fn)
        def first_call(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = real(fn, **options)
            return compiled(*args, **kwargs)

        return first_call

    return compile_


def import_hqq_lazily() -> None:
    """Import ``hqq.core.quantize`` (if hqq is installed and not imported yet) with lazy ``torch.compile``."""
    if "hqq.core.quantize" in sys.modules:
        return
    import torch

    real = torch.compile
    torch.compile = _lazy_compile(real)
    try:
        import hqq.core.quantize  # noqa: F401 - imported for its side effect: the classes exist, uncompiled
    except ImportError:  # hqq is a dependency, but a config-only tool still works without it
        pass
    finally:
        torch.compile = real
