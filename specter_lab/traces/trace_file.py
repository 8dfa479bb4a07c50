"""RoutingTrace: a run's routing, recorded once (or imported), so that every strategy can be replayed from it.

One file holds, per prompt: the prompt and its greedy continuation; the target's routing of the prefill and of
every autoregressive decode step (with the gate-lookahead predictions where recorded); and, for every window
start, the draft's chain of ``k_max`` tokens with its routing and the target's routing and argmax over that
chain (verification is causal, so one pass serves every K ≤ k_max). It carries the model's config, so a trace
prices itself. The format (``docs/traces.md``) is one ``.npz`` (numpy, no pickle) with a JSON header; a file of
another version, a truncated or corrupt one, or arrays that do not fit the config get an error naming the field.
"""

from __future__ import annotations

import hashlib
import io
import json
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_atomic
from ..errors import TraceError
from .npz import NpzArchive, read_npz

__all__ = ["RoutingTrace", "RoutedSequence", "load_trace", "TRACE_VERSION", "TraceError", "read_npz", "TraceSpec"]

TRACE_VERSION = 1
_ARRAYS = ("prompt", "tokens", "prefill", "decode", "gate", "draft_tokens", "draft_routing", "verify_routing",
           "verify_tokens")

_TOKENS = ("prompt", "tokens", "draft_tokens", "verify_tokens")
_CHAINS = ("draft_tokens", "draft_routing", "verify_routing", "verify_tokens")
MAX_K_MAX = 256  # the longest draft window a trace may hold (K=16 is the paper's largest)
MAX_SEQUENCES = 65_536
_HEADER_FIELDS = {"version", "config", "k_max", "draft", "source", "meta", "sequences"}


