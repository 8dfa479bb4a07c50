"""Is speculative decoding exact on this model family? An empirical check on a tiny sibling, before any work.

Speculation drafts K tokens one step at a time on the target's cache, rewinds it, feeds the target K+1 tokens in
one verification pass and then rewinds the cache past the rejected ones. Both steps are exact only if the family's multi-token forward on a non-empty cache computes what K+1 single
decoding steps would, and if rewinding (crop, or checkpoint + recompute) leaves the cache as if the rejected tokens
had never been fed. Layer kinds say a lot (:func:`rollback_blockers`) but not everything: transformers 5.24's
sparse-attention indexers (DeepSeek-V3.2, GLM-DSA) select different keys in a multi-token pass than in a decoding
step, and some conv layers cannot run a multi-token pass shorter than their kernel. So the engine also runs the
two checks below on a tiny random model of the same family (same code, tiny sizes, built from transformers' own
config class), once per family, dtype and verification mode per process, and refuses speculative strategies
where they fail.

The dtype matters. A multi-token pass rounds differently from one-token passes (its matmuls have more rows), by
~1e-7 in float32 but by whole bf16 steps in bfloat16, where that rounding alone can exceed a structural
difference on a tiny model. So with ``verify="batched"`` the structural checks run in float32 (where a real
difference stands out by orders of magnitude) and the run dtype is checked for running the pattern at all; with
``verify="exact"`` (one-token verification) the checks run in the run dtype itself and must agree bit for bit.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from ..model.families import tiny_family_model
from .kv import SequenceCache

# (prefix, pass) shapes: prefixes below and above the tiny configs' sliding windows (8) and indexer top-k (4),
# passes of K + 1 = 2 and 4 tokens (a 2-token pass is where a conv kernel of 4 or an indexer top-k bites)
SHAPES = ((6, 2), (6, 4), (16, 2), (16, 4))
NEXT = 2
# float32 tiny models agree to ~1e-7 where the paths are the same computation; a real difference is 1e-3 or more
TOLERANCE = 1e-4


def _feed(model, seq: SequenceCache, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids, **seq.inputs(ids.shape[1], ids.device))
    seq.fed(ids.shape[1], out)
    return out.logits[0].float()


def _steps(model, seq: SequenceCache, ids: torch.Tensor) -> torch.Tensor:
    return torch.cat([_feed(model, seq, ids[:, i:i + 1]) for i in range(ids.shape[1])])


def check_speculation(model, verify: str = "batched", tolerance: float | None = TOLERANCE) -> str | None:
    """None if verification + rewind are exact on ``model`` (itself: call on a small model), else why not.
    ``verify="exact"``: the window is verified by one-token passes (what ``Engine(verify="exact")`` runs).
    ``tolerance``: the largest logit gap accepted (0: bit for bit; None: only check that the pattern runs)."""
    for prefix, n_pass in SHAPES:
        for keep in sorted({1, n_pass - 1}):
            why = _check_window(model, prefix, n_pass, keep, verify, tolerance)
            if why:
                return why
    return None


def _check_window(model, prefix: int, n_pass: int, keep: int, verify: str = "batched",
                  tolerance: float | None = TOLERANCE) -> str | None:
    """One window as the speculative loop runs it: ``prefix`` tokens, the draft's ``n_pass - 1`` steps, rewind,
    an ``n_pass``-token verification, rewind to ``keep`` of them (checkpoint + recompute where recurrent), NEXT
    more tokens; compared with a cache that only ever decoded the kept tokens, step by step. ``verify="exact"``:
    the verification decodes the ``keep`` kept tokens one at a time (greedy exact verification stops there, so
    no rewind follows), and decoding goes on one token at a time."""
    vocab = model.config.get_text_config().vocab_size
    ids = ((torch.arange(prefix + n_pass + NEXT) * 7 + 5) % vocab)[None]
    head, window, after = ids[:, :prefix], ids[:, prefix:prefix + n_pass], ids[:, prefix + n_pass:]
    with torch.no_grad():
        ref = SequenceCache(model)
        _feed(model, ref, head)
        stepped = _steps(model, ref, torch.cat([window[:, :keep], after], 1))
        seq = SequenceCache(model, rewindable=True)
        _feed(model, seq, head)
        ck = seq.checkpoint()
        _steps(model, seq, window[:, :n_pass - 1])
        _recompute(model, seq, window, seq.rewind(prefix, ck), prefix, prefix)
        if verify == "exact":
            verified = _steps(model, seq, window[:, :keep])
        else:
            verified = _feed(model, seq, window)
        gap = (verified[:keep] - stepped[:keep]).abs().max().item()
        if tolerance is not None and not gap <= tolerance:
            return (f"a {n_pass}-token verification pass differs from {n_pass} decoding steps (logits by {gap:.2g}) "
                    f"in this transformers version ({_dtype_name(model)})")
        if verify != "exact":
            _recompute(model, seq, window, seq.rewind(prefix + keep, ck), prefix, prefix + keep)
        tail = _steps(model, seq, after) if verify == "exact" else _feed(model, seq, after)
        gap = (tail - stepped[keep:]).abs().max().item()
    if tolerance is not None and not gap <= tolerance:
        return (f"after rewinding past rejected tokens the cache differs from one that never saw them (logits by "
                f"{gap:.2g}, {_dtype_name(model)})")
    return None


def _dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")


def _recompute(model, seq: SequenceCache, window: torch.Tensor, redo: int, prefix: int, length: int) -> None:
    """Feed again the ``redo`` window tokens before ``length`` that a restored checkpoint dropped."""
    if redo:
        _feed(model, seq, window[:, length - prefix - redo:length - prefix])


def model_speculation_check(model, model_type: str, verify: str = "batched") -> str | None:
    """:func:`family_speculation_check` for ``model``'s family ``model_type``, in the dtype ``model`` runs in."""
    return family_speculation_check(model_type, _dtype_name(model), verify)


