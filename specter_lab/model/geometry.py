"""A real MoE model's sizes from its ``config.json`` alone: the model is built on the ``meta`` device (no memory,
no weights, no download) and inspected like a loaded one, so every experts-interface family is sized by its own
transformers code rather than by a hand-written formula per family."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from ..errors import ConfigError
from .config_check import build_config, build_meta_model, check_moe_info, read_config_json
from .inspect import inspect_model, text_config

__all__ = ["ModelGeometry", "geometry_from_config", "load_config", "kv_layout", "CONFIG_DIR", "BUNDLED_CONFIGS"]

CONFIG_DIR = Path(__file__).resolve().parents[1] / "data" / "configs"
# config.json of real models, written from their public model cards (the published rows use them)
BUNDLED_CONFIGS = tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))  # every file there, by its name


@dataclass(frozen=True)
class ModelGeometry:
    """Parameter counts and layer kinds of one MoE model, per decode token's view."""

    name: str
    model_type: str
    moe_layers: int
    decoder_layers: int
    num_experts: int
    top_k: int
    expert_params: int  # one routed expert (gate + up + down, biases included)
    dense_params_per_moe_layer: int  # attention, router, shared experts, norms of one MoE layer
    dense_layer_params: int  # all decoder layers without routed experts, together
    head_params: int  # LM head (read every token)
    embed_params: int  # input embeddings (one row read per token: not streamed)
    total_params: int
    kv_bytes_per_token: list[float]  # per decoder layer, bytes per cached token at 2 bytes/value
    kv_window: list[int | None]  # per decoder layer: sliding window (None = the whole context)
    checkpoint_format: str | None = None  # quantization the checkpoint ships in (config quantization_config)
    layer_types: list[str] = field(default_factory=list)
    moe_decoder_index: tuple[int, ...] = ()  # per MoE layer: its decoder layer's index
    hidden: int = 0

    @property
    def dense_layers(self) -> int:
        return self.decoder_layers - self.moe_layers

    @property
    def routed_params(self) -> int:
        return self.moe_layers * self.num_experts * self.expert_params

    @property
    def dense_params(self) -> int:
        """Everything that is not a routed expert and is read every token (embeddings excluded)."""
        return self.moe_layers * self.dense_params_per_moe_layer + self.dense_layer_params + self.head_params

    @property
    def active_params(self) -> int:
        return self.dense_params + self.moe_layers * self.top_k * self.expert_params

    def kv_bytes(self, context: int) -> float:
        """KV cache bytes at ``context`` tokens (2 bytes a value; sliding layers capped at their window)."""
        return sum(b * (context if w is None else min(w, context)) for b, w in zip(self.kv_bytes_per_token,
                                                                                   self.kv_window))


def load_config(config: Any, arg: str = "config"):
    """A transformers config from a dict, a PretrainedConfig, a path to ``config.json`` or to a folder holding one,
    or the name of a bundled config (:data:`BUNDLED_CONFIGS`). Remote code is never run."""
    from transformers import PretrainedConfig

    if isinstance(config, PretrainedConfig):
        return config
    name = None
    if isinstance(config, (str, Path)):
        path = Path(config)
        if str(config) in BUNDLED_CONFIGS:
            path = CONFIG_DIR / f"{config}.json"
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{arg}={str(config)!r}: no config.json there. Give a path to a Hugging Face "
                                    f"config.json (or its folder), a dict, or one of {list(BUNDLED_CONFIGS)}.")
        name = path.parent.name if path.name == "config.json" else path.stem
        config = read_config_json(path, arg)
    if not isinstance(config, dict):
        raise TypeError(f"{arg}= must be a path, a dict or a transformers config, got {type(config).__name__}")
    raw = dict(config)
    if "model_type" not in raw:
        raise ConfigError(f"{arg}: the config has no 'model_type', so transformers cannot tell its family. Use the "
                          "model's own config.json from the Hugging Face hub.", field="model_type")
    cfg = build_config(raw, arg)  # every field checked first; transformers' errors named (ConfigError)
    cfg._estimate_name = name or raw.get("_name_or_path") or raw["model_type"]
    return cfg


def geometry_from_config(config: Any, arg: str = "config") -> ModelGeometry:
    """Sizes of the model ``config`` describes, from its modules built on the meta device. Raises a ValueError
    naming ``arg`` when the config is not a mixture-of-experts model of the experts interface."""
    cfg = load_config(config, arg)
    quant = getattr(cfg, "quantization_config", None)
    checkpoint_format = (quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None))
    if quant is not None:  # the meta model is only counted: build it unquantized (no kernels needed)
        cfg.quantization_config = None
        delattr(cfg, "quantization_config")
    model = build_meta_model(cfg, arg)
    try:
        info = inspect_model(model)
    except ValueError as e:
        raise ValueError(f"{arg}: {getattr(cfg, '_estimate_name', cfg.model_type)} ({cfg.model_type}) is not a "
                         "mixture-of-experts model: it has no routed experts to offload, so every strategy is the "
                         "same. Estimate an MoE config instead (Qwen3-MoE, Mixtral, DeepSeek-V2/V3, GPT-OSS, "
                         "OLMoE, ...), or run a dense model whole on the GPU if its weights fit.") from e
    check_moe_info(info, arg)
    tc = text_config(cfg)
    embed = model.get_input_embeddings()
    kv, window, kinds = kv_layout(tc.to_dict(), info.kv_dim, len(info.decoder_layers or []) or info.num_layers)
    return ModelGeometry(
        name=str(getattr(cfg, "_estimate_name", cfg.model_type)), model_type=info.model_type,
        moe_layers=info.num_layers, decoder_layers=len(info.decoder_layers or []) or info.num_layers,
        num_experts=info.num_experts, top_k=info.top_k, expert_params=info.expert_params,
        dense_params_per_moe_layer=info.dense_params_per_layer, dense_layer_params=info.dense_layer_params,
        head_params=info.head_params, embed_params=int(embed.weight.numel()) if embed is not None else 0,
        total_params=sum(p.numel() for p in model.parameters()), kv_bytes_per_token=kv, kv_window=window,
        checkpoint_format=checkpoint_format, layer_types=kinds,
        moe_decoder_index=tuple(l.decoder_index for l in info.layers), hidden=info.hidden)


def kv_layout(tc: dict, kv_dim: int, n: int) -> tuple[list[float], list[int | None], list[str]]:
    """Bytes per cached token (16-bit) and window per decoder layer, from a text config as a dict (``kv_dim``: KV
    heads x head dim; ``n``: decoder layers). MLA caches its compressed latent (kv_lora_rank + rope dims); sliding
    layers keep ``sliding_window`` tokens; linear-attention / recurrent layers keep a fixed state (priced as no
    per-token KV)."""
    kinds = list(tc.get("layer_types") or ["full_attention"] * n)
    if tc.get("kv_lora_rank"):
        per = 2.0 * (tc["kv_lora_rank"] + (tc.get("qk_rope_head_dim") or 0))
    else:
        per = 2.0 * 2 * kv_dim
    sliding = tc.get("sliding_window")
    kv, window = [], []
    for kind in kinds[:n]:
        recurrent = "linear" in kind or "mamba" in kind or "recurrent" in kind
        kv.append(0.0 if recurrent else per)
        window.append(sliding if (kind == "sliding_attention" and sliding) else None)
    return kv, window, kinds[:n]
