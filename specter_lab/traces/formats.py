"""Routing as the engines users run write it, read by ``sl.import_routing`` and written by
:meth:`RoutingTrace.export <specter_lab.traces.trace_file.RoutingTrace.export>` (``docs/traces.md``, "Routing
from other engines"):

* ``"vllm"``: vLLM's ``--enable-return-routed-experts`` arrays, ``prompt_routed_experts [prompt_len, MoE layers,
  top_k]`` and ``routed_experts [gen_len, MoE layers, top_k]`` (int16 ids in ``[0, num_experts)``), saved with
  numpy: an ``.npz`` holding them (one request), or ``prompt_routed_experts_<i>`` / ``routed_experts_<i>`` for
  request ``i``, or an ``.npy`` of ``routed_experts`` alone.
* ``"llama_csv"``: llama.cpp moe-trace CSV. Upstream llama.cpp has no merged routing dump (the moe-trace example,
  ggml-org/llama.cpp PR #28544, writes ``layer,expert`` rows with no token index, so tokens cannot be told apart);
  two forks of it add one, and both are read: the long form with a header ``phase,token,layer,rank,expert`` (one
  row per routed expert; an optional leading ``seq`` column is ours, for several sequences), and the wide form
  without a header ``pos,layer,id0,id1,...`` (one row per token and layer; prompt rows have negative ``pos``).
* ``"jsonl"``: one JSON object per line and per (token, layer): ``{"t": 5, "layer": 3, "experts": [12, 40],
  "phase": "decode"}`` (optional ``"seq"`` for several sequences).
* ``"sglang"``: SGLang's ``--enable-return-routed-experts`` responses saved as ``.json`` (one ``/generate``
  response, or a list of them): ``meta_info["routed_experts"]`` is base64 of int32 ids ``[prompt_tokens +
  completion_tokens - 1, layers, top_k]``, a row per forward (the last generated token is never forwarded), layers
  being every decoder layer (``num_hidden_layers``: a dense layer's rows hold no routing and are dropped) or the
  MoE layers alone.

Layer numbers are the engine's (llama.cpp numbers decoder layers, so a model whose first layer is dense starts at
1): the distinct values, in order, are the config's MoE layers. Token numbers within a sequence must run 0, 1, ...
with no gap; prompt tokens come first. Every reader checks its rows against the config's MoE layers and top-k
before allocating the ``[tokens, layers, top_k]`` array, and sizes it from the rows it read, never from a field.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_open, write_atomic
from ..errors import TraceError
from .npz import NpzArchive

__all__ = ["FORMATS", "SUFFIX", "detect_format", "read_routing", "write_routing", "Routed", "MAX_TEXT_BYTES"]

FORMATS = ("vllm", "llama_csv", "jsonl", "sglang")
SUFFIX = {"vllm": ".npz", "llama_csv": ".csv", "jsonl": ".jsonl", "sglang": ".json"}  # what each is written as
MAX_TEXT_BYTES = 2 * 2**30  # a CSV, JSONL or JSON source: ~100 M routed experts; larger is refused before reading
_PHASES = ("prefill", "decode")


@dataclass
class Routed:
    """A source's routing: ``experts [rows, MoE layers, top_k]`` (-1 = not recorded) and its segments
    ``(start, length, phase)`` in row order (a sequence: its prefill rows, then its decode rows)."""

    experts: np.ndarray
    segments: list[tuple[int, int, str]]
    label: str


def detect_format(path: Path) -> str | None:
    """The engine format of ``path`` by its suffix (and, for an ``.npz``, its array names); None: not one."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "llama_csv"
    if suffix == ".json":
        return "sglang"
    if suffix == ".npy":
        return "vllm"
    if suffix == ".npz":
        with NpzArchive(path, "is not a readable .npz", "Save it again with np.savez.") as z:
            names = set(z.arrays)
        if any(n.startswith(("routed_experts", "prompt_routed_experts")) for n in names):
            return "vllm"
    return None


