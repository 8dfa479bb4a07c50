"""Import routing recorded elsewhere (a real checkpoint's per-token top-k, a public dump, a derived sequence) as a
:class:`~specter_lab.traces.trace_file.RoutingTrace`, so :func:`specter_lab.analysis.replay.replay` prices every strategy on it.

What is exact and what is modeled:

* **Target routing** is the source's, as given. Without segments the source is one text decoded token by token
  (for a causal model, teacher-forced routing of a text is the routing of decoding it): the first row is the
  prompt's prefill, every later row one decode forward. With segments, a ``prefill`` segment's rows are one
  prompt's prefill forward and the ``decode`` segments after it that sequence's decode forwards. Non-speculative
  strategies replay exactly what a live run over that routing would do (``tests/test_import_routing.py``).
* **Token ids are not known**: every text token is one placeholder id (the smallest id that is no EOS id of the
  config), so no sequence ends early; the views show that id.
* **-1** is a slot not recorded: no lookup, no copy, no compute for it.
* **Gate-lookahead predictions** (what ``prefetch="gate"`` rows, ``gate_lookahead`` and ``pregate_split``,
  prefetch with: layer l+1's router on layer l's state) are not in an import, so those rows are refused on it,
  unless ``gate_recall=r`` models them: each of layer l+1's experts is predicted at layer l with probability
  ``r``, the others replaced by experts that token does not use there, drawn at random (no duplicates; seeded).
  ``r`` is one number, or one per layer pair (l → l+1). The bundled model's own predictor names
  :data:`MEASURED_GATE_RECALL` of the next layer's experts while decoding, unevenly:
  :data:`MEASURED_GATE_RECALL_PER_LAYER` for its three layer pairs. Give the uneven one where the layers match:
  one mean flatters a predictor that is poor in early layers (``docs/measured/closer_to_bound.md``, "Is the
  modelled forecast faithful?", replays the bundled model's recorded predictions beside both models). A real
  model's deeper residual stream keeps a next layer's choice more predictable, so give the recall measured on
  yours (:func:`gate_recall` of a trace ``sl.record`` made of it, ``per_layer=True``).
* **Speculative strategies** get a **modeled draft** (``trace.draft["modeled"]``, also in ``trace.source``, which
  every replayed result states as ``routing_source``), seeded:

  - forecast recall ``r``: each of a token's target experts is named by the draft with probability ``r``; the
    others are replaced by experts the token does not use, drawn at random (no duplicates). ``replace_fraction``
    (the Specter artifact's oracle experiment: 0, 0.25, 0.5, 0.75) is the same knob, ``1 - r``;
  - per-token acceptance ``α``: each draft position is accepted with probability ``α`` independently; the first
    rejection ends the window's accepted run (the loop commits the target's own token there);
  - verification rows are the text's own routing at those positions, also after a rejected draft (a modeling
    assumption: the target would route the rejected token's position differently);
  - the draft is priced as an int``draft_bits``-g64 RTN draft (its size and its forwards);
  - defaults for ``r`` and ``α`` are measured on the bundled model (:data:`MEASURED_DRAFT`).

  The chains are built so that the existing replay runs them unchanged: accepted drafts are the text's next
  tokens, a rejected draft is a second placeholder id, and ``verify_tokens`` are the text's next tokens. A chain
  reaching past the text's end is never read (the loop drafts at most the tokens left); those entries hold -1
  routing and placeholder ids.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError
from ..model.config_check import read_config_json
from ..model.skeleton import skeleton_info
from .formats import detect_format, read_routing
from .locality import replace_experts
from .trace_file import RoutedSequence, RoutingTrace, TraceError, TraceSpec, read_npz

__all__ = ["import_routing", "gate_recall", "ModeledDraft", "MEASURED_DRAFT", "MEASURED_GATE_RECALL",
           "MEASURED_GATE_RECALL_PER_LAYER", "DraftFidelity", "PHASES"]

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class DraftFidelity:
    """A draft's measured routing recall and per-token acceptance (teacher-forced next-token agreement), with the
    K=8 chain acceptance rate the engine measured as a check of the independence model."""

    recall: float
    acceptance: float
    chain_acceptance_k8: float


# Measured once on the bundled model (4 held-out prompts x 32 greedy tokens, RTN, group 64; 2-core CPU):
#   sl.fidelity(model, tok, specs=[sl.QuantSpec(b, 64) for b in (2, 3, 4, 8)], max_new_tokens=32)
#   (model, tok = sl.load_model("tiny")). recall = routing_recall, acceptance = token_agreement (the chance a
# draft position is accepted given an accepted prefix), chain = the engine's acceptance_rate at K=8 (accepted /
# drafted). Independent positions predict a K=8 chain rate of 0.32 / 0.62 / 0.78 / 0.96 from these α, against
# the measured 0.31 / 0.66 / 0.73 / 0.95. The bundled model is small and its draft unusually faithful at 4 bits;
# give recall= and acceptance= measured on your model where you have them.
MEASURED_DRAFT: dict[int, DraftFidelity] = {
    2: DraftFidelity(recall=0.920, acceptance=0.734, chain_acceptance_k8=0.312),
    3: DraftFidelity(recall=0.971, acceptance=0.891, chain_acceptance_k8=0.659),
    4: DraftFidelity(recall=0.983, acceptance=0.945, chain_acceptance_k8=0.733),
    8: DraftFidelity(recall=1.000, acceptance=0.992, chain_acceptance_k8=0.953),
}

# The bundled model's gate lookahead (layer l+1's router on layer l's input, recorded by sl.record): the share of
# the next layer's experts it names while decoding, 4 held-out prompts × 256 greedy tokens (0.187, 0.594, 0.760
# for the layer pairs 0→1, 1→2, 2→3): gate_recall() of that trace.
MEASURED_GATE_RECALL = 0.514
MEASURED_GATE_RECALL_PER_LAYER = (0.187, 0.594, 0.760)


def gate_recall(trace: RoutingTrace, per_layer: bool = False) -> "float | np.ndarray":
    """The share of each decode token's layer-l+1 experts that its recorded gate lookahead (layer l+1's router on
    layer l's input, which ``sl.record`` keeps) named: what to pass as ``import_routing(gate_recall=)`` for routing
    of the same model recorded elsewhere. ``per_layer``: one value per layer pair (l → l+1). Raises a
    ``ValueError`` where the trace holds no gate predictions (an import without ``gate_recall=``, a model with
    one MoE layer)."""
    if not trace.gated:
        raise ValueError("trace holds no gate predictions: record the model with sl.record (a model with more than "
                         "one MoE layer), or give import_routing(gate_recall=).")
    named = looked = None
    for s in trace.sequences:
        p = len(s.prefill)
        true, pred = s.decode[:, 1:], s.gate[p:, :-1]  # decode token i: row p + i of the gate
        hit = ((pred[..., None, :] == true[..., :, None]) & (true[..., :, None] >= 0)).any(-1).sum((0, 2))
        n = (true >= 0).sum((0, 2))
        named, looked = (hit, n) if named is None else (named + hit, looked + n)
    if looked is None or not looked.sum():
        raise ValueError("trace has no decode lookups past its first layer: nothing to measure a gate recall on.")
    return named / np.maximum(looked, 1) if per_layer else float(named.sum() / looked.sum())


@dataclass(frozen=True)
class ModeledDraft:
    """The modeled draft of an import: forecast recall, per-token acceptance, the seed of both, and its bits."""

    recall: float
    acceptance: float
    seed: int
    bits: int
    defaults: bool = False  # True where recall/acceptance are the measured table's

    def describe(self) -> str:
        origin = "measured on the bundled model" if self.defaults else "given"
        return (f"modeled draft int{self.bits}-g64 (forecast recall {self.recall:.3f}, per-token acceptance "
                f"{self.acceptance:.3f} [{origin}], seed {self.seed}; verification rows after a rejection are the "
                "text's own; chains end at the text's end)")


@dataclass
class _Segment:
    start: int
    length: int
    phase: str


def import_routing(source, config, segments: "Sequence | None" = None, *, recall: float | None = None,
                   acceptance: float | None = None, replace_fraction: float | None = None, k_max: int = 16,
                   draft_bits: int = 4, seed: int = 0, format: str | None = None,
                   gate_recall: "float | Sequence[float] | None" = None) -> RoutingTrace:
    """A :class:`RoutingTrace` from target routing recorded elsewhere (see the module docstring for what is exact
    and what is modeled).

    ``source``: an int array ``[tokens, MoE layers, top_k]`` of expert ids (-1 = not recorded: no lookup), or an
    ``.npz`` path holding ``experts`` (optional ``num_experts``, ``top_k``, ``segment_starts``,
    ``segment_lengths``, ``segment_phases``), or a file an engine wrote (:mod:`.formats`: vLLM's
    ``routed_experts`` ``.npz``/``.npy``, llama.cpp's moe-trace ``.csv``, a ``.jsonl`` line per token and layer,
    SGLang's ``/generate`` responses as ``.json``; ``format=`` names it where the suffix does not; these carry
    their own segments). ``config``: a
    transformers config, a dict or a ``config.json``
    path; it sizes and prices the replay. ``segments``: ``(start, length, phase)`` triples over the rows, phase
    ``"prefill"`` or ``"decode"`` (default: the whole source, one text decoded token by token). ``recall`` /
    ``replace_fraction`` (one of them) and ``acceptance`` model the draft of speculative strategies (defaults:
    :data:`MEASURED_DRAFT` for ``draft_bits``); ``k_max``: the longest draft window (0: no chains).
    ``gate_recall``: model gate-lookahead predictions with this recall, one number or one per layer pair (module
    docstring; None: none)."""
    draft = _modeled_draft(recall, acceptance, replace_fraction, draft_bits, seed, k_max)  # arguments first
    recalls = _gate_recalls(gate_recall)
    cfg = _config_dict(config)
    info = _moe_info(cfg)
    if recalls is not None and recalls.size > 1 and recalls.size != info.num_layers - 1:
        raise ValueError(f"gate_recall: {recalls.size} recalls for a config with {info.num_layers} MoE layers; give "
                         f"one per layer pair l → l+1 ({info.num_layers - 1}), or one number for all.")
    experts, stored, what = _read_source(source, info, format)
    if isinstance(stored, list):  # an engine's file: its own segments
        if segments is not None:
            raise ValueError(f"segments: the source {what} defines its own prefill and decode rows; give none.")
        segments, stored = stored, {}
    else:
        what = repr(str(source)) if isinstance(source, (str, Path)) else f"array {tuple(np.shape(experts))}"
    experts = _checked_experts(experts, info, stored)
    segs = _segments(segments, stored, len(experts))
    text_id, reject_id = _placeholders(info)
    groups = _group(segs)
    seqs = [_sequence(experts, g, text_id) for g in groups]
    if k_max:
        ss = np.random.SeedSequence(seed)
        acc_seed, recall_seed = ss.spawn(2)  # separate streams: a recall sweep keeps the same accepted runs
        acc_rng, recall_rng = np.random.default_rng(acc_seed), np.random.default_rng(recall_seed)
        num_experts = [l.num_experts for l in info.layers]
        for s in seqs:
            _add_chains(s, k_max, draft, text_id, reject_id, num_experts, acc_rng, recall_rng)
    gate = "not recorded"
    if recalls is not None:
        gate_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))  # its own stream: drafts unchanged
        for s in seqs:
            s.gate = _modeled_gate(s, recalls, [l.num_experts for l in info.layers], gate_rng)
        said = f"{recalls[0]:g}" if recalls.size == 1 else "/".join(f"{r:g}" for r in recalls) + " per layer pair"
        gate = f"modeled (recall {said}, seed {seed})"
    n_rows = sum(seg.length for seg in segs)
    text = (f"imported: {what}, {n_rows} routed tokens in {len(seqs)} sequence(s), {cfg['model_type']} config; "
            f"token ids are placeholders (id {text_id}, never EOS); "
            + ("no gate predictions" if gate_recall is None else f"gate predictions {gate}"))
    if k_max:
        text += "; " + draft.describe()
    meta = {"imported": {"rows": n_rows, "slots_not_recorded": int((experts < 0).sum()), "text_token": text_id,
                         "rejected_draft_token": reject_id, "gate": gate,
                         "segments": [asdict(s) for s in segs]}}
    draft_field = ({"bits": draft.bits, "group_size": 64, "method": "rtn", "modeled": asdict(draft)}
                   if k_max else None)
    trace = RoutingTrace(cfg, seqs, k_max, draft_field, text, meta)
    return trace.validate(spec=TraceSpec.of(info))


# ---------------------------------------------------------------------------------------------------- config

def _config_dict(config) -> dict[str, Any]:
    """The config as a dict with its model_type (a transformers config, a dict, or a config.json path)."""
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"config={str(config)!r}: no such file; give the model's config.json (or a "
                                    "dict, or a transformers config).")
        try:
            cfg = read_config_json(path)
        except ConfigError as exc:
            raise TraceError(str(exc)) from exc
    elif isinstance(config, dict):
        cfg = dict(config)
    elif hasattr(config, "to_dict"):
        cfg = config.to_dict()
    else:
        raise TypeError(f"config must be a transformers config, a dict or a config.json path, got "
                        f"{type(config).__name__}.")
    if not isinstance(cfg, dict) or not cfg.get("model_type"):
        raise TraceError("config: no 'model_type': it cannot be sized. Give the model's own config.json.")
    try:
        return json.loads(json.dumps(cfg, default=str))  # as a saved trace holds it (JSON keys are strings)
    except (ValueError, RecursionError) as exc:  # NaN is JSON to Python only; a cycle or depth is not JSON
        raise TraceError(f"config: not JSON-serialisable ({type(exc).__name__}); give the model's config.json.") \
            from None


def _moe_info(cfg: dict):
    try:
        return skeleton_info(cfg)  # every field checked, transformers' own errors named (ConfigError)
    except ConfigError as exc:
        raise TraceError(str(exc)) from exc
    except TraceError:
        raise
    except ValueError as exc:
        raise TraceError(f"config: a {cfg['model_type']!r} model is not a mixture-of-experts model ({exc}). "
                         "Give the config of the MoE model the routing was recorded on.") from None


# ---------------------------------------------------------------------------------------------------- source

_OPTIONAL = ("num_experts", "top_k", "segment_starts", "segment_lengths", "segment_phases")


def _read_source(source, info, fmt: str | None):
    """(experts array, the optional arrays stored with it or an engine file's segments, its label)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"source={str(source)!r}: no such file; give an .npz holding 'experts' "
                                    "[tokens, layers, top_k], an engine's routing file, or the array itself.")
        fmt = fmt or detect_format(path)
        if fmt is not None:
            n_decoder = len(info.decoder_layers) if info.decoder_layers is not None else info.num_layers
            routed = read_routing(path, info.num_layers, info.top_k, fmt,
                                  decoder=(n_decoder, [layer.decoder_index for layer in info.layers]))
            return routed.experts, routed.segments, routed.label
        data = read_npz(path, "is not a readable .npz",
                        "Save it again with np.savez(path, experts=ids) and, for phases, a string array "
                        "(np.array(['prefill', 'decode'])).")
        if "experts" not in data:
            raise TraceError(f"source {str(path)!r} has no 'experts' array (it holds {sorted(data)}); save the "
                             "routing as experts=[tokens, layers, top_k] ids.")
        unknown = sorted(set(data) - {"experts", *_OPTIONAL})
        if unknown:
            raise TraceError(f"source {str(path)!r}: unknown arrays {unknown}; an import reads 'experts' and "
                             f"optionally {list(_OPTIONAL)}.")
        return data.pop("experts"), data, None
    if fmt is not None:
        raise ValueError(f"format={fmt!r}: names the format of a file; the source is {type(source).__name__}.")
    if isinstance(source, np.ndarray):
        return source, {}, None
    if hasattr(source, "__array__") or isinstance(source, (list, tuple)):
        try:
            return np.asarray(source), {}, None
        except (ValueError, TypeError, OverflowError) as exc:  # ragged or mixed lists
            raise TraceError(f"experts: not an array of ids ({type(exc).__name__}); give [tokens, layers, top_k] "
                             "integers.") from None
    raise TypeError(f"source must be an int array [tokens, layers, top_k] or an .npz path, got "
                    f"{type(source).__name__}.")


