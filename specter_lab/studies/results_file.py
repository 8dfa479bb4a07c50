"""A sweep's results on disk as it runs: one finished cell a line (JSON Lines), so a sweep stopped at cell 70 of 84
keeps the 70, and a rerun with the same file computes only the cells it lacks (``sl.compare(results=)``,
``specter-lab bench --results``, ``reproduce_paper(results=)``, ``paper_waterfall(results=)``,
``paper_equal_memory(results=)``).

The file (``docs/traces.md``, "Results files") is append-only. Its first line, written whole before any cell, is
the header: the sweep's kind and what every cell shares (the routing trace's fingerprint or the model's identity
and prompts, the settings that are not a grid axis). Every other line is one cell: its full settings (strategy,
hardware, budget, cost shape, K, draft, ...) and its result, exactly (floats as Python writes them, NaN and
infinities included). Every line carries a checksum of its content and is checked on read:

- a torn *last* line (what a kill during an append leaves) is dropped, and cut from the file before the next
  append;
- any other line that is not whole JSON or whose checksum does not match is refused as
  :class:`~specter_lab.errors.ResultsFileError` with its line number (a file edited by hand, or a disk fault:
  never guessed at);
- a header of another kind, version, trace, model, prompts or settings is refused as
  :class:`~specter_lab.errors.ResumeMismatch` naming the field (results of other settings are never mixed in).
  The grid itself may grow: a rerun with more strategies, profiles or budgets reuses the cells it shares.

Only the process that runs the sweep writes (cells finished on a pool's workers come back to it first), so one
writer appends at a time.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import append_line, write_atomic
from ..errors import ResultsFileError, ResumeMismatch

__all__ = ["ResultsFile", "open_results", "sweep_results", "canonical", "RESULTS_VERSION", "read_lines"]

RESULTS_VERSION = 1
_MAGIC = "specter_lab_results"


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data that names it fully and the same way every time: a dataclass as its type
    and fields, a tuple as a list, numpy scalars as Python's, a mapping with its keys as strings. What a cell's
    settings are compared by (``Cell``'s strategy and options, a profile, a draft)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic):
        return canonical(value.item())
    if isinstance(value, enum.Enum):
        return {"__enum__": type(value).__name__, "value": canonical(value.value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__,
                **{f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [canonical(v) for v in items]
    return {"__repr__": repr(value)}


def _key(cell: Any) -> str:
    return json.dumps(canonical(cell), sort_keys=True, separators=(",", ":"))


# ------------------------------------------------------------------ exact values (a result read back is the same)
def _encode(v: Any) -> Any:
    """A result as JSON that reads back as the same Python values: a dict with non-string keys and a tuple are
    tagged, numpy scalars become Python's (same value)."""
    if isinstance(v, np.generic):
        return _encode(v.item())
    if isinstance(v, dict):
        if all(isinstance(k, str) and k not in ("__items__", "__tuple__") for k in v):
            return {k: _encode(x) for k, x in v.items()}
        return {"__items__": [[_encode(k), _encode(x)] for k, x in v.items()]}
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x) for x in v]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"a result holds a {type(v).__name__} ({v!r:.80}); results files hold JSON values, numbers, "
                    "tuples and dicts")


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"__items__"}:
            return {_decode(k): _decode(x) for k, x in v["__items__"]}
        if set(v) == {"__tuple__"}:
            return tuple(_decode(x) for x in v["__tuple__"])
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def _sum(obj: dict) -> str:
    """The line's checksum: over its content with sorted keys (the line itself keeps a result's key order)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _line(obj: dict) -> str:
    return json.dumps({**obj, "sum": _sum(obj)}, separators=(",", ":"), allow_nan=True)


def read_lines(path: Path) -> "tuple[list[dict], int]":
    """The checked records of a results file and the byte length of its whole lines: a torn last line (no
    newline, not JSON, or a checksum that does not match) is left out; any other bad line is refused."""
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends in a newline, else a line the writer did not finish
    records, good = [], 0
    for i, line in enumerate(lines):
        rec = _parse(line)
        if rec is None:
            if i == len(lines) - 1 and not tail:
                break  # the last line, torn (cut inside a multi-byte character, or flipped at the end)
            raise ResultsFileError(f"{str(path)!r}, line {i + 1} of {len(lines) + bool(tail)}: not a whole "
                                   "results record (not JSON, or its checksum does not match): the file was "
                                   "changed by something other than specter_lab. Fix or delete that line, or "
                                   "start a new results file.", str(path), i + 1)
        records.append(rec)
        good += len(line) + 1
    return records, good


def _parse(line: bytes) -> "dict | None":
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or "sum" not in obj:
        return None
    body = {k: v for k, v in obj.items() if k != "sum"}
    return body if obj["sum"] == _sum(body) else None


# ------------------------------------------------------------------ the file
@dataclasses.dataclass
class ResultsFile:
    """One sweep's results file: the cells read from it (``cells``: canonical settings → result) and an append
    for each new one (:meth:`add`). Open it with :func:`open_results`."""

    path: Path
    kind: str
    identity: dict
    cells: dict = dataclasses.field(default_factory=dict)
    dropped_torn_line: bool = False

    def get(self, cell: Any) -> Any:
        """The stored result of ``cell`` (its settings, any JSON-able value), or None."""
        return self.cells.get(_key(cell))

    def __contains__(self, cell: Any) -> bool:
        return _key(cell) in self.cells

    def add(self, cell: Any, result: Any) -> None:
        """Append ``cell``'s result as one line (fsynced before this returns: a kill after it loses nothing)."""
        key = _key(cell)
        append_line(self.path, _line({"cell": json.loads(key), "result": _encode(result)}))
        self.cells[key] = result