def read_routing(path: "str | Path", num_layers: int, top_k: int, fmt: str | None = None,
                 decoder: "tuple[int, list[int]] | None" = None) -> Routed:
    """Read ``path`` in ``fmt`` (default: by its suffix) for a model of ``num_layers`` MoE layers routing at most
    ``top_k`` experts; a :class:`TraceError` naming the line or array and the field otherwise. ``decoder``: the
    model's decoder-layer count and its MoE layers' indices among them, for an SGLang file, which numbers every
    decoder layer (default: every decoder layer is an MoE layer)."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise TraceError(f"source {str(path)!r}: format {fmt!r}; one of {FORMATS} (or an .npz holding 'experts').")
    if fmt == "vllm":
        return _read_vllm(path, num_layers, top_k)
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise TraceError(f"source {str(path)!r}: {size} bytes; a {fmt} source is read up to {MAX_TEXT_BYTES} bytes. "
                         "Split it, or save the routing as an .npz of expert ids.")
    if fmt == "sglang":
        return _read_sglang(path, num_layers, top_k, decoder or (num_layers, list(range(num_layers))))
    rows = _read_jsonl(path) if fmt == "jsonl" else _read_csv(path)
    return _assemble(rows, num_layers, top_k, f"{str(path)!r}", fmt)


# ---------------------------------------------------------------------------------------------------- vLLM

def _read_vllm(path: Path, num_layers: int, top_k: int) -> Routed:
    where = repr(str(path))
    fix = ("Save vLLM's outputs with np.savez(path, prompt_routed_experts=..., routed_experts=...) "
           "(docs/traces.md).")
    if path.suffix.lower() == ".npy":
        from .npz import read_npy

        arrays = {"routed_experts": read_npy(path, "is not a readable .npy", fix)}
    else:
        with NpzArchive(path, "is not a readable .npz", fix) as z:
            for name, h in z.arrays.items():
                _vllm_shape(f"{where}: {name}", h.shape, h.dtype, num_layers, top_k)
            arrays = {name: z.read(name) for name in z.arrays}
    requests: dict[str, dict[str, np.ndarray]] = {}
    for name, a in arrays.items():
        kind = "prompt" if name.startswith("prompt_routed_experts") else "gen"
        tail = name[len("prompt_routed_experts" if kind == "prompt" else "routed_experts"):]
        named = name.startswith(("routed_experts", "prompt_routed_experts"))
        if not (named and (tail == "" or (tail[0] == "_" and tail[1:].isdigit()))):
            raise TraceError(f"{where}: array {name!r}; a vLLM routing file holds routed_experts and "
                             "prompt_routed_experts, or routed_experts_<i> / prompt_routed_experts_<i> per request.")
        _vllm_shape(f"{where}: {name}", a.shape, a.dtype, num_layers, top_k)
        requests.setdefault(tail.lstrip("_") or "0", {})[kind] = a
    rows, segments, start = [], [], 0
    for key in sorted(requests, key=int):
        req = requests[key]
        if "gen" not in req:
            raise TraceError(f"{where}: request {key} has prompt_routed_experts but no routed_experts.")
        prompt, gen = req.get("prompt"), req["gen"]
        if prompt is not None and len(prompt):
            segments.append((start, len(prompt), "prefill"))
            rows.append(prompt)
            start += len(prompt)
        if len(gen):
            segments.append((start, len(gen), "decode"))
            rows.append(gen)
            start += len(gen)
        elif prompt is None or not len(prompt):
            raise TraceError(f"{where}: request {key} holds no routed token.")
    experts = _padded(np.concatenate(rows), top_k)
    return Routed(experts, segments, f"vLLM routed_experts {where}")


def _vllm_shape(where: str, shape: tuple, dtype, num_layers: int, top_k: int) -> None:
    if dtype.kind not in "iu":
        raise TraceError(f"{where}: dtype {dtype}; vLLM's routed experts are integer ids (int16).")
    if len(shape) != 3 or shape[1] != num_layers or not 1 <= shape[2] <= top_k:
        raise TraceError(f"{where}: shape {shape}; expected [tokens, {num_layers} MoE layers, top_k <= {top_k}] "
                         "(the config's model). Give the config of the model vLLM ran.")


# ---------------------------------------------------------------------------------------------------- SGLang

_SGLANG_FIX = ('save the /generate response(s) with json.dump: {"meta_info": {"routed_experts": "<base64>", '
               '"prompt_tokens": P, "completion_tokens": C}}, or a list of them (docs/traces.md)')


def _read_sglang(path: Path, num_layers: int, top_k: int, decoder: tuple[int, list[int]]) -> Routed:
    """SGLang responses → rows: per response, its P prompt forwards (prefill) then its C - 1 decode forwards."""
    where = repr(str(path))
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise TraceError(f"{where}: not JSON ({type(exc).__name__}); {_SGLANG_FIX}.") from None
    responses = data if isinstance(data, list) else [data]
    if not responses:
        raise TraceError(f"{where}: an empty list: nothing to import.")
    rows, segments, start = [], [], 0
    for i, r in enumerate(responses):
        here = f"{where} response {i}" if isinstance(data, list) else where
        ids, n_prompt = _sglang_response(r, here, num_layers, top_k, decoder)
        segments.append((start, n_prompt, "prefill"))
        if len(ids) > n_prompt:
            segments.append((start + n_prompt, len(ids) - n_prompt, "decode"))
        rows.append(ids)
        start += len(ids)
    return Routed(_padded(np.concatenate(rows), top_k), segments, f"SGLang routed_experts {where}")


def _sglang_response(r, where: str, num_layers: int, top_k: int, decoder: tuple[int, list[int]]
                     ) -> tuple[np.ndarray, int]:
    """One response's ids ``[rows, MoE layers, top_k]`` and its prompt length, every field and the payload's size
    checked before the ids are decoded."""
    meta = r.get("meta_info") if isinstance(r, dict) else None
    if not isinstance(meta, dict):
        raise TraceError(f"{where}: no 'meta_info' object; {_SGLANG_FIX}.")
    b64, p, c = meta.get("routed_experts"), meta.get("prompt_tokens"), meta.get("completion_tokens")
    if not isinstance(b64, str):
        raise TraceError(f"{where}: meta_info field 'routed_experts' is {type(b64).__name__}; the base64 string "
                         "SGLang returns with --enable-return-routed-experts and return_routed_experts=True.")
    for name, v in (("prompt_tokens", p), ("completion_tokens", c)):
        if not _nonneg_int(v) or v < 1:
            raise TraceError(f"{where}: meta_info field {name!r} is {v!r:.40}; an integer >= 1 (SGLang's own count).")
    if len(b64) % 4:
        raise TraceError(f"{where}: meta_info field 'routed_experts' is not base64 (length {len(b64)}, not a "
                         "multiple of 4).")
    n_decoder, moe_index = decoder
    rows, n_bytes = p + c - 1, len(b64) // 4 * 3 - b64[-2:].count("=")
    widths = [n_decoder] + ([num_layers] if num_layers != n_decoder else [])  # every decoder layer, or MoE alone
    layers = next((n for n in widths if n_bytes == rows * n * top_k * 4), None)
    if layers is None:
        sizes = " or ".join(f"{rows * n * top_k * 4} ({n} layers)" for n in widths)
        raise TraceError(f"{where}: routed_experts holds {n_bytes} bytes; {rows} rows (prompt_tokens {p} + "
                         f"completion_tokens {c} - 1) x top-{top_k} int32 ids would be {sizes}. Request the whole "
                         "history (routed_experts_start_len 0) and give the config of the model SGLang ran.")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TraceError(f"{where}: meta_info field 'routed_experts' is not base64 ({exc}).") from None
    ids = np.frombuffer(raw, dtype="<i4").reshape(rows, layers, top_k)
    if layers != num_layers:
        ids = ids[:, moe_index]  # a dense layer's rows hold no routing (SGLang never writes them)
    bad = (ids < -1) | (ids >= 2**15)
    if bad.any():
        raise TraceError(f"{where}: expert id {int(ids[bad][0])}; ids are in [0, num_experts) (-1: not recorded).")
    return ids.astype(np.int32), p


# ---------------------------------------------------------------------------------------------------- text

@dataclass
class _Rows:
    """Parsed text rows: per (seq, token, layer) the ids in rank order, and each token's phase."""

    seq: np.ndarray
    token: np.ndarray
    layer: np.ndarray
    phase: np.ndarray  # 0 prefill, 1 decode
    ids: list  # per row, a list of (rank, expert)


