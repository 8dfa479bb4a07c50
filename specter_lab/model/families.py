"""Tiny random models of every transformers MoE family that routes its experts through the experts interface.

Why this module exists: specter_lab offloads routed experts by hooking transformers' experts interface (classes
decorated with ``transformers.integrations.moe.use_experts_implementation``, dispatched by
``config._experts_implementation``). Every family that uses that decorator is therefore a family the toolkit can
run, and each should be covered by a fast CPU test. Instead of keeping a hand-written list, the families are
enumerated from the *installed* transformers at run time, so a new release adds its new families by itself.

The module is standalone on purpose (it imports only torch, transformers and the standard library, never
specter_lab): the family sweep must keep working while the package itself is being restructured.

Public API:

- :func:`experts_interface_families` -- ``[(model_type, causal-LM class name), ...]`` found at run time.
- :func:`tiny_config` -- a tiny config of one family, built from transformers' own config class by a generic
  shrinker plus the small per-family table :data:`FAMILY_OVERRIDES`.
- :func:`tiny_family_model` -- the tiny model in eval mode, float32, with random biases / sinks / score-correction
  terms so that a wrong expert or a dropped bias changes the output.
- :func:`layer_kinds` -- what cache the model builds for itself and whether it can be cropped (the facts exact
  speculative rollback needs per cache kind).
- :data:`UNBUILDABLE` -- families that cannot be built tiny or cannot run on CPU, each with the exact reason.
- :data:`VARIANTS` -- extra named layouts of a family (``"minimax_linear_first"``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "activate_past_recording",
    "FAMILY_OVERRIDES",
    "UNBUILDABLE",
    "VARIANTS",
    "experts_interface_families",
    "find_experts_modules",
    "layer_kinds",
    "tiny_config",
    "tiny_family_model",
]

# --------------------------------------------------------------------------------------------------------------------
# Enumeration
# --------------------------------------------------------------------------------------------------------------------

_DECORATOR = "@use_experts_implementation"


def _class_source_file(model_type: str, class_name: str) -> Path | None:
    """The ``modeling_*.py`` file of ``model_type``'s package that defines ``class_name``, found without importing.

    ``model_type`` and the module folder differ for some types (``gemma4_text`` lives in ``models/gemma4``), so the
    folder comes from transformers' own ``model_type_to_module_name``; the file is the one that defines the class
    (a folder can hold several modeling files, e.g. ``data2vec``)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    spec = importlib.util.find_spec(f"transformers.models.{model_type_to_module_name(model_type)}")
    if spec is None or not spec.submodule_search_locations:
        return None
    pattern = re.compile(rf"^class {re.escape(class_name)}\(", re.MULTILINE)
    for folder in spec.submodule_search_locations:
        for path in sorted(Path(folder).glob("modeling_*.py")):
            if pattern.search(path.read_text(encoding="utf-8")):
                return path
    return None  # config-only packages (e.g. sarvam_moe in 5.24 ships no modeling file)


@lru_cache(maxsize=1)
def _decorated_forward_code() -> Any:
    """The code object of the ``forward`` that ``use_experts_implementation`` installs (the same for every class).

    Comparing code objects is a cheap, exact test for "this class really is decorated", immune to the decorator
    name appearing only in a comment or an unused import."""
    from transformers.integrations.moe import use_experts_implementation

    class _Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - never called
            return x

    return use_experts_implementation(_Probe).forward.__code__


def _is_experts_class(obj: Any) -> bool:
    """True for an ``nn.Module`` subclass whose forward is the experts-interface dispatcher."""
    forward = getattr(obj, "forward", None) if isinstance(obj, type) and issubclass(obj, nn.Module) else None
    return getattr(forward, "__code__", None) is _decorated_forward_code()


