"""A ``config.json`` checked before anything is built from it: every reader (``sl.estimate``, ``sl.load_trace``'s
header, ``sl.import_routing``) calls :func:`check_config` first, then :func:`build_config` and
:func:`build_meta_model`, which turn whatever transformers raises into a :class:`~specter_lab.errors.ConfigError`
naming the field.

Why a layer of our own: transformers' strict dataclasses check a field's *type* (and raise their own
``StrictDataclassFieldValidationError``, not a ``ValueError``), but not its *value*: zero heads divide by zero, a
negative size is a negative tensor dimension, zero experts index an empty list, an unknown activation is a
``KeyError``, a non-string ``torch_dtype`` an ``AttributeError``, and a size of 10^12 builds for minutes or asks
for terabytes downstream. Each is refused here with the field, what was found and what would fit. The bounds are
far above any published model (the largest have ~130 layers, 512 experts, top-16, a 262k vocabulary) and far
below what hangs a replay.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..errors import ConfigError

__all__ = ["check_config", "build_config", "build_meta_model", "check_moe_info", "read_config_json", "LIMITS"]

MAX_CONFIG_BYTES = 16 * 2**20  # a config.json is kilobytes; a bigger file is not one

# field: (smallest, largest) for the integer sizes a model is built from. None passes here (transformers'
# own typing says where None is allowed); a bool is never a size.
LIMITS: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 2**17),
    "intermediate_size": (1, 2**20),
    "moe_intermediate_size": (1, 2**20),
    "shared_expert_intermediate_size": (0, 2**20),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "num_hidden_layers": (1, 512),
    "num_experts": (1, 4096),
    "num_local_experts": (1, 4096),
    "n_routed_experts": (1, 4096),
    "num_experts_per_tok": (1, 4096),
    "experts_per_token": (1, 4096),
    "vocab_size": (2, 2**23),
    "max_position_embeddings": (1, 2**27),
    "initial_context_length": (1, 2**27),
    "kv_lora_rank": (1, 2**16),
    "q_lora_rank": (1, 2**16),
    "qk_rope_head_dim": (1, 4096),
    "qk_nope_head_dim": (0, 4096),
    "v_head_dim": (1, 4096),
    "n_shared_experts": (0, 64),
    "num_shared_experts": (0, 64),
    "first_k_dense_replace": (0, 512),
    "decoder_sparse_step": (1, 512),
    "moe_layer_freq": (1, 512),
    "n_group": (1, 4096),
    "topk_group": (1, 4096),
    "sliding_window": (0, 2**27),
    "max_window_layers": (0, 2**16),
}
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
_TOP_K = ("num_experts_per_tok", "experts_per_token")
# float fields that must be finite and > 0 (an eps of 0 divides by zero; a negative theta has no meaning)
_POSITIVE_FLOATS = ("rms_norm_eps", "layer_norm_eps", "routed_scaling_factor", "swiglu_limit", "norm_eps")
_FINITE_FLOATS = ("initializer_range", "router_aux_loss_coef", "aux_loss_alpha", "attention_dropout",
                  "swiglu_alpha", "partial_rotary_factor")
_TOKEN_IDS = ("eos_token_id", "bos_token_id", "pad_token_id")
_MAX_CONFIG_DEPTH = 3  # text_config inside a config: one level is all any family uses


def read_config_json(path, arg: str = "config") -> Any:
    """The JSON of a ``config.json`` file, or a :class:`ConfigError` naming the file (too large, not UTF-8, not
    JSON, nested too deep)."""
    from pathlib import Path

    path = Path(path)
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{arg}={str(path)!r}: {size} bytes; a config.json is at most {MAX_CONFIG_BYTES} bytes. "
                          "Give the model's own config.json.", field="", found=size)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(f"{arg}={str(path)!r} is not valid JSON ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:120]}); give the model's own config.json.") from None


def _fail(where: str, field: str, found: Any, fits: str) -> ConfigError:
    shown = repr(found)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigError(f"{where}.{field}: found {shown} ({type(found).__name__}); {fits}.", field=field,
                       found=found)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_config(raw: Any, where: str = "config", _depth: int = 0) -> dict:
    """``raw`` (a config.json as a dict) if every field specter_lab or transformers sizes a model from has a
    type and value that can be built; else a :class:`ConfigError` naming ``where.field``. Builds nothing."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: found {type(raw).__name__}; a config is a JSON object (a dict) of fields.",
                          field="", found=raw)
    bad_keys = [k for k in raw if not isinstance(k, str)]
    if bad_keys:
        raise _fail(where, str(bad_keys[0]), bad_keys[0], "field names are strings")
    if _depth == 0:
        mt = raw.get("model_type")
        if not isinstance(mt, str) or not mt:
            raise _fail(where, "model_type", mt, "the model family as a string, e.g. 'qwen3_moe' (the model's own "
                        "config.json has it)")
        from transformers import CONFIG_MAPPING

        if mt not in CONFIG_MAPPING:
            raise _fail(where, "model_type", mt, "a family the installed transformers knows (remote code is never "
                        "run)")
    for field, (lo, hi) in LIMITS.items():
        v = raw.get(field)
        if v is None:
            continue
        if not _is_int(v):
            raise _fail(where, field, v, f"an integer in [{lo}, {hi}]")
        if not lo <= v <= hi:
            raise _fail(where, field, v, f"an integer in [{lo}, {hi}]")
    _check_floats(raw, where)
    _check_relations(raw, where)
    _check_strings(raw, where)
    _check_lists(raw, where)
    for rope_field in ("rope_parameters", "rope_scaling"):
        _check_rope(raw.get(rope_field), f"{where}.{rope_field}")
    q = raw.get("quantization_config")
    if q is not None and not (isinstance(q, dict) and isinstance(q.get("quant_method", ""), str)):
        raise _fail(where, "quantization_config", q, "a dict with a string 'quant_method', or null")
    text = raw.get("text_config")
    if text is not None:
        if _depth >= _MAX_CONFIG_DEPTH or not isinstance(text, dict):
            raise _fail(where, "text_config", text, "a dict of the text model's fields, or absent")
        check_config(text, f"{where}.text_config", _depth + 1)
    return raw