def _read_jsonl(path: Path) -> _Rows:
    seq, token, layer, phase, ids = [], [], [], [], []
    where = repr(str(path))
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
                raise TraceError(f"{where} line {n}: not JSON ({type(exc).__name__}); one object per line: "
                                 '{"t": 0, "layer": 0, "experts": [..], "phase": "prefill"}.') from None
            if not isinstance(row, dict):
                raise TraceError(f"{where} line {n}: a JSON {type(row).__name__}; one object per line.")
            t, l, e, ph, s = row.get("t"), row.get("layer"), row.get("experts"), row.get("phase", "decode"), \
                row.get("seq", 0)
            for name, v in (("t", t), ("layer", l), ("seq", s)):
                if not _nonneg_int(v):
                    raise TraceError(f"{where} line {n}: field {name!r} is {v!r:.40}; an integer >= 0.")
            if ph not in _PHASES:
                raise TraceError(f"{where} line {n}: field 'phase' is {ph!r}; 'prefill' or 'decode'.")
            if not isinstance(e, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in e):
                raise TraceError(f"{where} line {n}: field 'experts' is {e!r:.60}; a list of expert ids (integers).")
            seq.append(s), token.append(t), layer.append(l), phase.append(_PHASES.index(ph))
            ids.append(list(enumerate(e)))
    return _rows(seq, token, layer, phase, ids, where)