def _module_uses_experts_interface(model_type: str, class_name: str) -> bool:
    """Import the family's modeling module and confirm that it holds at least one decorated experts class."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    package = importlib.import_module(f"transformers.models.{model_type_to_module_name(model_type)}")
    model_cls = getattr(package, class_name)
    module = sys.modules[model_cls.__module__]
    return any(_is_experts_class(obj) for obj in vars(module).values())


def experts_interface_families(verify: bool = True, dedupe: bool = True) -> list[tuple[str, str]]:
    """Every causal-LM family of the installed transformers whose routed experts use the experts interface.

    Walks ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and keeps the entries whose defining modeling file contains
    ``@use_experts_implementation`` (a text scan, no import). With ``verify`` each hit is also imported and checked
    for a class that really carries the decorator's dispatcher (about 1 s for ~60 modules). With ``dedupe`` a class
    registered under two model types (``qwen3_5_moe`` and ``qwen3_5_moe_text``) is listed once, under the first.

    Returns ``[(model_type, class_name), ...]`` in mapping order. Note that ``*_text`` model types (``gemma4_text``,
    ``aria_text``, ``inkling_text``, ...) live in their parent's folder; a scan of ``models/<model_type>/`` alone
    misses them.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found: list[tuple[str, str]] = []
    seen_classes: set[str] = set()
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if isinstance(class_name, (list, tuple)):  # defensive: some auto mappings hold several classes
            class_name = class_name[0]
        if dedupe and class_name in seen_classes:
            continue
        path = _class_source_file(model_type, class_name)
        if path is None or _DECORATOR not in path.read_text(encoding="utf-8"):
            continue
        if verify:
            try:
                if not _module_uses_experts_interface(model_type, class_name):
                    continue
            except Exception:  # an import error means the family cannot run here at all; keep it out of the sweep
                continue
        seen_classes.add(class_name)
        found.append((model_type, class_name))
    return found