def _checked_experts(a: np.ndarray, info, stored: dict) -> np.ndarray:
    """The source as int16/int32 ids padded to the config's top-k, or a TraceError naming what does not fit."""
    if a.dtype.kind not in "iu":
        raise TraceError(f"experts: dtype {a.dtype}; expert ids are integers (-1 = not recorded). Convert them with "
                         ".astype(np.int32) if they are whole numbers, or save the top-k ids, not router scores.")
    if a.ndim != 3:
        raise TraceError(f"experts: shape {a.shape}; expected [tokens, MoE layers, top_k] (3 dims).")
    T, L, k = a.shape
    if T == 0 or a.size == 0:
        raise TraceError(f"experts: shape {a.shape} holds no routing: nothing to import.")
    if L != info.num_layers:
        raise TraceError(f"experts: {L} layers, but the config's model has {info.num_layers} MoE layers "
                         f"({info.model_type}; dense layers do not count): the routing is of another model, or "
                         "its layer axis is not the second. Give that model's config.json.")
    ne = np.array([l.num_experts for l in info.layers])
    tk = np.array([l.top_k for l in info.layers])
    for name, want in (("num_experts", ne), ("top_k", tk)):
        if name in stored:
            got = np.asarray(stored[name]).reshape(-1)
            fits = got.dtype.kind in "iu" and len(got) in (1, L) and bool((got == want).all())
            if not fits:
                raise TraceError(f"{name}: the source says {got.tolist()}, the config's MoE layers "
                                 f"{sorted(set(want.tolist()))}: the routing is of another model. Give that "
                                 "model's config.json.")
    if k > int(tk.max()):
        raise TraceError(f"experts: {k} ids per token, but the config's layers route top-{int(tk.max())}: the "
                         f"routing is of another model; give the config of the model that routes top-{k}.")
    if a.min() < -1:
        raise TraceError(f"experts: id {int(a.min())} < -1 (use -1 for 'not recorded').")
    over = a >= ne[None, :, None]
    if over.any():
        t, layer, _ = (int(i) for i in np.argwhere(over)[0])
        raise TraceError(f"experts: id {int(a[over].max())} at token {t}, MoE layer {layer}, but that layer has "
                         f"{int(ne[layer])} experts (ids 0..{int(ne[layer]) - 1}): the routing is of another model, "
                         "or its ids are 1-based (subtract 1).")
    s = np.sort(a, axis=-1)
    dup = (s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)
    if dup.any():
        t, layer, j = (int(i) for i in np.argwhere(dup)[0])
        raise TraceError(f"experts: token {t}, MoE layer {layer} names expert {int(s[t, layer, j])} twice; a "
                         "token's top-k ids are distinct (-1 pads a slot not recorded).")
    dtype = np.int16 if int(ne.max()) <= np.iinfo(np.int16).max else np.int32
    out = np.full((T, L, int(tk.max())), -1, dtype=dtype)  # fewer ids than top-k: the rest not recorded
    out[:, :, :k] = a
    return out


