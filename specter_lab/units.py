"""Byte sizes and expert budgets: one parser for every entry point (Engine, compare, the CLI's flags).

A budget is a fraction in (0, 1] of the routed experts' full-precision bytes, a byte count (> 1), or a size
string such as ``"2GiB"``. The fraction is resolved against the model only when the model is known.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Budget", "parse_budget", "parse_bytes", "format_bytes", "budget_from_text", "Handle"]

# A point on a clock: float seconds on the simulated clock, a torch.cuda.Event on the CUDA one. The one alias the
# clock, the trace and the tally share (it lives here, on the lowest floor, so none imports another for it).
Handle = Any

_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 1024, "mib": 1024**2, "gib": 1024**3,
          "tib": 1024**4}
_DECIMAL = {"kb": "kib", "mb": "mib", "gb": "gib", "tb": "tib"}  # a memory's label, read as its binary size
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_bytes(text: str, name: str = "expert_budget", binary: bool = False) -> int:
    """'2GiB' / '512 MB' / '1.5e9' → bytes. Raises ValueError naming ``name`` and the accepted forms.

    ``binary``: read the decimal units as binary too ('12GB' = 12 GiB): how a memory's size is labelled (a card
    sold as 12 GB holds 12,288 MiB, and a user typing their card's or their RAM's size means that)."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS and unit != "":
        raise ValueError(f"{name}={text!r} is not a size. Use bytes as a number or a string like '2GiB', "
                         f"'512MiB', '1.5GB', or a fraction in (0, 1] of the routed-expert bytes.")
    if binary and unit in _DECIMAL:
        unit = _DECIMAL[unit]
    value = float(m.group(1)) * (_UNITS[unit] if unit else 1)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={text!r} must be a positive size.")
    return int(value)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n}"


@dataclass(frozen=True)
class Budget:
    """A validated expert budget: exactly one of ``fraction`` and ``nbytes`` is set. ``given`` is the value as
    the caller wrote it (error messages quote it)."""

    given: object
    fraction: float | None = None
    nbytes: int | None = None

    def resolve(self, full_bytes: int) -> int:
        """Bytes of this budget for a model whose routed experts take ``full_bytes`` in full precision."""
        return int(self.fraction * full_bytes) if self.fraction is not None else int(self.nbytes)


def parse_budget(value: "float | int | str", name: str = "expert_budget") -> Budget:
    """Validate a budget before any work is done; see the module docstring for the accepted forms."""
    if isinstance(value, str):
        return Budget(value, nbytes=parse_bytes(value, name))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: use a fraction in (0, 1], a byte count, or '2GiB'.")
    if isinstance(value, float) and value <= 1.0:
        if value <= 0:
            raise ValueError(f"{name}={value!r}: a fraction must be in (0, 1].")
        return Budget(value, fraction=float(value))
    if value <= 1:
        raise ValueError(f"{name}={value!r}: a fraction must be in (0, 1]; a byte count > 1.")
    return Budget(value, nbytes=int(value))


def budget_from_text(text: str) -> "float | int | str":
    """A command-line budget: '0.5' → 0.5 (a fraction), '3e9' → 3000000000 (bytes), '2GiB' stays a string. The
    value is then validated by :func:`parse_budget` like any other."""
    try:
        v = float(text)
    except ValueError:
        return text
    return v if v <= 1 else int(v)