def _check_floats(raw: dict, where: str) -> None:
    theta = raw.get("rope_theta")
    if "rope_theta" in raw and not (_is_number(theta) and theta > 1):  # null too: some families divide by it
        raise _fail(where, "rope_theta", theta, "a finite number > 1 (RoPE's base: log(theta) divides), or the "
                    "field left out for the family's default")
    for field in _POSITIVE_FLOATS:
        v = raw.get(field)
        if v is not None and not (_is_number(v) and v > 0):
            raise _fail(where, field, v, "a finite number > 0")
    for field in _FINITE_FLOATS:
        v = raw.get(field)
        if v is not None and not _is_number(v):
            raise _fail(where, field, v, "a finite number")


def _check_relations(raw: dict, where: str) -> None:
    experts = next((raw[f] for f in _EXPERT_COUNTS if raw.get(f) is not None), None)
    for f in _TOP_K:
        k = raw.get(f)
        if k is not None and experts is not None and k > experts:
            raise _fail(where, f, k, f"at most the {experts} experts a layer has")
    heads, kv = raw.get("num_attention_heads"), raw.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise _fail(where, "num_key_value_heads", kv, f"a divisor of num_attention_heads={heads}")
    groups, top_groups = raw.get("n_group"), raw.get("topk_group")
    if groups is not None and top_groups is not None and top_groups > groups:
        raise _fail(where, "topk_group", top_groups, f"at most n_group={groups}")
    if groups is not None and raw.get("n_routed_experts") is not None and raw["n_routed_experts"] % groups:
        raise _fail(where, "n_group", groups, f"a divisor of n_routed_experts={raw['n_routed_experts']}")
    hidden = raw.get("hidden_size")
    if raw.get("head_dim") is None and hidden is not None and heads is not None and (
            hidden % heads or hidden // heads < 2 or (hidden // heads) % 2):
        raise _fail(where, "hidden_size", hidden, f"num_attention_heads={heads} heads of an even size >= 2 each "
                    "(hidden_size / num_attention_heads is the head size when head_dim is not given)")
    for field in ("head_dim", "qk_rope_head_dim"):
        if raw.get(field) is not None and raw[field] % 2:
            raise _fail(where, field, raw[field], "an even number (rotary embeddings rotate pairs of dimensions)")
    layers = raw.get("num_hidden_layers")
    first = raw.get("first_k_dense_replace")
    if layers is not None and first is not None and first >= layers:
        raise _fail(where, "first_k_dense_replace", first, f"fewer than num_hidden_layers={layers} (else no MoE "
                    "layer is left)")


def _check_strings(raw: dict, where: str) -> None:
    act = raw.get("hidden_act")
    if act is not None:
        from transformers.activations import ACT2FN

        if not isinstance(act, str) or act not in ACT2FN:
            raise _fail(where, "hidden_act", act, f"one of transformers' activations {sorted(ACT2FN)}")
    for field in ("torch_dtype", "dtype"):
        v = raw.get(field)
        if v is None:
            continue
        import torch

        name = v.removeprefix("torch.") if isinstance(v, str) else v  # str(torch.bfloat16) is "torch.bfloat16"
        if not isinstance(v, str) or not (v == "auto" or isinstance(getattr(torch, name, None), torch.dtype)):
            raise _fail(where, field, v, "a torch dtype name such as 'bfloat16', 'float16' or 'float32'")
    for field in ("topk_method", "scoring_func", "transformers_version", "_name_or_path"):
        v = raw.get(field)
        if v is not None and not isinstance(v, str):
            raise _fail(where, field, v, "a string")


def _check_lists(raw: dict, where: str) -> None:
    vocab = raw.get("vocab_size")
    for field in _TOKEN_IDS:
        v = raw.get(field)
        ids = v if isinstance(v, list) else [v]
        if v is None or (isinstance(v, list) and not v):
            continue
        if len(ids) > 64 or not all(_is_int(i) for i in ids):
            raise _fail(where, field, v, "a token id (an integer) or a short list of them")
        if field == "eos_token_id" and vocab is not None and not all(0 <= i < vocab for i in ids):
            raise _fail(where, field, v, f"ids in [0, vocab_size={vocab})")
        if field == "pad_token_id" and vocab is not None and not all(-vocab <= i < vocab for i in ids):
            raise _fail(where, field, v, f"an id inside the vocabulary (vocab_size={vocab}), or null")
    layers = raw.get("num_hidden_layers")
    kinds = raw.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise _fail(where, "layer_types", kinds, "a list of layer kinds (strings), one per decoder layer")
        if layers is not None and len(kinds) != layers:
            raise _fail(where, "layer_types", kinds, f"{layers} entries, one per decoder layer (num_hidden_layers)")
    only = raw.get("mlp_only_layers")
    if only is not None:
        if not isinstance(only, list) or not all(_is_int(i) for i in only):
            raise _fail(where, "mlp_only_layers", only, "a list of layer indices")
        if layers is not None and not all(0 <= i < layers for i in only):
            raise _fail(where, "mlp_only_layers", only, f"indices in [0, num_hidden_layers={layers})")
    for field in ("id2label", "label2id", "task_specific_params"):
        v = raw.get(field)
        if v is not None and not isinstance(v, dict):
            raise _fail(where, field, v, "a JSON object (dict), or null")
    labels = raw.get("id2label") or {}
    if not all(_is_int(k) or (isinstance(k, str) and k.isdigit()) for k in labels):
        raise _fail(where, "id2label", labels, "an object whose keys are class indices ('0', '1', ...)")
    arch = raw.get("architectures")
    if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise _fail(where, "architectures", arch, "a list of class names (strings)")


def _check_rope(rope: Any, where: str) -> None:
    if rope is None:
        return
    if not isinstance(rope, dict):
        raise ConfigError(f"{where}: found {rope!r:.80} ({type(rope).__name__}); a dict of RoPE parameters or null.",
                          field=where.rpartition(".")[2], found=rope)
    for key, value in rope.items():
        if key in ("rope_type", "type"):
            ok = isinstance(value, str)
            fits = "a string such as 'default', 'yarn' or 'linear'"
        elif key in ("original_max_position_embeddings",):
            ok = _is_int(value) and 1 <= value <= 2**27
            fits = "an integer in [1, 2**27]"
        elif key == "rope_theta":
            ok = _is_number(value) and value > 1
            fits = "a finite number > 1 (RoPE's base: log(theta) divides)"
        elif key in ("factor", "beta_fast", "beta_slow", "attention_factor", "mscale",
                     "mscale_all_dim", "low_freq_factor", "high_freq_factor"):
            ok = _is_number(value) and value > 0
            fits = "a finite number > 0"
        elif key == "partial_rotary_factor":
            ok = _is_number(value) and 0 < value <= 1
            fits = "a number in (0, 1]"
        else:
            continue
        if not ok:
            raise ConfigError(f"{where}.{key}: found {value!r:.80} ({type(value).__name__}); {fits}.", field=key,
                              found=value)


_FIELD = re.compile(r"field '([^']+)'")
_NAMED = re.compile(r"`(\w+)`")  # transformers' class validators quote the fields they name


def build_config(raw: dict, where: str = "config"):
    """The transformers config of ``raw`` (checked with :func:`check_config` first). Anything transformers raises
    while building it (its ``StrictDataclassFieldValidationError`` among them) is a :class:`ConfigError` naming
    the field where transformers names one."""
    from transformers import AutoConfig

    check_config(raw, where)
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(raw["model_type"], **kwargs)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; each becomes one named refusal
        raise _wrapped(exc, where, "transformers refused the config", raw) from exc


def build_meta_model(cfg, where: str = "config"):
    """The causal-LM ``cfg`` describes, on the ``meta`` device (shapes, no memory). A config transformers
    accepts but cannot build a model from is a :class:`ConfigError`."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # noqa: BLE001 - as above
        raise _wrapped(exc, where, f"transformers cannot build the {getattr(cfg, 'model_type', '?')!r} model it "
                       "describes", cfg.to_dict() if hasattr(cfg, "to_dict") else {}) from exc


def _wrapped(exc: Exception, where: str, what: str, raw: dict) -> ConfigError:
    text = str(exc)
    m = _FIELD.search(text)
    quoted = [n for n in _NAMED.findall(text) if n in raw]  # else the first config field the message quotes
    if not quoted and "NoneType" in str(exc.__cause__ or exc):  # a size left null where the family needs it
        quoted = [n for n in LIMITS if n in raw and raw[n] is None]
    field = m.group(1) if m else (quoted[0] if quoted else "")
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    detail = " ".join(str(cause).split())[:200]
    named = f"{where}.{field}" if field else where
    return ConfigError(f"{named}: {what} ({type(cause).__name__}: {detail}). Give the model's own config.json, "
                       "with that field as its card publishes it.", field=field, found=None)


def check_moe_info(info, where: str = "config") -> None:
    """Refuse a built model whose MoE layers a replay or an estimate cannot size (no experts, top-k of 0 or above
    the experts, sizes of zero)."""
    for i, layer in enumerate(info.layers):
        e, k = layer.num_experts, layer.top_k
        if not (_is_int(e) and 1 <= e <= LIMITS["num_experts"][1]):
            raise ConfigError(f"{where}: MoE layer {i} has {e!r} experts; 1 to {LIMITS['num_experts'][1]} fit.",
                              field="num_experts", found=e)
        if not (_is_int(k) and 1 <= k <= e):
            raise ConfigError(f"{where}: MoE layer {i} routes top-{k!r} of {e} experts; 1 to {e} fit "
                              "(num_experts_per_tok).", field="num_experts_per_tok", found=k)
    if info.hidden <= 0 or info.vocab <= 0:
        raise ConfigError(f"{where}: the built model has hidden size {info.hidden} and vocabulary {info.vocab}; both "
                          "must be > 0.", field="hidden_size", found=info.hidden)