@dataclass(frozen=True)
class TraceSpec:
    """What a trace's arrays must fit, from its config's model: expert count and top-k per MoE layer, the
    vocabulary and the EOS ids (an EOS inside a continuation would end a replay early)."""

    num_experts: list[int]
    top_k: list[int]
    vocab: int
    eos: frozenset = frozenset()

    @property
    def num_layers(self) -> int:
        return len(self.num_experts)

    @classmethod
    def of(cls, info) -> "TraceSpec":
        return cls([l.num_experts for l in info.layers], [l.top_k for l in info.layers], int(info.vocab),
                   frozenset(info.eos_token_ids))


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

    def drafts(self, w: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The draft's chain from window start ``w``: tokens ``[K]`` and routing ``[K, L, k]`` (at least ``n``
        long: a sequence drafted on demand holds only what was asked)."""
        return self.draft_tokens[w], self.draft_routing[w]

    def verification(self, w: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The target's routing ``[K+1, L, k]`` and argmax ``[K+1]`` over ``[last, d1..dK]`` from window start
        ``w`` (at least ``t`` rows)."""
        return self.verify_routing[w], self.verify_tokens[w]


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
    def gated(self) -> bool:
        """True when every sequence holds gate-lookahead predictions (``prefetch="gate"`` strategies can replay)."""
        return all(s.gate is not None for s in self.sequences)

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    def target_rows(self) -> "tuple[np.ndarray, list[tuple[int, int, str]]]":
        """The target routing of every sequence as one array ``[rows, MoE layers, top_k]`` (each sequence's prefill
        rows, then its decode rows) and its ``(start, length, phase)`` segments: what :func:`sl.import_routing
        <specter_lab.traces.importing.import_routing>` takes, e.g. to re-import a recording with a modelled draft
        or gate predictions, or after :func:`sl.less_local <specter_lab.traces.locality.less_local>`."""
        rows, segs, start = [], [], 0
        for s in self.sequences:
            rows += [s.prefill, s.decode]
            segs += [(start, len(s.prefill), "prefill"), (start + len(s.prefill), len(s.decode), "decode")]
            start += len(s.prefill) + len(s.decode)
        return np.concatenate(rows), segs

    def fingerprint(self) -> str:
        """SHA-256 (16 hex digits) of everything a replay reads: the config, ``k_max``, the draft, the source and
        every sequence's arrays (names, dtypes, shapes, bytes); not ``meta`` (timings). Two traces with the same
        fingerprint replay the same; a results file of a sweep (``compare(results=)``) is tied to it."""
        h = hashlib.sha256(json.dumps([self.config, self.k_max, self.draft, self.source], sort_keys=True,
                                      default=str).encode())
        for i, s in enumerate(self.sequences):
            for name in _ARRAYS:
                a = getattr(s, name)
                if a is not None:
                    a = np.ascontiguousarray(a)
                    h.update(f"{i}.{name}|{a.dtype.str}|{a.shape}\n".encode())
                    h.update(a.tobytes())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"RoutingTrace({self.config.get('model_type', '?')}, {len(self.sequences)} sequences, "
                f"{self.tokens} tokens, {self.num_layers} MoE layers, top-{self.top_k}, k_max={self.k_max}, "
                f"source={self.source!r})")

    # ------------------------------------------------------------------ checks
    def validate(self, num_experts: "list[int] | None" = None, spec: "TraceSpec | None" = None) -> "RoutingTrace":
        """Raise :class:`TraceError` naming the field if an array does not fit the others or the config
        (``spec``: the config's model; ``num_experts`` alone: expert ids per MoE layer)."""
        key = self._passed_key(num_experts) if spec is None else None
        if key is not None and key == _PASSED.get(id(self)):
            return self
        if not self.sequences:
            raise TraceError("trace has no sequences: record or import at least one.")
        if isinstance(self.k_max, bool) or not isinstance(self.k_max, int) or not 0 <= self.k_max <= MAX_K_MAX:
            raise TraceError(f"k_max: found {self.k_max!r}; an integer in [0, {MAX_K_MAX}].")
        if spec is not None:
            num_experts = spec.num_experts
        for i, s in enumerate(self.sequences):
            if not isinstance(s.prefill, np.ndarray) or s.prefill.ndim != 3:
                raise TraceError(f"sequence {i}.prefill: expected an integer array [prompt, MoE layers, top-k], got "
                                 f"{getattr(s.prefill, 'shape', type(s.prefill).__name__)}.")
        L, k = (spec.num_layers, max(spec.top_k)) if spec is not None else (self.num_layers, self.top_k)
        if num_experts is not None and len(num_experts) != L:
            raise TraceError(f"trace has {L} MoE layers, its config's model {len(num_experts)}: the config is of "
                             "another model.")
        for i, s in enumerate(self.sequences):
            _check_sequence(s, f"sequence {i}", L, k, self.k_max, num_experts, spec)
        if key is not None:
            _passed(self, key)
        return self

    def _passed_key(self, num_experts) -> tuple | None:
        """What :meth:`validate` remembers passing: the expert counts and :meth:`fingerprint` (an edit in place
        changes it); None where a field is not an array (the checks say what is wrong)."""
        if not all(isinstance(a, np.ndarray) for s in self.sequences for a in (getattr(s, n, None) for n in _ARRAYS)
                   if a is not None):
            return None
        return (tuple(num_experts) if num_experts is not None else None, self.fingerprint())

    # ------------------------------------------------------------------ file
    def save(self, path: "str | Path") -> Path:
        """Write the trace as one compressed ``.npz`` (numpy arrays + a JSON header; no pickle), whole or not at
        all (:mod:`specter_lab.atomic`): a kill or a full disk leaves the file that was there before."""
        self.validate()
        path = Path(path)
        if not isinstance(self.config, dict) or not isinstance(self.meta, dict):
            raise TraceError("config and meta: dicts (JSON objects) are what a trace file holds.")
        header = {"version": TRACE_VERSION, "config": self.config, "k_max": self.k_max, "draft": self.draft,
                  "source": self.source, "meta": self.meta, "sequences": len(self.sequences)}
        arrays: dict[str, np.ndarray] = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
        for i, s in enumerate(self.sequences):
            for name in _ARRAYS:
                a = getattr(s, name)
                if a is not None:
                    arrays[f"s{i}.{name}"] = a
        buf = io.BytesIO()  # built in memory: its size is known, so a disk too small is refused before writing
        np.savez_compressed(buf, **arrays)
        write_atomic(path, buf.getbuffer())  # whole or not at all: a kill never leaves half a trace, nor loses the old
        return path

    def export(self, path: "str | Path", format: str | None = None) -> Path:
        """Write the target routing (prefill and decode of every sequence) in an engine's format: ``"vllm"``
        (``.npz`` of ``prompt_routed_experts`` / ``routed_experts`` per sequence), ``"llama_csv"`` (the moe-trace
        CSV), ``"jsonl"`` (a line per token and layer) or ``"sglang"`` (``.json``: a ``/generate`` response's
        ``meta_info`` per sequence); default from the suffix (``docs/traces.md``)."""
        from .formats import write_routing

        return write_routing(self, path, format)


