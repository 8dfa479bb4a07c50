"""The model's own cache for one sequence, obtained the way ``generate()`` does, and rewound exactly after a draft
window, whatever its layers are.

Layer kinds (transformers 5.x ``cache_utils``) and how each goes back to an earlier length:

* attention, sliding-window, indexed, dummy layers — ``crop`` (with past recording on, so a sliding window or a
  conv window can give back what a rejected draft pushed out of it);
* linear-attention / recurrent layers (gated delta-net, Mamba, KDA: ``LinearAttentionCacheLayerMixin``) — their
  recurrent state folds every token in and cannot be cropped: it is restored from a :class:`Checkpoint` taken
  at the start of the window, and the tokens that stay are recomputed (the caller's ``recompute`` forward); their
  conv windows crop like attention;
* MiniMax's lightning attention (``MiniMaxCache.linear_cache``) — the states are replaced, never updated in
  place, so a checkpoint is a list of references (free); its attention layers crop one by one (the cache's own
  ``crop`` refuses).

A cache holding a layer kind not listed cannot be rewound exactly: :func:`rollback_blockers` names it, and the
engine refuses speculative strategies on that model before generating.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from ..model.families import activate_past_recording

__all__ = ["SequenceCache", "Checkpoint", "rollback_blockers", "cache_layer_kinds"]

_CROPPABLE = ("DynamicLayer", "DynamicSlidingWindowLayer", "DynamicIndexedLayer", "DummyLayer")
_RECURRENT = ("LinearAttentionLayer", "LinearAttentionAndFullAttentionLayer",
              "LinearAttentionAndSlidingWindowAttentionLayer")


def _is_minimax(model) -> bool:
    return type(model).__name__.lower().startswith("minimax") and not model._supports_default_dynamic_cache()


def _minimax_cache(config):
    """MiniMaxCache whose length and mask queries look at the first full-attention layer. Upstream, with a linear
    layer 0 (the real MiniMax-Text-01 layout) it reports length 0, and a multi-token forward on a non-empty cache
    (a verification pass) gets a wrong causal mask."""
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    class AttnIndexedMiniMaxCache(MiniMaxCache):
        def __init__(self, attn_idx: int) -> None:
            super().__init__()
            self._attn_idx = attn_idx

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return super().get_seq_length(self._attn_idx if layer_idx == 0 else layer_idx)

        def get_mask_sizes(self, query_length, layer_idx: int = 0):
            return super().get_mask_sizes(query_length, self._attn_idx if layer_idx == 0 else layer_idx)

    types = list(getattr(config, "layer_types", None) or [])
    return AttnIndexedMiniMaxCache(types.index("full_attention") if "full_attention" in types else 0)


def _new_cache(model):
    """The cache ``generate()`` would start from: ``DynamicCache(config)`` for every model that supports it (it
    builds one layer object per ``config.layer_types``: attention, sliding, linear attention, ...), MiniMax's own
    (fixed) cache, else None — the model then builds its own on the prefill."""
    from transformers import DynamicCache

    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    if model._supports_default_dynamic_cache():
        return DynamicCache(config=config)
    if _is_minimax(model):
        return _minimax_cache(config)
    return None


def cache_layer_kinds(model) -> list[str]:
    """Class names of the cache's layers as the model will build them (no forward run), or ``[cache class]`` when
    the model builds its own cache."""
    cache = _new_cache(model)
    if cache is None or not getattr(cache, "layers", None):
        return [type(cache).__name__] if cache is not None else ["(built by the model)"]
    return [type(layer).__name__ for layer in cache.layers]


def rollback_blockers(model) -> list[str]:
    """Layer kinds in this model's cache that cannot be rewound exactly (empty: speculation is exact here)."""
    if _is_minimax(model):
        return []
    cache = _new_cache(model)
    if cache is None:
        return ["a cache the model builds itself (unknown layer kinds)"]
    if not getattr(cache, "layers", None):  # lazy: plain attention layers appended on use
        return []
    return sorted({type(l).__name__ for l in cache.layers if type(l).__name__ not in _CROPPABLE + _RECURRENT})


@dataclass
class Checkpoint:
    """The cache at ``length`` tokens, restorable: clones of the recurrent states (they are updated in place),
    or MiniMax's state list (replaced, never mutated: references suffice)."""

    length: int
    states: dict = field(default_factory=dict)  # (layer, "recurrent" | "conv", state index) -> tensor
    linear: list | None = None

    @property
    def nbytes(self) -> int:
        """Bytes copied to take (and again to restore) this checkpoint; MiniMax's references cost nothing."""
        return sum(t.numel() * t.element_size() for t in self.states.values())


