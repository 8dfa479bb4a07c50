"""Record a model's routing once (``sl.record``), for :func:`specter_lab.analysis.replay.replay` to price every strategy.

Greedy decoding, two passes per prompt, both through the same expert code as a live run (ascending sums, the
slot-view matmuls), on the model's own cache:

1. **autoregressive**: the prefill, then one target forward per token: the routing of each forward and the gate
   lookahead's predictions (layer l+1's router on layer l's input) — what every non-speculative strategy sees;
2. **chains** (``k_max > 0``): for every window start, the draft's greedy chain of ``k_max`` tokens with its
   routing, then one target pass over ``[last, d1..dk_max]`` with its routing and argmax — what a speculative
   window of any K ≤ k_max sees (verification is causal), and what the oracle looks at.

Costs about ``(k_max + 2)`` forwards per generated token (printed with the memory at the end). Long recordings
keep what they finished: ``out=path`` saves the trace after every sequence and ``resume=True`` goes on from it
(:func:`record`; the file's format is unchanged, ``meta["recording"]`` says what it was recorded with).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..decode.kv import SequenceCache
from ..errors import ResumeMismatch
from ..model import attached, inspect_model
from ..model.identity import model_identity
from ..model.experts import exact_forward
from ..offload.runtime import gate_ids
from ..run.quant import DraftExperts, QuantSpec, shared_draft
from ..traces.trace_file import RoutedSequence, RoutingTrace, load_trace

__all__ = ["record"]


class _Recorder:
    """The runtime attached while recording: exact experts (target) or the draft's low-bit ones, routing kept."""

    def __init__(self, info, draft: DraftExperts | None) -> None:
        self.info = info
        self.draft = draft
        self.mode = "target"
        self.gate_on = False
        self.routing: dict[int, np.ndarray] = {}
        self.gate: dict[int, np.ndarray] = {}
        self._views: dict[tuple[int, int], dict] = {}

    def _target_weights(self, layer: int, mod, e: int, device) -> dict:
        # the same views a device slot hands the live runtime (with the transposed view it multiplies by), so the
        # recorded hidden states, hence routing, are the live run's bit for bit
        key = (layer, e)
        if key in self._views:
            return self._views[key]
        w = {n: getattr(mod, n)[e] for n in self.info.layers[layer].param_names}
        offloaded = next(iter(w.values())).device != device  # experts in host memory (placed for offloading)
        if offloaded:
            w = {n: t.to(device, non_blocking=True) for n, t in w.items()}  # streamed per use, like a demand copy
        if not mod.is_transposed:
            w.update({f"{n}.t": t.t() for n, t in list(w.items()) if not n.endswith("_bias")})
        if not offloaded:
            self._views[key] = w
        return w

    def experts_forward(self, layer: int, mod, x, idx, w):
        idx_np = idx.detach().cpu().numpy()
        self.routing[layer] = idx_np
        if self.gate_on and layer + 1 < self.info.num_layers:
            pred = gate_ids(self.info.layers[layer + 1], x)
            if pred is not None:
                self.gate[layer] = pred
        if self.mode == "draft":
            return exact_forward(mod, x, idx, w, lambda e: self.draft.weights(layer, e), idx_np)
        return exact_forward(mod, x, idx, w, lambda e: self._target_weights(layer, mod, e, x.device), idx_np)


def _stack(per_layer: dict[int, np.ndarray], n_layers: int, k: int, rows: int) -> np.ndarray:
    """[rows, L, k] int16 from layer → [rows, k_l] (-1 where a layer is missing or routes fewer than k)."""
    out = np.full((rows, n_layers, k), -1, dtype=np.int16)
    for layer, a in per_layer.items():
        out[:, layer, : a.shape[1]] = a
    return out