def load_trace(path: "str | Path") -> RoutingTrace:
    """Read a trace written by :meth:`RoutingTrace.save` (or ``specter-lab trace record``). Everything a replay
    would refuse is refused here, before any array is allocated: the header's fields and types, its config (with
    the field named, :mod:`specter_lab.model.config_check`), every array's shape and dtype against the config's
    model and the other arrays (from the ``.npy`` headers), then the values (expert ids per layer, token ids in
    the vocabulary, no EOS inside a continuation). A refusal is a :class:`TraceError`; the file is closed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file {str(path)!r} does not exist: record one with "
                                "sl.record(...).save(path) or `specter-lab trace record`.")
    where = repr(str(path))
    with NpzArchive(path, "is not a readable routing trace", "Record it again.") as z:
        header = _read_header(z, where)
        fields = _header_fields(header, where)
        spec = _spec_of(fields["config"], where)
        shapes = _expected_shapes(z, fields, spec, where)
        seqs = [RoutedSequence(**{name: z.read(f"s{i}.{name}") if name in got else None for name in _ARRAYS})
                for i, got in enumerate(shapes)]
    trace = RoutingTrace(fields["config"], seqs, fields["k_max"], fields["draft"], fields["source"], fields["meta"])
    try:
        return trace.validate(spec=spec)
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None


_MAX_HEADER_BYTES = 16 * 2**20


def _read_header(z: NpzArchive, where: str) -> dict:
    h = z.arrays.get("header")
    if h is None:
        raise TraceError(f"{where} has no header: not a specter_lab routing trace.")
    if h.dtype != np.uint8 or len(h.shape) != 1 or h.shape[0] > _MAX_HEADER_BYTES:
        raise TraceError(f"{where}: header is {h.dtype} {h.shape}; a trace's header is UTF-8 JSON bytes (uint8, "
                         f"at most {_MAX_HEADER_BYTES} bytes). Record it again.")
    try:
        header = json.loads(z.read("header").tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise TraceError(f"{where}: its header is corrupt ({type(exc).__name__}). Record it again.") from None
    if not isinstance(header, dict):
        raise TraceError(f"{where}: header is a JSON {type(header).__name__}; a trace's header is an object. "
                         "Record it again.")
    return header


def _header_fields(header: dict, where: str) -> dict:
    """The header's fields, each of the type the trace needs, or a TraceError naming it."""
    version = header.get("version")
    if version != TRACE_VERSION or isinstance(version, bool):
        raise TraceError(f"{where} is a version-{version!r} trace; this specter_lab reads version "
                         f"{TRACE_VERSION}. Record it again with this version (docs/traces.md lists the changes).")
    unknown = sorted(set(header) - _HEADER_FIELDS)
    if unknown:
        raise TraceError(f"{where}: header has unknown fields {unknown[:5]}; a version-{TRACE_VERSION} header holds "
                         f"{sorted(_HEADER_FIELDS)}.")
    n = header.get("sequences")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEQUENCES:
        raise TraceError(f"{where}: header.sequences: found {n!r}; the number of recorded sequences, an integer in "
                         f"[1, {MAX_SEQUENCES}]" + (" (this trace has no sequences)." if n == 0 else "."))
    k_max = header.get("k_max", 0)
    if isinstance(k_max, bool) or not isinstance(k_max, int) or not 0 <= k_max <= MAX_K_MAX:
        raise TraceError(f"{where}: header.k_max: found {k_max!r}; the draft window the chains hold, an integer in "
                         f"[0, {MAX_K_MAX}].")
    config = header.get("config")
    if not isinstance(config, dict):
        raise TraceError(f"{where}: header.config: found {type(config).__name__}; the model's config as a JSON "
                         "object (config.to_dict()).")
    source, meta = header.get("source", ""), header.get("meta", {})
    if not isinstance(source, str):
        raise TraceError(f"{where}: header.source: found {type(source).__name__}; a sentence (string).")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise TraceError(f"{where}: header.meta: found {type(meta).__name__}; a JSON object.")
    return {"sequences": n, "k_max": k_max, "config": config, "source": source, "meta": meta,
            "draft": _draft_field(header.get("draft"), where)}


def _draft_field(draft, where: str):
    """None, or ``{bits, group_size, method}`` a replay can price (plus ``modeled`` for an import)."""
    if draft is None:
        return None
    if not isinstance(draft, dict):
        raise TraceError(f"{where}: header.draft: found {type(draft).__name__}; null or "
                         "{\"bits\", \"group_size\", \"method\"}.")
    if "bits" in draft or "group_size" in draft or "method" in draft:
        from ..run.quant import QuantSpec

        try:
            QuantSpec(draft.get("bits"), draft.get("group_size"), draft.get("method"))
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{where}: header.draft: {exc}") from None
    modeled = draft.get("modeled")
    if modeled is not None and not isinstance(modeled, dict):
        raise TraceError(f"{where}: header.draft.modeled: found {type(modeled).__name__}; a JSON object.")
    return draft