def _past_recording_crops_zero() -> bool:
    """``crop(0)`` shrinks recorded windows from transformers 5.18 on; before, a non-negative value was an absolute
    length, so ``crop(0)`` would have emptied the cache."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__.split("+")[0]) >= Version("5.18")


class SequenceCache:
    """The cache one generation decodes with, its length (counted here, from the tokens fed: some caches cannot
    tell it), the explicit position ids every forward gets (as ``generate()`` passes them), and exact rewinding.

    ``rewindable=False`` (plain decoding): no past recording, so sliding and conv windows stay at their size."""

    def __init__(self, model, rewindable: bool = False) -> None:
        self.cache = _new_cache(model)
        self.rewindable = rewindable
        self.length = 0
        params = inspect.signature(model.forward).parameters
        self.kwarg = "cache" if "cache" in params else "past_key_values"
        self._positions = "position_ids" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
        self._crop_zero = _past_recording_crops_zero()
        if self.cache is not None and rewindable:
            activate_past_recording(self.cache)

    def inputs(self, n_tokens: int, device) -> dict:
        """Keyword arguments for a forward of ``n_tokens`` new tokens after the cached ones."""
        kw = {self.kwarg: self.cache, "use_cache": True}
        if self._positions:
            kw["position_ids"] = torch.arange(self.length, self.length + n_tokens, device=device).unsqueeze(0)
        return kw

    def fed(self, n_tokens: int, output) -> None:
        """A forward of ``n_tokens`` ran; keep the cache the model returned (it builds its own on the prefill)."""
        if self.cache is None:
            self.cache = getattr(output, "cache", None) or getattr(output, "past_key_values", None)
            if self.rewindable and self.cache is not None:
                activate_past_recording(self.cache)
        self.length += n_tokens

    def _fill_state_history(self, n: int) -> None:
        """From transformers 5.25 a linear layer's crop takes its recurrent state from the states it kept per token,
        and none are kept here (:func:`~specter_lab.model.families.activate_past_recording`): give it ``n`` copies
        of the current one to take, since the checkpoint's state replaces it right after."""
        for _, layer in self._linear_layers():
            history = getattr(layer, "recurrent_states_history", None)
            if history is None:
                continue
            for s, kept in history.items():
                if len(kept) < n and layer.recurrent_states.get(s) is not None:
                    history[s] = [layer.recurrent_states[s]] * n

    # ------------------------------------------------------------------ rewinding
    @property
    def recurrent(self) -> bool:
        """True when rewinding needs a checkpoint (and a recompute of the tokens that stay)."""
        return self._linear_layers() != [] or hasattr(self.cache, "linear_cache")

    def _linear_layers(self) -> list:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin

        return [(i, l) for i, l in enumerate(getattr(self.cache, "layers", []))
                if isinstance(l, LinearAttentionCacheLayerMixin)]

    def checkpoint(self) -> Checkpoint | None:
        """What the cache holds now, for :meth:`rewind` (None where cropping alone rewinds exactly)."""
        if not self.recurrent:
            return None
        ck = Checkpoint(self.length)
        if hasattr(self.cache, "linear_cache"):
            ck.linear = list(self.cache.linear_cache)
        for i, layer in self._linear_layers():
            for kind in ("recurrent", "conv"):
                for s, t in getattr(layer, f"{kind}_states").items():
                    if t is not None:
                        ck.states[(i, kind, s)] = t.clone()
        return ck

    def rewind(self, length: int, checkpoint: Checkpoint | None) -> int:
        """Go back to ``length`` tokens. Returns how many tokens past the checkpoint must be recomputed (fed again
        by the caller) to reach ``length``: 0 where cropping suffices."""
        extra = self.length - length
        if extra < 0:
            raise ValueError(f"cannot rewind a cache of {self.length} tokens forward to {length}")
        if checkpoint is None or extra == 0:
            self._crop(extra)
            return 0
        self._crop(self.length - checkpoint.length, restoring=True)
        if checkpoint.linear is not None:
            self.cache.linear_cache = list(checkpoint.linear)
        for (i, kind, s), t in checkpoint.states.items():
            # conv windows too: cropping a recorded window after several windows can leave it shorter than the
            # kernel (seen on Bailing-hybrid, transformers 5.24); assigned, not copied, as their length varies
            getattr(self.cache.layers[i], f"{kind}_states")[s] = t.clone()
        return length - checkpoint.length

    def _crop(self, n: int, restoring: bool = False) -> None:
        """Remove the last ``n`` tokens (``n == 0`` still shrinks recorded windows back to their size).
        ``restoring``: the recurrent states are restored from a checkpoint right after."""
        if n == 0 and not (self.rewindable and self._crop_zero):
            return
        if restoring:
            self._fill_state_history(n)
        self.length -= n
        if hasattr(self.cache, "linear_cache"):  # MiniMaxCache.crop refuses; its attention layers crop
            for layer in self.cache.layers:
                layer.crop(-n)
        else:
            self.cache.crop(-n)