class _Pass:
    """One forward at a time on the model's own cache, with the recorder in a mode."""

    def __init__(self, model, rec: _Recorder, device, rewindable: bool, bar) -> None:
        self.model, self.rec, self.device, self.bar = model, rec, device, bar
        self.kv = SequenceCache(model, rewindable)

    def __call__(self, ids: list[int], mode: str, keep: int = 1) -> tuple[np.ndarray, np.ndarray, dict]:
        """(argmax per kept row, routing [T, L, k], gate per layer) of one forward of ``ids``."""
        rec, info = self.rec, self.rec.info
        rec.mode, rec.routing, rec.gate = mode, {}, {}
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, logits_to_keep=keep, **self.kv.inputs(x.shape[1], self.device))
        self.kv.fed(x.shape[1], out)
        self.bar.update(1)
        routing = _stack(rec.routing, info.num_layers, info.top_k, len(ids))
        return torch.argmax(out.logits[0], dim=-1).cpu().numpy(), routing, dict(rec.gate)


def _autoregressive(step: _Pass, ids: list[int], max_new: int, eos: set[int]):
    info = step.rec.info
    step.rec.gate_on = True
    nxt, prefill, gate = step(ids, "target")
    tokens, decode, gates = [int(nxt[-1])], [], [_stack(gate, info.num_layers, info.top_k, len(ids))]
    while len(tokens) < max_new and tokens[-1] not in eos:
        nxt, routing, gate = step([tokens[-1]], "target")
        tokens.append(int(nxt[-1]))
        decode.append(routing)
        gates.append(_stack(gate, info.num_layers, info.top_k, 1))
    step.rec.gate_on = False
    decode_arr = np.concatenate(decode) if decode else np.zeros((0, info.num_layers, info.top_k), np.int16)
    has_gate = any(l.router is not None for l in info.layers[1:])
    return prefill, tokens, decode_arr, (np.concatenate(gates) if has_gate else None)


def _chains(step: _Pass, ids: list[int], tokens: list[int], k_max: int):
    """Draft chain + verification pass from every window start (positions P .. P+N-2)."""
    step(ids, "target")  # the prefill: the cache now holds the prompt
    d_tok, d_route, v_route, v_tok = [], [], [], []
    for w in range(len(tokens) - 1):
        n, last, x, drafts, routes = step.kv.length, tokens[w], tokens[w], [], []
        for _ in range(k_max):
            nxt, routing, _ = step([x], "draft")
            x = int(nxt[-1])
            drafts.append(x)
            routes.append(routing)
        step.kv.rewind(n, None)
        nxt, routing, _ = step([last] + drafts, "target", keep=0)
        step.kv.rewind(n + 1, None)  # keep `last`: the next window starts after it
        d_tok.append(drafts)
        d_route.append(np.concatenate(routes))
        v_route.append(routing)
        v_tok.append(nxt)
    as_i32 = lambda a: np.asarray(a, dtype=np.int32)
    return as_i32(d_tok), np.stack(d_route), np.stack(v_route), as_i32(v_tok)