def _spec_of(config: dict, where: str) -> TraceSpec:
    """The config's model (built on the meta device, no memory) as a :class:`TraceSpec`, or a TraceError naming
    the config's field."""
    from ..errors import ConfigError

    try:
        return _spec_cached(json.dumps(config, sort_keys=True))
    except ConfigError as exc:
        raise TraceError(f"{where}: {exc}") from exc
    except (TypeError, ValueError) as exc:  # not JSON-serialisable, or a model without MoE layers
        raise TraceError(f"{where}: header.config describes no mixture-of-experts model a replay can size "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}).") from None


@lru_cache(maxsize=8)
def _spec_cached(config_json: str) -> TraceSpec:
    from ..model.skeleton import skeleton_info

    return TraceSpec.of(skeleton_info(json.loads(config_json), "header.config"))


def _expected_shapes(z: NpzArchive, fields: dict, spec: TraceSpec, where: str) -> list[set]:
    """Check every array's dtype and shape (from its .npy header, nothing read) against the config's model and the
    sequence's prompt and continuation lengths; the names present per sequence."""
    n, K = fields["sequences"], fields["k_max"]
    L, k = spec.num_layers, max(spec.top_k)
    known = {"header"} | {f"s{i}.{a}" for i in range(n) for a in _ARRAYS}
    unknown = sorted(set(z.arrays) - known)
    if unknown:
        raise TraceError(f"{where}: arrays {unknown[:4]} are not in a {n}-sequence trace (header.sequences={n}; "
                         f"per sequence i: s<i>.{{{', '.join(_ARRAYS)}}}).")
    present = []
    for i in range(n):
        got = {a: z.arrays[f"s{i}.{a}"] for a in _ARRAYS if f"s{i}.{a}" in z.arrays}
        for a in ("prompt", "tokens", "prefill", "decode"):
            if a not in got:
                raise TraceError(f"{where}: sequence {i} has no {a!r} array (truncated?). Record it again.")
        for a, h in got.items():
            if h.dtype.kind not in "iu":
                raise TraceError(f"{where}: sequence {i}.{a}: dtype {h.dtype}; ids are integers.")
        P = got["prompt"].shape[0] if len(got["prompt"].shape) == 1 else -1
        N = got["tokens"].shape[0] if len(got["tokens"].shape) == 1 else -1
        if P < 1 or N < 1:
            bad = "prompt" if P < 1 else "tokens"
            raise TraceError(f"{where}: sequence {i}.{bad}: shape {got[bad].shape}; a non-empty 1-d array of token "
                             "ids.")
        W = N - 1
        want = {"prompt": (P,), "tokens": (N,), "prefill": (P, L, k), "decode": (W, L, k), "gate": (P + W, L, k),
                "draft_tokens": (W, K), "draft_routing": (W, K, L, k), "verify_routing": (W, K + 1, L, k),
                "verify_tokens": (W, K + 1)}
        chains = [a for a in _CHAINS if a in got]
        if chains and len(chains) != len(_CHAINS):
            raise TraceError(f"{where}: sequence {i}: draft_tokens, draft_routing, verify_routing and verify_tokens "
                             f"come together (a speculative recording): it holds only {chains}.")
        if chains and K < 1:
            raise TraceError(f"{where}: sequence {i} has draft chains but header.k_max is 0; k_max is their length.")
        for a, h in got.items():
            if h.shape != want[a]:
                raise TraceError(f"{where}: sequence {i}.{a}: shape {h.shape}, expected {want[a]} (P={P} prompt "
                                 f"tokens, N={N} generated, {L} MoE layers, top-{k}, k_max={K}).")
        present.append(set(got))
    return present


# What validate() last passed, per trace: (its expert counts, its fingerprint), so a sweep that replays one
# trace many times checks it once (every replay validates; the checks were ~7 % of a replay). Kept here, not in a
# field, so ``RoutingTrace(**vars(t))`` still copies a trace; an entry goes with its trace.
_PASSED: dict[int, tuple] = {}


def _passed(trace: RoutingTrace, key: tuple) -> None:
    if id(trace) not in _PASSED:
        weakref.finalize(trace, _PASSED.pop, id(trace), None)
    _PASSED[id(trace)] = key


