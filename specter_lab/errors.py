"""Typed errors: callers (the planner, ``compare``, the CLI) branch on the type, never on the message text.

Each one subclasses the built-in it used to be raised as (``ValueError``, ``RuntimeError``), so ``except
ValueError`` in user code keeps working; but an unrelated ``ValueError`` raised by a bug no longer reads as "this
candidate does not fit".
"""

from __future__ import annotations

__all__ = ["BudgetTooSmall", "CopyFault", "NotExact", "Diverged", "CheckpointError", "NotEnoughMemory", "TraceError",
           "ConfigError", "HostBudgetTooSmall", "OptionError", "DiskFull", "ResumeMismatch", "ResultsFileError"]

from typing import Any


def _rebuilt(cls: type, args: tuple, state: dict) -> BaseException:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class _Fields:
    """Errors with fields of their own pickle whole: a refusal raised in a worker of a process pool (the estimate's
    rows, a sweep's cells) reaches the parent as itself. (``BaseException`` pickles as ``cls(*args)``, which
    misses the fields' positional arguments and breaks the pool.)"""

    def __reduce__(self):
        return _rebuilt, (type(self), self.args, self.__dict__)


class BudgetTooSmall(_Fields, ValueError):
    """The expert budget cannot hold what the strategy needs (its draft plus one full-precision slot per layer).

    ``minimum_bytes`` is the smallest budget that would work and ``minimum_fraction`` the same as a fraction of
    the routed-expert bytes, so a table can say "does not fit (needs ≥ 0.31)" instead of failing."""

    def __init__(self, message: str, minimum_bytes: int, minimum_fraction: float) -> None:
        super().__init__(message)
        self.minimum_bytes = minimum_bytes
        self.minimum_fraction = minimum_fraction


class CopyFault(RuntimeError):
    """A host→device copy failed; the slot it targeted is left empty (never marked ready)."""


class NotExact(ValueError):
    """This model, cache kind or strategy cannot be run token-identical to HF ``generate``: refused before any
    generation starts (the message names the family, the layer kind and what does work)."""


class Diverged(RuntimeError):
    """``verify_lossless=True`` found committed tokens that differ from a plain greedy pass of the target: a bug
    in specter_lab, never an expected outcome (please report it with the model and strategy named here)."""


class CheckpointError(_Fields, ValueError):
    """A checkpoint folder that cannot be loaded as it is: a missing, truncated or corrupt shard, an index naming
    a file that is not there, a tensor whose shape disagrees with ``config.json``, a config that is not MoE.
    Raised before any weight is read. ``path`` is the file at fault, ``field`` the entry in it (a tensor name, a
    config key, ``"header"``), or None when the whole file is."""

    def __init__(self, message: str, path: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field


class NotEnoughMemory(_Fields, ValueError):
    """What a run would hold does not fit in the memory allowed: refused before anything is allocated.
    ``plan`` is the :class:`~specter_lab.model.memory.MemoryPlan` with every term, the allowance and the fixes."""

    def __init__(self, message: str, plan=None) -> None:
        super().__init__(message)
        self.plan = plan


class HostBudgetTooSmall(_Fields, ValueError):
    """``host_budget=`` (the disk tier's host expert cache) cannot hold one expert. ``budget_bytes`` is what was
    given, ``minimum_bytes`` one expert's bytes (the smallest that works)."""

    def __init__(self, message: str, budget_bytes: int, minimum_bytes: int) -> None:
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.minimum_bytes = minimum_bytes


class TraceError(ValueError):
    """A routing trace (a file, an array, a header field, its config) that cannot be used as it is: refused when it
    is read, before any model is built or any array allocated; the message names the file, the field, what was
    found and what would fit."""


class ConfigError(_Fields, ValueError):
    """A model config (``config.json``, a dict) with a field that no model can be built or sized from: refused
    before transformers builds anything. ``field`` names it ("" where transformers named none) and ``found`` holds
    the value (None where unknown); transformers' own validation errors arrive as this, the original chained."""

    def __init__(self, message: str, field: str = "", found: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.found = found


class OptionError(_Fields, ValueError):
    """A keyword option whose value is not one of its choices: refused before any work. ``argument`` names the
    option, ``found`` holds the value given and ``choices`` the values that work."""

    def __init__(self, message: str, argument: str, found: Any, choices: "tuple | list") -> None:
        super().__init__(message)
        self.argument = argument
        self.found = found
        self.choices = tuple(choices)


class DiskFull(OSError):
    """A file could not be written in full: the disk (or a quota) is full, or the process's file-size limit
    (``ulimit -f``) is below the file's size. Raised by every writer of the package (:mod:`specter_lab.atomic`)
    after it removed its temporary file, so whatever ``path`` held before is intact. ``path`` is the file asked
    for, ``needed_bytes`` the bytes it needs (a lower bound when the writer streams, ``needed_exact`` False),
    ``free_bytes`` what its folder's file system had free (None where unknown) and ``limit_bytes`` the
    file-size limit (None where there is none)."""

    def __init__(self, message: str, path: str, needed_bytes: int, free_bytes: "int | None" = None,
                 limit_bytes: "int | None" = None, needed_exact: bool = True, errno_: "int | None" = None) -> None:
        super().__init__(message)
        if errno_ is not None:
            self.errno = errno_
        self.filename = path
        self.path = path
        self.needed_bytes = needed_bytes
        self.needed_exact = needed_exact
        self.free_bytes = free_bytes
        self.limit_bytes = limit_bytes

    def __str__(self) -> str:  # OSError's own str would prefix "[Errno n]" and drop the message's fix
        return self.args[0]

    def __reduce__(self):  # errno and filename are OSError's own slots, not in __dict__: rebuilt from the fields
        return type(self), (self.args[0], self.path, self.needed_bytes, self.free_bytes, self.limit_bytes,
                            self.needed_exact, self.errno)


class ResumeMismatch(_Fields, ValueError):
    """A resumed run (``sl.record(..., out=, resume=True)``, ``sl.compare(..., results=)``) whose file on disk was
    written with other settings, another model or other prompts: refused before any work, never mixed in.
    ``path`` is the file, ``field`` the setting that differs (``"max_new_tokens"``, ``"model.weights"``,
    ``"prompt 2"``, ``"source"``, ...; ``"resume"`` where a file is there and resuming was not asked), ``found``
    what the file holds and ``expected`` what this call asked for."""

    def __init__(self, message: str, path: str, field: str, found: Any = None, expected: Any = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field
        self.found = found
        self.expected = expected


class ResultsFileError(_Fields, ValueError):
    """A results file (JSON Lines, one finished cell a line) that cannot be read as it is: a line other than the
    last that is not whole JSON or whose checksum does not match (a torn *last* line, what a kill leaves, is
    dropped instead). ``path`` is the file, ``line`` the 1-based line number (0: the file as a whole)."""

    def __init__(self, message: str, path: str, line: int) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