def _segments(segments, stored: dict, n_rows: int) -> list[_Segment]:
    """Validated segments in row order (default: one decode segment over every row)."""
    in_file = [n for n in ("segment_starts", "segment_lengths", "segment_phases") if n in stored]
    if segments is not None and in_file:
        raise ValueError("segments: given as an argument and stored in the source .npz; give one of them.")
    if in_file:
        if "segment_starts" not in stored or "segment_lengths" not in stored:
            raise TraceError("segment_starts and segment_lengths come together (segment_phases is optional): "
                             f"the source holds only {in_file}.")
        starts, lengths = stored["segment_starts"], stored["segment_lengths"]
        for name, arr in (("segment_starts", starts), ("segment_lengths", lengths)):
            if arr.dtype.kind not in "iu" or arr.ndim != 1:
                raise TraceError(f"{name}: expected a 1-d integer array, got {arr.dtype} with shape {arr.shape}.")
        phases = stored.get("segment_phases")
        if phases is not None and (phases.dtype.kind not in "US" or phases.shape != starts.shape):
            raise TraceError(f"segment_phases: expected {len(starts)} strings ('prefill' or 'decode'), got "
                             f"{phases.dtype} with shape {phases.shape}.")
        if len(starts) != len(lengths):
            raise TraceError(f"segment_lengths: {len(lengths)} values for {len(starts)} segment_starts.")
        phases = phases.astype(str) if phases is not None else None  # bytes ('S') read as text
        segments = [(int(s), int(n), str(phases[i]) if phases is not None else "decode")
                    for i, (s, n) in enumerate(zip(starts, lengths))]
    if segments is None:
        return [_Segment(0, n_rows, "decode")]
    out = []
    for i, seg in enumerate(segments):
        seg = tuple(seg)
        if len(seg) not in (2, 3):
            raise ValueError(f"segments[{i}]={seg!r}: give (start, length) or (start, length, phase).")
        start, length, phase = (*seg, "decode") if len(seg) == 2 else seg
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (start, length)):
            raise ValueError(f"segments[{i}]={seg!r}: start and length are integers.")
        if phase not in PHASES:
            raise ValueError(f"segments[{i}]: phase {phase!r}; use 'prefill' or 'decode'.")
        if length < 1 or start < 0 or start + length > n_rows:
            raise ValueError(f"segments[{i}]: rows {start}..{start + length - 1} are not inside the source's "
                             f"{n_rows} rows (a segment holds at least one row).")
        if out and start < out[-1].start + out[-1].length:
            raise ValueError(f"segments[{i}] starts at row {start}, inside or before segment {i - 1}; give "
                             "segments in row order, not overlapping.")
        out.append(_Segment(int(start), int(length), str(phase)))
    if not out:
        raise ValueError("segments is empty: give at least one (start, length, phase), or None for the whole source.")
    return out