def _check_sequence(s: RoutedSequence, where: str, L: int, k: int, K: int, num_experts, spec) -> None:
    """Shapes and values of one sequence (see :meth:`RoutingTrace.validate`)."""
    vocab = spec.vocab if spec is not None else None
    for name in ("prompt", "tokens"):
        _check_ids(getattr(s, name), f"{where}.{name}", 1, vocab=vocab)
    if len(s.prompt) == 0 or len(s.tokens) == 0:
        raise TraceError(f"{where}: an empty prompt or continuation: nothing to replay.")
    n, p = len(s.tokens), len(s.prompt)
    if spec is not None and spec.eos and n > 1:
        inside = np.isin(s.tokens[:-1], list(spec.eos))
        if inside.any():
            j = int(np.argmax(inside))
            raise TraceError(f"{where}.tokens: EOS id {int(s.tokens[j])} at position {j} of {n}; a recorded "
                             "continuation ends at its first EOS (a replay would stop there).")
    _check_routing(s.prefill, f"{where}.prefill", (p, L, k), num_experts)
    _check_routing(s.decode, f"{where}.decode", (n - 1, L, k), num_experts)
    if s.gate is not None:
        shifted = None if num_experts is None else list(num_experts[1:]) + [num_experts[-1]]
        _check_routing(s.gate, f"{where}.gate", (p + n - 1, L, None if spec is None else k), shifted, dups=False)
    chains = [getattr(s, c) for c in _CHAINS]
    if any(c is not None for c in chains):
        if any(c is None for c in chains):
            raise TraceError(f"{where}: draft_tokens, draft_routing, verify_routing and verify_tokens "
                             "come together (a speculative recording): some are missing.")
        _check_ids(s.draft_tokens, f"{where}.draft_tokens", 2, (n - 1, K), vocab)
        _check_ids(s.verify_tokens, f"{where}.verify_tokens", 2, (n - 1, K + 1), vocab)
        _check_routing(s.draft_routing, f"{where}.draft_routing", (n - 1, K, L, k), num_experts)
        _check_routing(s.verify_routing, f"{where}.verify_routing", (n - 1, K + 1, L, k), num_experts)


def _check_ids(a, name: str, ndim: int, shape: tuple | None = None, vocab: int | None = None) -> None:
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        raise TraceError(f"{name}: expected an integer array, got "
                         f"{getattr(a, 'dtype', type(a).__name__)}. Token ids are integers.")
    if a.ndim != ndim or (shape is not None and a.shape != shape):
        raise TraceError(f"{name}: shape {a.shape}, expected {shape if shape is not None else f'{ndim} dims'}.")
    if a.size and (int(a.min()) < 0 or (vocab is not None and int(a.max()) >= vocab)):
        bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
        fits = f"[0, {vocab})" if vocab is not None else ">= 0"
        raise TraceError(f"{name}: token id {bad}; the config's vocabulary holds ids {fits}.")


def _check_routing(a, name: str, shape: tuple, num_experts: "list[int] | None", dups: bool = True) -> None:
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        raise TraceError(f"{name}: expected an integer array of expert ids, got "
                         f"{getattr(a, 'dtype', type(a).__name__)}. Convert it with .astype(int).")
    if a.ndim != len(shape) or any(want is not None and got != want for got, want in zip(a.shape, shape)):
        raise TraceError(f"{name}: shape {a.shape}, expected {tuple('any' if s is None else s for s in shape)} "
                         "(tokens, [chain,] MoE layers, top-k).")
    if not a.size:
        return
    if int(a.min()) < -1:
        raise TraceError(f"{name}: expert id {int(a.min())} < -1 (use -1 for 'not recorded').")
    if num_experts is not None:
        per_layer = np.asarray(num_experts)
        over = a >= per_layer.reshape((1,) * (a.ndim - 2) + (-1, 1))
        if over.any():
            layer = int(np.argwhere(over)[0][-2])
            raise TraceError(f"{name}: expert id {int(a[over].max())} at MoE layer {layer}, but that layer has "
                             f"{int(per_layer[layer])} experts (ids 0..{int(per_layer[layer]) - 1}): the trace "
                             "does not belong to this config.")
    if dups and a.shape[-1] > 1:
        srt = np.sort(a, axis=-1)
        dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
        if dup.any():
            where = tuple(int(i) for i in np.argwhere(dup)[0][:-1])
            raise TraceError(f"{name}: row {where} names an expert twice; a token's top-k ids are distinct (-1 "
                             "pads a slot not recorded).")