@lru_cache(maxsize=None)
def family_speculation_check(model_type: str, dtype: str = "float32", verify: str = "batched") -> str | None:
    """:func:`check_speculation` on a tiny random model of ``model_type`` in ``dtype`` (cached), for verification
    mode ``verify``. None also when no tiny model of the family can be built: then the layer-kind rule
    (:func:`rollback_blockers`) is all the engine has."""
    try:
        tiny = tiny_family_model(model_type, seed=0)
    except Exception:  # noqa: BLE001 - a family the tiny builder does not know is not evidence against it
        return None
    low = getattr(torch, dtype)
    try:
        if verify == "exact":  # one-token verification: bit for bit, in the run dtype
            return check_speculation(tiny.to(low), "exact", tolerance=0.0)
        why = check_speculation(tiny)  # structure, in float32 (see the module docstring)
        if why and family_speculation_check(model_type, dtype, "exact") is None:
            return why + "; Engine(..., verify='exact') verifies in one-token passes and is exact on this family"
        if why or low == torch.float32:
            return why
        return check_speculation(tiny.to(low), "batched", tolerance=None)  # the pattern runs in the run dtype
    except Exception as exc:  # noqa: BLE001 - the family's own forward fails on the pattern speculation needs
        return (f"a short multi-token pass on a non-empty cache fails in transformers ({dtype}): "
                f"{type(exc).__name__}: {exc}")


def tie_steps(logits: torch.Tensor) -> float:
    """How near a tie the greedy choice of one row of ``logits`` is: top-1 minus top-2, in units in the last place
    of the logits' dtype at the top-1 value (bf16: one step in [4, 8) is 2⁻⁵ = 0.03125). Where
    speculative verification in bf16/fp16 departs from token-by-token decoding, this is small (docs/lossless.md)."""
    top = logits.detach().float().topk(2).values.tolist()
    info = torch.finfo(logits.dtype)
    ulp = info.eps * 2.0 ** math.floor(math.log2(abs(top[0]))) if top[0] else info.tiny
    return (top[0] - top[1]) / ulp