def _group(segs: list[_Segment]) -> list[list[_Segment]]:
    """Sequences: a prefill segment opens one, the decode segments after it continue it; a decode segment with no
    prefill before it is a sequence of its own."""
    groups: list[list[_Segment]] = []
    for seg in segs:
        if seg.phase == "prefill" or not groups:
            groups.append([seg])
        elif groups[-1][0].phase == "prefill":
            groups[-1].append(seg)
        else:
            groups.append([seg])
    return groups


def _placeholders(info) -> tuple[int, int]:
    """(text token id, rejected draft id): the two smallest ids that are no EOS id."""
    eos = set(info.eos_token_ids)
    ids = [i for i in range(len(eos) + 2) if i not in eos][:2]
    if ids[1] >= info.vocab:
        raise TraceError(f"config: a vocabulary of {info.vocab} ids leaves no two non-EOS placeholder ids.")
    return ids[0], ids[1]


# ---------------------------------------------------------------------------------------------------- building

def _sequence(experts: np.ndarray, group: list[_Segment], text_id: int) -> RoutedSequence:
    rows = np.concatenate([experts[s.start: s.start + s.length] for s in group])
    n_prefill = group[0].length if group[0].phase == "prefill" else 1
    n_decode = len(rows) - n_prefill
    return RoutedSequence(prompt=np.full(n_prefill, text_id, np.int32), tokens=np.full(n_decode + 1, text_id, np.int32),
                          prefill=rows[:n_prefill].copy(), decode=rows[n_prefill:].copy())


