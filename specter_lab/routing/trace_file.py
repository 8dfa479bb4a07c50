"""RoutingTrace: a run's routing, recorded once (or imported), so that every strategy can be replayed from it.

One file holds, per prompt: the prompt and its greedy continuation; the target's routing of the prefill and of
every autoregressive decode step (with the gate-lookahead predictions where recorded); and, for every window
start, the draft's chain of ``k_max`` tokens with its routing and the target's routing and argmax over that
chain (verification is causal, so one pass serves every K ≤ k_max). It carries the model's config, so a trace
prices itself. The format (``docs/traces.md``) is one ``.npz`` (numpy, no pickle) with a JSON header; a file of
another version, a truncated or corrupt one, or arrays that do not fit the config get an error naming the field.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RoutingTrace", "RoutedSequence", "load_trace", "TRACE_VERSION", "TraceError"]

TRACE_VERSION = 1
_ARRAYS = ("prompt", "tokens", "prefill", "decode", "gate", "draft_tokens", "draft_routing", "verify_routing",
           "verify_tokens")


class TraceError(ValueError):
    """A routing trace (a file, an array, a config) that cannot be used as it is; the message names the field."""


@dataclass
class RoutedSequence:
    """One prompt's recorded routing. Shapes: P prompt tokens, N generated, L MoE layers, k = max top-k (ids,
    -1 = not recorded), W = N - 1 window starts (positions P .. P+N-2), K = k_max.

    * ``prompt [P]``, ``tokens [N]``: the prompt and its greedy continuation;
    * ``prefill [P, L, k]``: the target's routing of the prefill forward;
    * ``decode [N-1, L, k]``: the target's routing of each autoregressive decode forward (one token each);
    * ``gate [P + N-1, L, k]`` or None: layer l+1's router applied to layer l's input, per token of those
      forwards (row l of the last layer unused): what gate lookahead prefetches;
    * ``draft_tokens [W, K]``, ``draft_routing [W, K, L, k]``: the draft's greedy chain from each window start;
    * ``verify_routing [W, K+1, L, k]``, ``verify_tokens [W, K+1]``: the target's routing and argmax over
      ``[last, d1..dK]`` of each chain.
    """

    prompt: np.ndarray
    tokens: np.ndarray
    prefill: np.ndarray
    decode: np.ndarray
    gate: np.ndarray | None = None
    draft_tokens: np.ndarray | None = None
    draft_routing: np.ndarray | None = None
    verify_routing: np.ndarray | None = None
    verify_tokens: np.ndarray | None = None

    @property
    def speculative(self) -> bool:
        return self.draft_tokens is not None


@dataclass
class RoutingTrace:
    """Recorded (or imported) routing of one model over some prompts; see the module docstring.

    ``config``: the model's config as a dict (``transformers`` ``to_dict()``): it sizes and prices the replay.
    ``source``: where the routing came from (recorded: model, device, draft; or imported), stated in every
    output made from it. ``draft``: the draft it was recorded with (``{"bits", "group_size", "method"}``), or
    ``{"modeled": {...}}`` for an imported trace's modeled draft."""

    config: dict[str, Any]
    sequences: list[RoutedSequence]
    k_max: int = 0
    draft: dict[str, Any] | None = None
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ shape
    @property
    def num_layers(self) -> int:
        return int(self.sequences[0].prefill.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.sequences[0].prefill.shape[2])

    @property
    def speculative(self) -> bool:
        """True when every sequence has draft chains (speculative strategies can replay)."""
        return all(s.speculative for s in self.sequences)

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    def __repr__(self) -> str:
        return (f"RoutingTrace({self.config.get('model_type', '?')}, {len(self.sequences)} sequences, "
                f"{self.tokens} tokens, {self.num_layers} MoE layers, top-{self.top_k}, k_max={self.k_max}, "
                f"source={self.source!r})")

    # ------------------------------------------------------------------ checks
    def validate(self, num_experts: "list[int] | None" = None) -> "RoutingTrace":
        """Raise :class:`TraceError` naming the field if an array does not fit the others or the config."""
        if not self.sequences:
            raise TraceError("trace has no sequences: record or import at least one.")
        L, k = self.num_layers, self.top_k
        for i, s in enumerate(self.sequences):
            where = f"sequence {i}"
            _check_ids(s.prompt, f"{where}.prompt", 1)
            _check_ids(s.tokens, f"{where}.tokens", 1)
            if len(s.prompt) == 0 or len(s.tokens) == 0:
                raise TraceError(f"{where}: an empty prompt or continuation: nothing to replay.")
            n, p = len(s.tokens), len(s.prompt)
            _check_routing(s.prefill, f"{where}.prefill", (p, L, k), num_experts)
            _check_routing(s.decode, f"{where}.decode", (n - 1, L, k), num_experts)
            if s.gate is not None:
                _check_routing(s.gate, f"{where}.gate", (p + n - 1, L, None), None)
            chains = [s.draft_tokens, s.draft_routing, s.verify_routing, s.verify_tokens]
            if any(c is not None for c in chains):
                if any(c is None for c in chains):
                    raise TraceError(f"{where}: draft_tokens, draft_routing, verify_routing and verify_tokens "
                                     "come together (a speculative recording): some are missing.")
                K = self.k_max
                _check_ids(s.draft_tokens, f"{where}.draft_tokens", 2, (n - 1, K))
                _check_ids(s.verify_tokens, f"{where}.verify_tokens", 2, (n - 1, K + 1))
                _check_routing(s.draft_routing, f"{where}.draft_routing", (n - 1, K, L, k), num_experts)
                _check_routing(s.verify_routing, f"{where}.verify_routing", (n - 1, K + 1, L, k), num_experts)
        return self

    # ------------------------------------------------------------------ file
    def save(self, path: "str | Path") -> Path:
        """Write the trace as one compressed ``.npz`` (numpy arrays + a JSON header; no pickle)."""
        self.validate()
        path = Path(path)
        header = {"version": TRACE_VERSION, "config": self.config, "k_max": self.k_max, "draft": self.draft,
                  "source": self.source, "meta": self.meta, "sequences": len(self.sequences)}
        arrays: dict[str, np.ndarray] = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
        for i, s in enumerate(self.sequences):
            for name in _ARRAYS:
                a = getattr(s, name)
                if a is not None:
                    arrays[f"s{i}.{name}"] = a
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)
        return path