def _read_csv(path: Path) -> _Rows:
    import pandas as pd

    where = repr(str(path))
    with open(path, "rb") as f:
        first = f.readline(4096).decode("utf-8", "replace").strip().lower()
    names = [c.strip() for c in first.split(",")]
    try:
        if names[:1] == ["layer"] and "token" not in names and "pos" not in names:
            raise TraceError(f"{where}: a 'layer,expert' CSV (the moe-trace of llama.cpp PR #28544) has no token "
                             "column, so a token's experts cannot be told apart; record with a moe-trace that writes "
                             "'phase,token,layer,rank,expert' (docs/traces.md).")
        if "expert" in names and "token" in names and "layer" in names:
            df = pd.read_csv(path, dtype={"phase": str}, engine="c")
            return _long_rows(df, where)
        df = pd.read_csv(path, header=None, engine="c")
        return _wide_rows(df, where)
    except TraceError:
        raise
    except (ValueError, OverflowError, UnicodeDecodeError, TypeError, KeyError, IndexError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as exc:
        raise TraceError(f"{where}: not a moe-trace CSV ({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); "
                         "'phase,token,layer,rank,expert' with a header, or 'pos,layer,id0,...' without.") from None


def _int_column(df, col: str, where: str) -> np.ndarray:
    v = df[col]
    if v.dtype.kind not in "iu" or (len(v) and int(v.max()) >= 2**62):
        raise TraceError(f"{where}: column {col!r} holds {v.dtype} values; integers (below 2**62).")
    return v.to_numpy(np.int64)


def _long_rows(df, where: str) -> _Rows:
    missing = [c for c in ("token", "layer", "expert") if c not in df.columns]
    if missing:
        raise TraceError(f"{where}: columns {missing} missing; the long form is 'phase,token,layer,rank,expert'.")
    token, layer, expert = (_int_column(df, c, where) for c in ("token", "layer", "expert"))
    seq = _int_column(df, "seq", where) if "seq" in df.columns else np.zeros(len(df), np.int64)
    rank = _int_column(df, "rank", where) if "rank" in df.columns else None
    if "phase" in df.columns:
        ph = df["phase"].astype(str).str.strip().to_numpy()
        bad = ~np.isin(ph, _PHASES)
        if bad.any():
            raise TraceError(f"{where}: row {int(np.argmax(bad)) + 2}: phase {ph[bad][0]!r}; 'prefill' or 'decode'.")
        phase = (ph == "decode").astype(np.int64)
    else:
        phase = np.ones(len(df), np.int64)
    for name, v in (("token", token), ("layer", layer), ("seq", seq)) + ((("rank", rank),) if rank is not None else ()):
        if len(v) and v.min() < 0:
            raise TraceError(f"{where}: column {name!r} holds {int(v.min())}; integers >= 0.")
    if len(df) == 0:
        raise TraceError(f"{where}: no rows: nothing to import.")
    # one row per routed expert: group rows of the same (seq, token, layer), in rank order
    order = np.lexsort((rank if rank is not None else np.arange(len(df)), layer, token, seq))
    key = np.stack([seq, token, layer], 1)[order]
    starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(1)])
    ends = np.r_[starts[1:], len(order)]
    e_sorted, r_sorted = expert[order], (rank[order] if rank is not None else None)
    ids = []
    for a, b in zip(starts, ends):
        ranks = r_sorted[a:b] if r_sorted is not None else np.arange(b - a)
        ids.append(list(zip(ranks.tolist(), e_sorted[a:b].tolist())))
    first = order[starts]
    ph_tok = phase[order]
    for a, b in zip(starts, ends):  # a token's rows agree on the phase
        if (ph_tok[a:b] != ph_tok[a]).any():
            raise TraceError(f"{where}: token {int(key[a, 1])} of layer {int(key[a, 2])} has rows of both phases.")
    return _rows(seq[first], token[first], layer[first], phase[first], ids, where)