def _modeled_gate(s: RoutedSequence, recall: np.ndarray, num_experts: list[int],
                  rng: np.random.Generator) -> np.ndarray:
    """Gate-lookahead rows ``[P + N-1, L, k]`` of one sequence: row l holds layer l+1's routing of that token,
    each expert kept with probability ``recall`` (one value, or one per layer pair) and else replaced by one the
    token does not use there; the last layer's row predicts nothing (-1), as recorded."""
    rows = np.concatenate([s.prefill, s.decode])
    nxt = rows[:, 1:]  # [T, L-1, k]: what layer l's gate should name, layer l+1's experts
    kept = rng.random(nxt.shape) < recall.reshape(1, -1, 1)
    gate = np.full_like(rows, -1)
    gate[:, :-1] = replace_experts(nxt, ~kept, num_experts[1:], rng)
    return gate


def _gate_recalls(gate_recall) -> "np.ndarray | None":
    """``gate_recall=`` as an array of shares (one, or one per layer pair), checked before anything is read."""
    if gate_recall is None:
        return None
    more = (f" (the bundled model's predictor: {MEASURED_GATE_RECALL}, or per layer pair "
            f"{list(MEASURED_GATE_RECALL_PER_LAYER)}), or None for no gate predictions")
    if isinstance(gate_recall, np.ndarray):
        gate_recall = gate_recall.tolist()  # plain floats (a 0-d array gives one)
    values = list(gate_recall) if isinstance(gate_recall, (list, tuple)) else [gate_recall]
    if not values:
        raise ValueError(f"gate_recall={gate_recall!r}: a share in [0, 1] or one per layer pair{more}.")
    for v in values:
        _check_share("gate_recall", v, more)
    return np.asarray(values, dtype=float)