def causal_lm_class(model_type: str) -> type[nn.Module]:
    """The causal-LM class transformers registers for ``model_type`` (imports its modeling module)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = VARIANTS.get(model_type, (model_type, {}))[0]
    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


# --------------------------------------------------------------------------------------------------------------------
# Tiny configs
# --------------------------------------------------------------------------------------------------------------------

#: Tiny values for size attributes, applied to every attribute of this name that the config class declares and
#: whose default is a number (``None`` means "feature off" and stays ``None``). Chosen so that every family builds
#: in well under a second and a 40-token generate takes about a second on one CPU thread.
_TINY_SIZES: dict[str, int] = {
    # embeddings / trunk
    "vocab_size": 256, "unpadded_vocab_size": 256, "vocab_size_per_layer_input": 256,
    "hidden_size": 64, "hidden_size_per_layer_input": 16, "max_position_embeddings": 512, "model_max_length": 512,
    # attention
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "v_head_dim": 16,
    "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 16,
    # multi-head latent attention (DeepSeek style)
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "o_lora_rank": 16,
    # sparse-attention indexers (DSA): a top-k below the 46-token sequence so the selection really selects
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4, "indexer_n_heads": 2, "indexer_head_dim": 16,
    "index_block_size": 4, "index_topk_blocks": 2, "index_num_heads": 2,
    # dense / shared MLPs
    "intermediate_size": 128, "dense_intermediate_size": 128, "prefix_dense_intermediate_size": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "shared_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32, "shared_experts_intermediate_size": 32,
    # routed experts: >= 4 experts and top-k >= 2 per layer (the offload tests use top_k + 1 cache slots)
    "num_experts": 8, "num_local_experts": 8, "n_routed_experts": 8, "moe_num_experts": 8,
    "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_k": 2, "moe_topk": 2, "top_k_experts": 2,
    "router_hidden_size": 16,
    # linear attention (gated delta net, KDA, lightning)
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_heads": 4, "linear_head_dim": 16,
    # Mamba 1 / 2: heads * head_dim == expand * hidden_size (2 * 64)
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_num_heads": 8, "mamba_head_dim": 16,
    "mamba_d_state": 16, "ssm_state_size": 16, "mamba_dt_rank": 8, "mamba_chunk_size": 16, "chunk_size": 16,
    # misc low-rank / per-layer-input widths
    "loop_gate_rank": 8, "hc_lowrank": 8, "ple_embed_dim": 16, "gated_norm_rank": 8,
}

#: Attributes clamped to ``min(default, cap)`` instead of set: a count that is 0 must stay 0 (feature off).
_TINY_CAPS: dict[str, int] = {
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1,
    "n_group": 2, "num_expert_group": 2, "topk_group": 2, "n_groups": 2, "mamba_n_groups": 1,
    "first_k_dense_replace": 1, "num_dense_layers": 1, "num_nextn_predict_layers": 0,
}

#: Token ids shared by every tiny model (inside the 256-token vocabulary).
_TOKEN_IDS: dict[str, int] = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}

#: Layer-type values whose layers attend through a sliding window (these get ``sliding_window = 8``).
_SLIDING_KINDS = ("sliding_attention", "hybrid_sliding", "chunked_attention")

#: Attributes that hold layer *indices* (not one entry per layer); remapped onto the picked layers.
_INDEX_LIST_ATTRS = ("mlp_only_layers", "local_layer_ids", "ple_layer_ids")

#: Per-layer list attributes that must not be treated as "one entry per layer" even if their length matches.
_NOT_PER_LAYER = ("time_step_limit", "architectures")

#: Most layers a tiny model gets from the generic layer picker.
_MAX_LAYERS = 4

#: Per-family config overrides applied after the generic shrinker, where the generic rules are not enough. Each
#: entry says why. Keys are model types (or :data:`VARIANTS` names).
FAMILY_OVERRIDES: dict[str, dict[str, Any]] = {
    # the defaults leave the routing width unset (None): the real checkpoints' configs set it
    "deepseek_v2": {"num_experts_per_tok": 2},
    "dots1": {"n_routed_experts": 8, "num_experts_per_tok": 2},
    # the only routing width the ZAYA code supports
    "zaya": {"num_experts_per_tok": 1},
    # MoE is off by default (dense Gemma 4): turn it on, as the MoE checkpoints do
    "gemma4_text": {"enable_moe_block": True, "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 32},
    # the default layout is all-Mamba: one attention layer so both cache kinds are exercised
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # attention every 8th layer and experts every 2nd: periods of 2 give one of each in two layers
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 1, "expert_layer_offset": 0},
    # no default layout; one dense layer first, as LFM2-MoE does, then a conv and an attention MoE layer
    "lfm2_moe": {"num_hidden_layers": 3, "num_dense_layers": 1,
                 "layer_types": ["conv", "full_attention", "conv"]},
}

#: Extra named layouts: name -> (model_type, tiny_config keyword overrides).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # MiniMax-Text-01 / M1 start with lightning (linear) layers; upstream's default config starts with a full
    # attention layer. The linear-first layout exercises MiniMaxCache's get_seq_length()/mask bug (see
    # hybrid_caches.md section 5.3), so the sweep covers both.
    "minimax_linear_first": ("minimax", {"linear_first": True}),
}

#: Families that cannot be built tiny or cannot run on CPU, with the exact reason.
UNBUILDABLE: dict[str, str] = {
    # transformers 5.24; each is the error the generic shrinker meets, left for a per-family override
    "dots1": "its default config leaves a size unset (None) that a tiny layout needs (TypeError in __init__)",
    "dots3_note": "its config validator requires the SWA head_dim to equal qk_nope + qk_rope dims; the shrinker "
                  "sets them independently",
    "gemma4": "a multimodal wrapper (ForConditionalGeneration); its text model is gemma4_text",
    "gemma4_text": "head_dim is a per-layer attribute (heterogeneous config); the shrinker sets it globally",
    "hunyuan_v1_moe": "its default config leaves the rope scaling base unset (None ** float in __init__)",
    "qwen4_exp": "its default config leaves two sizes unset (None // None in __init__)",
}


def _config_class(model_type: str) -> type:
    """The config class the causal-LM class is built from (the text config for multimodal wrappers' ``*ForCausalLM``)."""
    return causal_lm_class(model_type).config_class


def _fields(config_cls: type) -> set[str]:
    """Names the config class accepts as keyword arguments (its dataclass fields)."""
    if dataclasses.is_dataclass(config_cls):
        return {f.name for f in dataclasses.fields(config_cls)}
    import inspect

    return set(inspect.signature(config_cls.__init__).parameters) - {"self", "kwargs"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _raw(config: Any, name: str, default: Any = None) -> Any:
    """``config.<name>`` without the heterogeneous-config guard (per-layer attributes raise on plain access)."""
    getter = getattr(config, "_getattr_without_heterogeneous_validation", None)
    return getter(name, default) if getter is not None else getattr(config, name, default)


def _per_layer_overrides(config: Any) -> dict[int, dict[str, Any]]:
    """The sparse ``per_layer_config`` of a heterogeneous config as ``{layer index: {attr: value}}``."""
    spec = config.__dict__.get("_heterogeneity_spec")
    return dict(spec.per_layer_overrides) if spec is not None else {}


def _per_layer_attrs(default: Any, fields: set[str]) -> dict[str, list]:
    """Default-config attributes that hold one entry per layer (lists of length ``num_hidden_layers``)."""
    n = _raw(default, "num_hidden_layers")
    out: dict[str, list] = {}
    for name in sorted(fields):
        value = _raw(default, name)
        if isinstance(value, list) and n and len(value) == n and name not in _NOT_PER_LAYER:
            out[name] = value
    return out


def _pick_layers(default: Any, fields: set[str]) -> list[int]:
    """Indices of the default (full-size) model's layers that a tiny model keeps: one layer of every distinct kind.

    A layer's kind is the tuple of its entries in every per-layer attribute (attention type, MLP type, indexer
    type, per-layer head counts...), its membership in index-list attributes, and its ``per_layer_config`` entry.
    The first layer of each kind is kept, in the original order, so the tiny model keeps the family's real layout
    prefix (dense first layer, linear-before-full, ...). At least two layers are kept."""
    n = _raw(default, "num_hidden_layers") or 2
    per_layer = _per_layer_attrs(default, fields)
    index_lists = {a: set(_raw(default, a) or ()) for a in _INDEX_LIST_ATTRS if a in fields}
    per_layer_cfg = _per_layer_overrides(default)
    picked: list[int] = []
    kinds: set[tuple] = set()
    for i in range(n):
        kind = (
            tuple(repr(v[i]) for v in per_layer.values())
            + tuple(i in s for s in index_lists.values())
            + (repr(sorted(per_layer_cfg.get(i, {}).items())),)
        )
        if kind not in kinds:
            kinds.add(kind)
            picked.append(i)
    for i in range(n):  # a single-kind family still gets two layers (cache/offload code must see layer 1)
        if len(picked) >= 2:
            break
        if i not in picked:
            picked.append(i)
    return sorted(picked)[:_MAX_LAYERS]


def _layer_overrides(default: Any, fields: set[str], picked: list[int], sizes: dict[str, Any]) -> dict[str, Any]:
    """Per-layer attributes restricted to the picked layers, plus the matching ``num_hidden_layers``.

    ``sizes`` are the tiny global sizes; per-layer size overrides keep their ratio to the global default (Gemma4's
    full-attention layers have twice the head_dim, so the tiny ones do too)."""
    out: dict[str, Any] = {"num_hidden_layers": len(picked)}
    for name, values in _per_layer_attrs(default, fields).items():
        out[name] = [values[i] for i in picked]
    for name in _INDEX_LIST_ATTRS:
        if name in fields and _raw(default, name) is not None:
            out[name] = [new for new, old in enumerate(picked) if old in set(_raw(default, name))]
    per_layer_cfg = _per_layer_overrides(default)
    if per_layer_cfg:
        remapped = {}
        for new, old in enumerate(picked):
            if old in per_layer_cfg:
                remapped[new] = {
                    k: _scaled(v, _raw(default, k), sizes.get(k)) for k, v in per_layer_cfg[old].items()
                }
        out["per_layer_config"] = remapped
    return out


def _scaled(value: Any, full_default: Any, tiny_default: Any) -> Any:
    """A per-layer size scaled like its global counterpart (``value / full_default * tiny_default``)."""
    if _is_number(value) and _is_number(full_default) and _is_number(tiny_default) and full_default:
        return max(1, round(value / full_default * tiny_default))
    return value


def _generic_overrides(model_type: str) -> dict[str, Any]:
    """The generic shrinker: tiny sizes, tiny token ids, and a short layer list covering every layer kind."""
    config_cls = _config_class(model_type)
    fields = _fields(config_cls)
    default = config_cls()
    out: dict[str, Any] = {}
    for name, tiny in _TINY_SIZES.items():
        if name in fields and _is_number(_raw(default, name)):
            out[name] = tiny
    for name, cap in _TINY_CAPS.items():
        if name in fields and _is_number(_raw(default, name)):
            out[name] = min(_raw(default, name), cap)
    out.update({k: v for k, v in _TOKEN_IDS.items() if k in fields})
    if "kv_lora_rank" in out:  # MLA: every query head has its own latent-decoded K/V; head_dim is the rope part
        out["num_key_value_heads"] = out.get("num_attention_heads", 4)
        if "head_dim" in fields and "qk_rope_head_dim" in out:
            out["head_dim"] = out["qk_rope_head_dim"]
    picked = _pick_layers(default, fields)
    out.update(_layer_overrides(default, fields, picked, out))
    kinds = set(out.get("layer_types") or ())
    if "sliding_window" in fields and kinds & set(_SLIDING_KINDS):
        out["sliding_window"] = 8  # a 6-token prompt + 40 new tokens crosses the window several times
    if "sliding_window_size" in fields and kinds & set(_SLIDING_KINDS):
        out["sliding_window_size"] = 8
    return out


def tiny_config(model_type: str, linear_first: bool = False, **overrides: Any) -> Any:
    """A tiny config of ``model_type``, built from transformers' own config class (nothing from the hub).

    The generic shrinker (:func:`_generic_overrides`) sets every size attribute the class has to a tiny value and
    keeps one layer of every layer kind of the full-size default layout; :data:`FAMILY_OVERRIDES` then fixes what
    the generic rules cannot know; ``overrides`` come last. ``model_type`` may also be a :data:`VARIANTS` name.

    ``linear_first`` (MiniMax only) rotates ``layer_types`` so that layer 0 is a linear (lightning) layer, the
    layout of the real MiniMax-Text-01 checkpoints (``attn_type_list`` starts with 0 = linear)."""
    base, variant_kwargs = VARIANTS.get(model_type, (model_type, {}))
    linear_first = linear_first or bool(variant_kwargs.get("linear_first"))
    if base in UNBUILDABLE:
        raise ValueError(f"{base} cannot be built tiny on CPU: {UNBUILDABLE[base]}")
    kwargs = _generic_overrides(base)
    kwargs.update(FAMILY_OVERRIDES.get(base, {}))
    if model_type != base:
        kwargs.update(FAMILY_OVERRIDES.get(model_type, {}))
    if linear_first:
        kwargs.update(_linear_first_layout(kwargs.get("layer_types") or []))
    kwargs.update(overrides)
    return _config_class(base)(**kwargs)


def _linear_first_layout(layer_types: list[str]) -> dict[str, Any]:
    """``layer_types`` with the linear-attention layers moved to the front (MiniMax-Text-01 layout)."""
    if "linear_attention" not in layer_types:
        raise ValueError("linear_first needs a layout with linear_attention layers")
    linear = [t for t in layer_types if t == "linear_attention"]
    return {"layer_types": linear + [t for t in layer_types if t != "linear_attention"]}


# --------------------------------------------------------------------------------------------------------------------
# Tiny models
# --------------------------------------------------------------------------------------------------------------------

def tiny_family_model(model_type: str, seed: int = 0, **overrides: Any) -> nn.Module:
    """A tiny random float32 model of ``model_type`` (or a :data:`VARIANTS` name), in eval mode.

    Built under ``torch.manual_seed(seed)``. Random init leaves router / expert biases, attention sinks and
    DeepSeek-style ``e_score_correction_bias`` at zero; they get small random values here so that a wrong expert
    slot or a dropped bias shows in the output (the offload tests compare outputs bit for bit)."""
    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = causal_lm_class(model_type)(config).float()
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "bias" in name or "sinks" in name or "e_score_correction" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(torch.randn(b.shape, generator=g) * 0.02)
    return model.eval()


def find_experts_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The routed-experts modules of ``model``: the ones carrying the experts-interface layout flags."""
    flags = ("has_gate", "is_transposed", "is_concatenated", "has_bias", "down_proj")
    return [(n, m) for n, m in model.named_modules() if all(hasattr(m, f) for f in flags)]


# --------------------------------------------------------------------------------------------------------------------
# Cache kinds
# --------------------------------------------------------------------------------------------------------------------

def activate_past_recording(cache) -> None:
    """``cache.activate_past_recording()``, so that a cropped cache can be rewound. From transformers 5.25 a linear
    attention layer can also keep intermediate recurrent states, and its default (``None``) breaks any multi-token
    forward (``min(None, seq_len)`` in the gated-delta layers). Rewinding here restores recurrent states from a
    checkpoint instead, so none are kept: 0."""
    cache.activate_past_recording()
    inner = getattr(cache, "self_attention_cache", cache)  # the hybrid wrappers keep their layers one level down
    for layer in getattr(inner, "layers", []):
        if hasattr(layer, "recurrent_states_to_keep") and layer.recurrent_states_to_keep is None:
            layer.recurrent_states_to_keep = 0


def layer_kinds(model: nn.Module, prompt_len: int = 6) -> dict[str, Any]:
    """What cache ``model`` builds for itself and whether it can be rolled back by cropping.

    Runs a short prefill with ``use_cache=True`` and no cache passed, so the model builds the cache it wants (what
    ``generate()`` does too; MiniMax builds its own ``MiniMaxCache``). Then turns on past recording (needed before
    sliding-window / conv layers can be cropped) and reads ``is_croppable``. Returns the cache class, the per-layer
    cache classes, croppability, and the model's ``_is_stateful`` / ``_supports_default_dynamic_cache()`` switches
    (``generate()`` refuses assisted decoding for stateful models)."""
    input_ids = torch.arange(5, 5 + prompt_len).unsqueeze(0) % model.config.get_text_config().vocab_size
    with torch.no_grad():
        out = model(input_ids, use_cache=True)
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = getattr(out, "past_key_values", None)
    info: dict[str, Any] = {
        "cache_class": type(cache).__name__ if cache is not None else None,
        "layer_classes": [type(layer).__name__ for layer in getattr(cache, "layers", [])],
        "is_stateful": bool(getattr(model, "_is_stateful", False)),
        "supports_default_dynamic_cache": bool(model._supports_default_dynamic_cache()),
    }
    if hasattr(cache, "linear_cache"):  # MiniMaxCache keeps lightning states beside its (lazy) KV layers
        info["linear_cache_layers"] = [i for i, s in enumerate(cache.linear_cache) if isinstance(s, torch.Tensor)]
    if cache is not None and hasattr(cache, "activate_past_recording"):
        activate_past_recording(cache)
    info["is_croppable"] = bool(getattr(cache, "is_croppable", False)) if cache is not None else None
    return info