def record(model, tokenizer=None, prompts: Sequence = (), *, max_new_tokens: int = 48, k_max: int = 16,
           draft: QuantSpec | None = None, progress: bool = True, out: "str | Path | None" = None,
           resume: bool = False) -> RoutingTrace:
    """Record ``model``'s greedy routing over ``prompts`` (strings need the tokenizer, or token-id lists), with the
    draft chains of a ``draft`` (default int4-g64 RTN) up to ``k_max`` tokens (0: autoregressive only).

    Works on any local HF MoE checkpoint, on the CPU or a GPU; prints time and peak memory per generated token.
    Save it with ``trace.save(path)``; replay every strategy with :func:`specter_lab.analysis.replay`.

    ``out=path`` writes the trace to ``path`` after every sequence (whole, :mod:`specter_lab.atomic`), so a kill,
    a kernel restart or an out-of-memory error loses at most the sequence in progress; what is on disk is a valid
    trace of the sequences finished. ``resume=True`` goes on from that file: the sequences already there are
    skipped (the progress bar says how many), after checking that they were recorded from these prompts (in
    order; more prompts than the file holds are fine), by this model (config digest and weights' fingerprint,
    :mod:`specter_lab.model.identity`), on this device, with the same ``max_new_tokens``, ``k_max`` and draft;
    a difference is refused as :class:`~specter_lab.errors.ResumeMismatch` naming the field, never mixed in.
    Without ``resume=True`` an existing ``out`` is refused (nothing recorded is overwritten by accident)."""
    info = inspect_model(model)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt (a string or a list of token ids).")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: use an integer >= 1.")
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max={k_max!r}: use an integer >= 0 (0 records no draft chains).")
    spec = draft if draft is not None else QuantSpec()
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"draft={draft!r}: record a quantized draft, a sl.QuantSpec (the other draft variants "
                        "depend on what the cache holds, so they cannot be recorded apart from a strategy).")
    if resume and out is None:
        raise ValueError("resume=True needs out=: the trace file to go on from (and to keep writing).")
    if out is not None and Path(out).is_dir():  # refused now, not after the first sequence's minutes
        raise ValueError(f"out={str(out)!r} is a folder: give a file name (e.g. trace.npz).")
    if out is not None and not Path(out).parent.is_dir():
        raise ValueError(f"out={str(out)!r}: its folder {str(Path(out).parent)!r} does not exist; create it first.")
    device = model.get_input_embeddings().weight.device
    eos = set(info.eos_token_ids)
    seqs_ids = [_encode(p, tokenizer, info.vocab) for p in prompts]
    if k_max and SequenceCache(model, True).recurrent:
        raise ValueError(f"k_max={k_max}: {info.model_type} has recurrent cache layers, whose rewind recomputes "
                         "tokens; chains cannot be recorded for it yet. Record with k_max=0 (autoregressive "
                         "strategies replay exactly).")
    job = _Job(model, info, device, spec, k_max, max_new_tokens, len(seqs_ids))
    done, seconds_before = on_disk(out, resume, job.identity, seqs_ids) if out is not None else ([], 0.0)
    seqs = list(done)
    if done and progress:
        print(f"{out}: {len(done)} of {len(seqs_ids)} sequences already on disk, recording the other "
              f"{len(seqs_ids) - len(done)}")
    t0 = time.perf_counter()
    todo = seqs_ids[len(done):]
    if todo:
        dexp = shared_draft(model, info, spec, device) if k_max else None  # the engines' own, when they made it
        rec = _Recorder(info, dexp)
        total = sum(len(ids) and max_new_tokens * (1 + (k_max + 1) if k_max else 1) for ids in todo)
        with attached(model, info, rec), torch.no_grad(), \
                tqdm(total=total, desc=job.progress_label(len(seqs)) if out is not None else "record (forwards)",
                     unit="fwd", disable=not progress) as bar:
            for ids in todo:
                prefill, tokens, decode, gate = _autoregressive(_Pass(model, rec, device, False, bar), ids,
                                                                max_new_tokens, eos)
                chains = _chains(_Pass(model, rec, device, True, bar), ids, tokens, k_max) if k_max else (None,) * 4
                seqs.append(RoutedSequence(np.asarray(ids, np.int32), np.asarray(tokens, np.int32), prefill, decode,
                                           gate, *chains))
                if out is not None:  # this sequence is safe from here on, whatever happens to the process
                    job.trace(seqs, seconds_before + time.perf_counter() - t0).save(out)
                    bar.set_description(job.progress_label(len(seqs)))
            bar.total = bar.n
    trace = job.trace(seqs, seconds_before + time.perf_counter() - t0)
    if progress and todo:
        m = trace.meta
        print(f"recorded {m['tokens']} tokens in {m['seconds']:.1f} s ({1e3 * m['seconds_per_token']:.0f} ms/token, "
              f"k_max={k_max}), peak host memory {m['peak_rss_gib']:.2f} GiB"
              + (f", peak GPU {m['peak_gpu_gib']:.2f} GiB" if "peak_gpu_gib" in m else ""))
    return trace