def _check_share(name: str, v, more: str = "") -> None:
    """``name=v`` is None or a share in [0, 1] (``more``: what else the message says)."""
    if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1):
        raise ValueError(f"{name}={v!r}: a share in [0, 1]{more}.")


def _modeled_draft(recall, acceptance, replace_fraction, bits, seed, k_max) -> ModeledDraft:
    if recall is not None and replace_fraction is not None:
        raise ValueError(f"recall={recall!r} and replace_fraction={replace_fraction!r}: they are one knob "
                         "(recall = 1 - replace_fraction); give one of them.")
    for name, v in (("recall", recall), ("acceptance", acceptance), ("replace_fraction", replace_fraction)):
        _check_share(name, v)
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max={k_max!r}: use an integer >= 0 (0 models no draft chains).")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed={seed!r}: use an integer.")
    if replace_fraction is not None:
        recall = 1.0 - replace_fraction
    if isinstance(bits, bool) or bits not in MEASURED_DRAFT:
        raise ValueError(f"draft_bits={bits!r}: use one of {sorted(MEASURED_DRAFT)} (the bits of a draft the "
                         "replay can price, with measured defaults).")
    measured = MEASURED_DRAFT[bits]
    defaults = recall is None and acceptance is None
    return ModeledDraft(float(recall if recall is not None else measured.recall),
                        float(acceptance if acceptance is not None else measured.acceptance), int(seed), bits,
                        defaults)