def _wide_rows(df, where: str) -> _Rows:
    if df.shape[1] < 3:
        raise TraceError(f"{where}: {df.shape[1]} columns; the wide form is 'pos,layer,id0,id1,...' (a row per token "
                         "and layer).")
    a = df.to_numpy()
    if a.dtype.kind not in "iu" or (a.size and (int(a.max()) >= 2**62 or int(a.min()) <= -(2**62))):
        raise TraceError(f"{where}: non-integer values in the wide form 'pos,layer,id0,...' (rows of equal width).")
    pos, layer, ids_arr = a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2:]
    if len(layer) and layer.min() < 0:
        raise TraceError(f"{where}: column 2 (layer) holds {int(layer.min())}; integers >= 0.")
    prefill = pos < 0
    n_prompt = int(-pos[prefill].min()) if prefill.any() else 0
    token = np.where(prefill, pos + n_prompt, pos + n_prompt)  # prompt token j has pos -(P - j); decode i has i
    ids = [list(enumerate(r)) for r in ids_arr.tolist()]
    return _rows(np.zeros(len(pos), np.int64), token, layer, (~prefill).astype(np.int64), ids, where)


def _rows(seq, token, layer, phase, ids, where: str) -> _Rows:
    if not len(ids):
        raise TraceError(f"{where}: no rows: nothing to import.")
    return _Rows(np.asarray(seq, np.int64), np.asarray(token, np.int64), np.asarray(layer, np.int64),
                 np.asarray(phase, np.int64), ids)


def _assemble(rows: _Rows, num_layers: int, top_k: int, where: str, fmt: str) -> Routed:
    """Rows → [tokens, layers, top_k] with segments; every count checked against the rows before allocating."""
    layers = np.unique(rows.layer)
    if len(layers) != num_layers:
        raise TraceError(f"{where}: {len(layers)} distinct layers ({layers[:8].tolist()}...), but the config's model "
                         f"has {num_layers} MoE layers: the routing is of another model. Give its config.json.")
    width = max((r for row in rows.ids for r, _ in row), default=-1) + 1
    if width > top_k:
        raise TraceError(f"{where}: a token routes {width} experts (rank {width - 1}), but the config's layers route "
                         f"top-{top_k}: the routing is of another model.")
    layer_ix = np.searchsorted(layers, rows.layer)
    segments, blocks, start = [], [], 0
    for s in np.unique(rows.seq):
        mine = np.flatnonzero(rows.seq == s)
        toks = rows.token[mine]
        n_tok = int(toks.max()) + 1
        if n_tok * num_layers != len(mine):
            raise TraceError(f"{where}: sequence {int(s)} has {len(mine)} (token, layer) rows for tokens 0.."
                             f"{n_tok - 1} x {num_layers} layers: each token needs one row per MoE layer, tokens "
                             "numbered 0, 1, ... without gaps.")
        bad = [e for j in mine.tolist() for _, e in rows.ids[j] if not -1 <= e < 2**15]
        if bad:
            raise TraceError(f"{where}: sequence {int(s)}: expert id {bad[0]}; ids are in [0, num_experts) (-1: not "
                             "recorded).")
        cell = toks * num_layers + layer_ix[mine]
        if len(np.unique(cell)) != len(mine):
            raise TraceError(f"{where}: sequence {int(s)} holds a (token, layer) pair twice.")
        block = np.full((n_tok, num_layers, top_k), -1, np.int32)
        phase = np.zeros(n_tok, np.int64)
        for j, r in zip(mine.tolist(), cell.tolist()):
            t, l = divmod(r, num_layers)
            for rank, e in rows.ids[j]:
                block[t, l, rank] = e
            phase[t] = rows.phase[j]
        n_prefill = int((phase == 0).sum())
        if (phase[:n_prefill] != 0).any():
            raise TraceError(f"{where}: sequence {int(s)}: a decode token comes before a prompt token; prompt "
                             "(prefill) tokens come first.")
        if n_prefill:
            segments.append((start, n_prefill, "prefill"))
        if n_tok - n_prefill:
            segments.append((start + n_prefill, n_tok - n_prefill, "decode"))
        blocks.append(block)
        start += n_tok
    label = {"llama_csv": "llama.cpp moe-trace CSV", "jsonl": "JSONL routing"}[fmt]
    return Routed(np.concatenate(blocks), segments, f"{label} {where}")


