"""A live run's steps on disk while it goes on (``sl.viz.live(..., out=path)``): a kernel that dies, a Stop or an
error keeps the steps done so far, whole.

The file is one JSON object, rewritten whole (:mod:`specter_lab.atomic`) every ``save_every`` steps and once when
the run ends: the prompt, the token ids committed so far, the run's ``steps`` and ``tokens`` frames (one record a
row, the columns of :data:`specter_lab.records.trace.COLUMNS`) and a ``status`` (``running`` while it goes on,
then ``done``, ``stopped`` or ``failed``). :func:`load_live` reads it back as frames.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..atomic import write_atomic
from ..errors import TraceError

__all__ = ["save_live", "load_live", "LiveFile", "LIVE_VERSION"]

LIVE_VERSION = 1
_KINDS = ("steps", "tokens")


@dataclass
class LiveFile:
    """What :func:`load_live` reads: the run's status, prompt, committed token ids and its steps and tokens
    frames so far."""

    status: str
    prompt: Any
    token_ids: list[int]
    steps: pd.DataFrame
    tokens: pd.DataFrame


def save_live(path: "str | Path", prompt: Any, token_ids: list[int], frames: dict, status: str) -> Path:
    """Write a live run's state to ``path``, whole (the file it replaces stays until this one is complete)."""
    doc = {"specter_lab_live": LIVE_VERSION, "status": status,
           "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
           "token_ids": [int(t) for t in token_ids],
           **{kind: json.loads(frames[kind].to_json(orient="records")) for kind in _KINDS}}
    return write_atomic(path, json.dumps(doc))


def load_live(path: "str | Path") -> LiveFile:
    """Read a file :func:`save_live` wrote (a :class:`TraceError` naming the file when it is not one)."""
    where = repr(str(path))
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{where} is not a live run's file ({type(exc).__name__}).") from None
    if not isinstance(doc, dict) or doc.get("specter_lab_live") != LIVE_VERSION:
        raise TraceError(f"{where}: not a version-{LIVE_VERSION} live run's file (sl.viz.live(..., out=) writes "
                         "them).")
    return LiveFile(doc["status"], doc["prompt"], doc["token_ids"],
                    *(pd.DataFrame.from_records(doc[kind]) for kind in _KINDS))