def load_trace(path: "str | Path") -> RoutingTrace:
    """Read a trace written by :meth:`RoutingTrace.save` (or ``specter-lab trace record``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file {str(path)!r} does not exist: record one with "
                                "sl.record(...).save(path) or `specter-lab trace record`.")
    data = read_npz(path, "is not a readable routing trace", "Record it again.")
    if "header" not in data:
        raise TraceError(f"{str(path)!r} has no header: not a specter_lab routing trace.")
    try:
        header = json.loads(data.pop("header").tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{str(path)!r}: its header is corrupt ({exc}). Record it again.") from None
    version = header.get("version")
    if version != TRACE_VERSION:
        raise TraceError(f"{str(path)!r} is a version-{version} trace; this specter_lab reads version "
                         f"{TRACE_VERSION}. Record it again with this version (docs/traces.md lists the changes).")
    seqs = []
    for i in range(int(header.get("sequences", 0))):
        got = {name: data.get(f"s{i}.{name}") for name in _ARRAYS}
        for name in ("prompt", "tokens", "prefill", "decode"):
            if got[name] is None:
                raise TraceError(f"{str(path)!r}: sequence {i} has no {name!r} array (truncated?). Record it again.")
        seqs.append(RoutedSequence(**got))
    trace = RoutingTrace(header.get("config") or {}, seqs, int(header.get("k_max", 0)), header.get("draft"),
                         header.get("source", ""), header.get("meta") or {})
    return trace.validate()


def read_npz(path: Path, what: str, fix: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz``, without pickle; a truncated, corrupt or pickled file is a :class:`TraceError`
    that says ``{path} {what} (...). {fix}``."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise TraceError(f"{str(path)!r} {what} (truncated or corrupt, or holds pickled objects: {exc}). "
                         f"{fix}") from None


def _check_ids(a, name: str, ndim: int, shape: tuple | None = None) -> None:
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        raise TraceError(f"{name}: expected an integer array, got "
                         f"{getattr(a, 'dtype', type(a).__name__)}. Token ids are integers.")
    if a.ndim != ndim or (shape is not None and a.shape != shape):
        raise TraceError(f"{name}: shape {a.shape}, expected {shape if shape is not None else f'{ndim} dims'}.")


def _check_routing(a, name: str, shape: tuple, num_experts: "list[int] | None") -> None:
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        raise TraceError(f"{name}: expected an integer array of expert ids, got "
                         f"{getattr(a, 'dtype', type(a).__name__)}. Convert it with .astype(int).")
    if a.ndim != len(shape) or any(want is not None and got != want for got, want in zip(a.shape, shape)):
        raise TraceError(f"{name}: shape {a.shape}, expected {tuple('any' if s is None else s for s in shape)} "
                         "(tokens, [chain,] MoE layers, top-k).")
    if a.size and a.min() < -1:
        raise TraceError(f"{name}: expert id {int(a.min())} < -1 (use -1 for 'not recorded').")
    if num_experts is not None and a.size:
        per_layer = np.asarray(num_experts)
        over = a >= per_layer.reshape((1,) * (a.ndim - 2) + (-1, 1))
        if over.any():
            layer = int(np.argwhere(over)[0][-2])
            raise TraceError(f"{name}: expert id {int(a[over].max())} at MoE layer {layer}, but that layer has "
                             f"{int(per_layer[layer])} experts (ids 0..{int(per_layer[layer]) - 1}): the trace "
                             "does not belong to this config.")