def _nonneg_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62


def _padded(a: np.ndarray, top_k: int) -> np.ndarray:
    out = np.full(a.shape[:2] + (top_k,), -1, np.int32)
    out[:, :, : a.shape[2]] = a
    return out


# ---------------------------------------------------------------------------------------------------- writing

def write_routing(trace, path: "str | Path", fmt: str | None = None) -> Path:
    """Write ``trace``'s target routing (each sequence's prefill and decode rows) in ``fmt`` (default: by the
    suffix: ``.npz``/``.npy`` vllm, ``.csv`` llama_csv, ``.jsonl`` jsonl, ``.json`` sglang). Slots not recorded
    (-1) are left out of the CSV and JSONL; vLLM arrays and SGLang's ids keep them as -1. Written whole or not at
    all (:mod:`specter_lab.atomic`)."""
    path = Path(path)
    fmt = fmt or {**{v: k for k, v in SUFFIX.items()}, ".ndjson": "jsonl"}.get(path.suffix.lower())
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} (path {str(path)!r}): use one of {FORMATS}, or a path ending .npz, .csv, "
                         ".jsonl or .json.")
    trace.validate()
    seqs = trace.sequences
    if fmt == "vllm":
        if path.suffix.lower() != ".npz":
            raise ValueError(f"path {str(path)!r}: vLLM routing is written as an .npz (prompt and generated arrays).")
        arrays = {}
        for i, s in enumerate(seqs):
            tail = "" if len(seqs) == 1 else f"_{i}"
            arrays[f"prompt_routed_experts{tail}"] = s.prefill.astype(np.int16)
            arrays[f"routed_experts{tail}"] = s.decode.astype(np.int16)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        write_atomic(path, buf.getbuffer())
        return path
    if fmt == "sglang":
        out = [_sglang_of(s) for s in seqs]
        write_atomic(path, json.dumps(out[0] if len(out) == 1 else out))
        return path
    with atomic_open(path, "w") as f:  # streamed (a line per routed expert): whole or not at all
        if fmt == "llama_csv":
            f.write(("seq," if len(seqs) > 1 else "") + "phase,token,layer,rank,expert\n")
        for i, s in enumerate(seqs):
            rows = np.concatenate([s.prefill, s.decode])
            for t in range(len(rows)):
                phase = "prefill" if t < len(s.prefill) else "decode"
                for layer in range(rows.shape[1]):
                    ids = rows[t, layer]
                    if fmt == "jsonl":
                        obj = {"t": t, "layer": layer, "experts": [int(e) for e in ids if e >= 0], "phase": phase}
                        if len(seqs) > 1:
                            obj = {"seq": i, **obj}
                        f.write(json.dumps(obj) + "\n")
                    else:
                        lead = f"{i}," if len(seqs) > 1 else ""
                        f.writelines(f"{lead}{phase},{t},{layer},{r},{int(e)}\n" for r, e in enumerate(ids) if e >= 0)
    return path


def _sglang_of(seq) -> dict:
    """One sequence as an SGLang ``/generate`` response's ``meta_info`` (its MoE layers only; -1 kept)."""
    rows = np.concatenate([seq.prefill, seq.decode]).astype("<i4")
    b64 = base64.b64encode(np.ascontiguousarray(rows).tobytes()).decode("ascii")
    return {"meta_info": {"routed_experts": b64, "prompt_tokens": len(seq.prefill),
                          "completion_tokens": len(seq.decode) + 1}}