class _Job:
    """What every save of one recording shares: the model's identity and settings (checked by a resume), and the
    trace of the sequences so far."""

    def __init__(self, model, info, device, spec: QuantSpec, k_max: int, max_new_tokens: int, planned: int) -> None:
        self.model, self.info, self.device, self.spec, self.k_max = model, info, device, spec, k_max
        self.planned = planned
        self.config = model.config.to_dict()  # as it is now: attaching the recorder changes its run-time keys
        self.draft = {"bits": spec.bits, "group_size": spec.group_size, "method": spec.method} if k_max else None
        self.identity = {"model": model_identity(model), "device": device.type, "max_new_tokens": max_new_tokens,
                         "k_max": k_max, "draft": self.draft}

    def progress_label(self, n_done: int) -> str:
        return f"record ({n_done}/{self.planned} sequences on disk)"

    def trace(self, seqs: list[RoutedSequence], seconds: float) -> RoutingTrace:
        n_tok = sum(len(s.tokens) for s in seqs)
        meta = {"seconds": seconds, "seconds_per_token": seconds / n_tok, "tokens": n_tok,
                "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                "device": str(self.device), "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
                "recording": {**self.identity, "sequences_planned": self.planned}}
        if self.device.type == "cuda":
            meta["peak_gpu_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        name = getattr(self.model.config, "_name_or_path", "") or self.info.model_type
        source = f"recorded: {name} on {self.device}" + (f", draft {self.spec.label}" if self.k_max else "")
        trace = RoutingTrace(self.config, list(seqs), self.k_max, self.draft, source, meta)
        return trace.validate([l.num_experts for l in self.info.layers])


def on_disk(out: "str | Path", resume: bool, identity: dict, seqs_ids: list[list[int]]):
    """The sequences a resumed recording keeps from ``out`` (and the seconds they took), after checking that the
    file was recorded by the same model and settings from the same first prompts; ``([], 0.0)`` when there is no
    file yet. Raises :class:`ResumeMismatch` naming the field that differs."""
    path = Path(out)
    if not path.exists():
        return [], 0.0
    where = str(path)
    if not resume:
        raise ResumeMismatch(f"out={where!r} already holds a file: pass resume=True to go on from the sequences "
                             "it holds (`--resume` on the command line), or give another path (nothing is "
                             "overwritten by accident).", where, "resume", True, False)
    trace = load_trace(path)
    found = trace.meta.get("recording")
    if not isinstance(found, dict):
        raise ResumeMismatch(f"{where!r} was not written by sl.record(out=...) (its meta has no 'recording'), so "
                             "what it was recorded with is not known: record to another path.", where, "recording",
                             None, identity)
    for field, want in _flat(identity):
        got = _get(found, field)
        if got != want:
            raise ResumeMismatch(f"{where!r}: resume=True, but its sequences were recorded with {field}={got!r} and "
                                 f"this call has {field}={want!r} ({_WHY.get(field, 'another setting')}): they "
                                 "would not be this recording's. Call again with the file's setting, or record to "
                                 "another path.", where, field, got, want)
    if len(trace.sequences) > len(seqs_ids):
        raise ResumeMismatch(f"{where!r} holds {len(trace.sequences)} sequences but this call gives "
                             f"{len(seqs_ids)} prompts: give at least the prompts it was recorded from.", where,
                             "prompts", len(trace.sequences), len(seqs_ids))
    for i, s in enumerate(trace.sequences):
        if s.prompt.tolist() != list(seqs_ids[i]):
            raise ResumeMismatch(f"{where!r}: sequence {i} was recorded from another prompt than prompts[{i}] "
                                 f"({len(s.prompt)} tokens against {len(seqs_ids[i])}, first difference at token "
                                 f"{_first_difference(s.prompt.tolist(), seqs_ids[i])}): give the prompts it was "
                                 "recorded from, in the same order.", where, f"prompt {i}", s.prompt.tolist(),
                                 list(seqs_ids[i]))
    return trace.sequences, float(trace.meta.get("seconds", 0.0))


_WHY = {"model.type": "another model family", "model.config": "another config: another model",
        "model.weights": "other weights: another checkpoint, fine-tune or dtype",
        "device": "another device: its floats, and so its routing, may differ",
        "max_new_tokens": "another length", "k_max": "another draft chain length", "draft": "another draft"}


def _flat(identity: dict, prefix: str = ""):
    """``("model.weights", value)`` pairs, nested dicts opened except the draft (one setting)."""
    for k, v in identity.items():
        if isinstance(v, dict) and k != "draft":
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _encode(prompt, tokenizer, vocab: int) -> list[int]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a prompt is a string but no tokenizer was given: pass tokenizer= or token ids.")
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    else:
        ids = [int(t) for t in prompt]
    if not ids or not all(0 <= t < vocab for t in ids):
        raise ValueError(f"prompt {prompt!r}: empty, or token ids outside the vocabulary [0, {vocab}).")
    return ids