def _add_chains(s: RoutedSequence, K: int, draft: ModeledDraft, text_id: int, reject_id: int,
                num_experts: list[int], acc_rng: np.random.Generator, recall_rng: np.random.Generator) -> None:
    """Per window start w (the committed token tokens[w] at position P + w): the modeled draft's chain of K
    tokens, its routing, and the target's routing and argmax over [last, d1..dK]."""
    W = len(s.decode)  # window starts: every committed token but the last
    L, k = s.decode.shape[1], s.decode.shape[2]
    # verification row j of window w feeds the text's token at position P + w + j: decode row w + j
    padded = np.concatenate([s.decode, np.full((K + 1, L, k), -1, s.decode.dtype)])
    verify = padded[np.arange(W)[:, None] + np.arange(K + 1)[None, :]]  # [W, K+1, L, k]; past the end: -1
    forecast = verify[:, :K]
    kept = recall_rng.random(forecast.shape) < draft.recall
    drafts_routing = replace_experts(forecast, ~kept, num_experts, recall_rng)
    accepted = np.cumprod(acc_rng.random((W, K)) < draft.acceptance, axis=1).sum(1)  # leading accepted run
    drafts = np.where(np.arange(K)[None, :] < accepted[:, None], text_id, reject_id).astype(np.int32)
    s.draft_tokens = drafts
    s.draft_routing = drafts_routing
    s.verify_routing = verify
    s.verify_tokens = np.full((W, K + 1), text_id, np.int32)  # the target's argmax: the text's next token