def open_results(path: "str | Path", kind: str, identity: dict) -> ResultsFile:
    """The results file at ``path`` for a sweep of ``kind`` sharing ``identity`` (plain JSON data): read and
    checked when it exists (see the module docstring), created with its header when not."""
    path = Path(path)
    where = str(path)
    identity = canonical(identity)
    header = {_MAGIC: RESULTS_VERSION, "kind": kind, "identity": identity}
    if not path.exists() or path.stat().st_size == 0:
        write_atomic(path, _line(header) + "\n")  # the header whole before any cell
        return ResultsFile(path, kind, identity)
    if path.is_dir():
        raise ResultsFileError(f"results={where!r} is a folder: give a file name (e.g. results.jsonl).", where, 0)
    records, good = read_lines(path)
    if not records:
        raise ResultsFileError(f"{where!r} is not a specter_lab results file (no whole header line): give another "
                               "path, or delete it.", where, 1)
    head, cells = records[0], records[1:]
    if head.get(_MAGIC) is None:
        raise ResultsFileError(f"{where!r} is not a specter_lab results file (its first line is no results "
                               "header): give another path.", where, 1)
    _check_header(head, header, where)
    out = ResultsFile(path, kind, identity)
    for n, rec in enumerate(cells, start=2):
        if "cell" not in rec or "result" not in rec:
            raise ResultsFileError(f"{where!r}, line {n}: a results line holds 'cell' and 'result'.", where, n)
        out.cells[_key(rec["cell"])] = _decode(rec["result"])
    if good < path.stat().st_size:  # a torn last line: cut it (whole-file rewrite) so the next append starts clean
        write_atomic(path, path.read_bytes()[:good])
        out.dropped_torn_line = True
    return out


def _check_header(found: dict, want: dict, where: str) -> None:
    if found.get(_MAGIC) != RESULTS_VERSION:
        raise ResumeMismatch(f"{where!r} is a version-{found.get(_MAGIC)!r} results file; this specter_lab writes "
                             f"version {RESULTS_VERSION}: start a new file.", where, "version",
                             found.get(_MAGIC), RESULTS_VERSION)
    if found.get("kind") != want["kind"]:
        raise ResumeMismatch(f"{where!r} holds the results of a {found.get('kind')!r} sweep, not "
                             f"{want['kind']!r}: give that sweep's own file.", where, "kind", found.get("kind"),
                             want["kind"])
    for field, expected in _flat(want["identity"]):
        got = _get(found.get("identity"), field)
        if got != expected and not _both_nan(got, expected):
            raise ResumeMismatch(f"{where!r} was written by a sweep with {field}={_short(got)} and this one has "
                                 f"{field}={_short(expected)}: its cells are not this sweep's. Rerun with the "
                                 "file's settings, or give another results file.", where, field, got, expected)
    extra = [f for f, _ in _flat(found.get("identity") or {}) if _get(want["identity"], f) is None
             and _get(found.get("identity"), f) is not None]
    if extra:
        got = _get(found["identity"], extra[0])
        raise ResumeMismatch(f"{where!r} was written by a sweep with {extra[0]}={_short(got)}, which this one does "
                             "not set: its cells are not this sweep's.", where, extra[0], got, None)


def _flat(d: Any, prefix: str = ""):
    """``("source.trace", value)`` pairs of a nested mapping (a dataclass's canonical form is one value)."""
    if not isinstance(d, dict) or "__type__" in d or not d:
        yield prefix.rstrip("."), d
        return
    for k, v in d.items():
        yield from _flat(v, f"{prefix}{k}.")


def _get(d: Any, dotted: str) -> Any:
    if dotted == "":
        return d
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def _both_nan(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def _short(v: Any) -> str:
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def sweep_results(path: "str | Path | None", kind: str, source, settings: dict) -> "ResultsFile | None":
    """The results file of a sweep of ``kind`` on ``source`` (a :class:`~.runs.TraceSource` or
    :class:`~.runs.LiveSource`: its ``identity()``) with ``settings`` (what is not a grid axis), or None
    without a path."""
    if path is None:
        return None
    return open_results(path, kind, {"source": source.identity(), "settings": settings})
