"""What the runtime needs to know about an MoE model: its routed-expert modules (transformers' experts interface),
their routers, sizes for the cost model, and EOS ids. Pure inspection: nothing is changed on the model."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["MoELayer", "MoEModelInfo", "inspect_model", "text_config"]

@dataclass
class MoELayer:
    """One MoE block: its routed experts module, its router, and where it sits."""

    index: int  # position among MoE layers (0..n_moe-1): the layer id used everywhere in specter_lab
    decoder_index: int  # position among the model's decoder layers
    name: str  # module path of the experts module
    experts: nn.Module
    router: nn.Module | None
    param_names: tuple[str, ...]  # fused tensors of the experts module, each shaped [E, ...]
    num_experts: int
    top_k: int

    @property
    def expert_params(self) -> int:
        return sum(getattr(self.experts, n)[0].numel() for n in self.param_names)


@dataclass
class MoEModelInfo:
    """What the runtime needs to know about a model: its MoE layers and sizes for the cost model."""

    layers: list[MoELayer]
    decoder_layers: nn.ModuleList | None
    hidden: int
    vocab: int
    kv_dim: int
    head_params: int
    dense_params_per_layer: int  # mean over MoE layers: everything in a decoder layer but routed experts
    dense_layer_params: int  # total params of decoder layers without routed experts
    expert_params: int  # one routed expert (max over layers)
    eos_token_ids: list[int] = field(default_factory=list)
    model_type: str = ""  # the family (config.model_type), named in refusals
    config: dict = field(default_factory=dict, repr=False)  # the text config as a dict (what a clock may read)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_experts(self) -> int:
        return max(l.num_experts for l in self.layers)

    @property
    def top_k(self) -> int:
        return max(l.top_k for l in self.layers)


_PARAM_NAMES = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias", "down_proj_bias")


def _is_experts_module(m: nn.Module) -> bool:
    # The decorator sets these flags in __init__; their presence is the interface's own signature.
    return all(hasattr(m, a) for a in ("has_gate", "is_transposed", "is_concatenated", "has_bias")) and hasattr(
        m, "down_proj")


def _find_router(block: nn.Module, experts: nn.Module) -> nn.Module | None:
    candidates = [(n, c) for n, c in block.named_children() if c is not experts]
    for n, c in candidates:
        if "router" in type(c).__name__.lower():
            return c
    for n, c in candidates:
        if n in ("gate", "router") and not isinstance(c, nn.ModuleList):
            return c
    return None


def text_config(config):
    """The decoder's config (a multimodal config's text part; the config itself otherwise)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _decoder_layers(model: nn.Module, first_experts: str) -> tuple[str, nn.ModuleList] | None:
    """The innermost ModuleList that holds the MoE blocks (…layers.<i>.mlp.experts)."""
    best = None
    for n, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and first_experts.startswith(n + ".") and len(m) > 0:
            if best is None or len(n) > len(best[0]):
                best = (n, m)
    return best


def _moe_layers(model, config, found, decoder_layers) -> list[MoELayer]:
    parents = dict(model.named_modules())
    layers = []
    for i, (name, experts) in enumerate(found):
        block = parents[name.rsplit(".", 1)[0]] if "." in name else model
        names = tuple(p for p in _PARAM_NAMES if isinstance(getattr(experts, p, None), torch.Tensor))
        num_experts = int(getattr(experts, "num_experts", getattr(experts, names[0]).shape[0]))
        router = _find_router(block, experts)
        top_k = getattr(router, "top_k", None) or getattr(block, "top_k", None)
        if top_k is None and config is not None:
            top_k = getattr(config, "num_experts_per_tok", None) or getattr(config, "moe_topk", None)
        m = re.search(r"\.(\d+)\.", name[len(decoder_layers[0]):] + ".") if decoder_layers else None
        layers.append(MoELayer(i, int(m.group(1)) if m else i, name, experts, router, names, num_experts,
                               int(top_k or 1)))
    return layers


def _dense_params(layers: list[MoELayer], decoder_layers) -> tuple[int, int]:
    """(mean non-routed params of a MoE decoder layer, total params of decoder layers without routed experts)."""
    dense_moe, dense_other = [], 0
    if decoder_layers is not None:
        moe_dec = {l.decoder_index: l for l in layers}
        for j, dl in enumerate(decoder_layers[1]):
            total = sum(p.numel() for p in dl.parameters())
            if j in moe_dec:
                dense_moe.append(total - sum(getattr(moe_dec[j].experts, n).numel() for n in moe_dec[j].param_names))
            else:
                dense_other += total
    return (int(sum(dense_moe) / len(dense_moe)) if dense_moe else 0), dense_other


def _eos_ids(model, config) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and config is not None:
        eos = getattr(config, "eos_token_id", None)
    return [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])


def inspect_model(model: nn.Module) -> MoEModelInfo:
    """Find every routed-experts module of ``model``. Raises ValueError for a model without any."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a loaded HF model), got {type(model).__name__}")
    config = text_config(model.config) if getattr(model, "config", None) is not None else None
    found = [(n, m) for n, m in model.named_modules() if _is_experts_module(m)]
    if not found:
        raise ValueError(
            f"model {type(model).__name__} has no MoE layers: no module uses transformers' experts interface "
            "(transformers.integrations.moe.use_experts_implementation). specter_lab needs a mixture-of-experts "
            "model such as Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 or GPT-OSS.")
    decoder_layers = _decoder_layers(model, found[0][0])
    layers = _moe_layers(model, config, found, decoder_layers)
    hidden = int(getattr(config, "hidden_size", 0) or layers[0].experts.down_proj.shape[-1])
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    n_kv = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", 1)
    head_dim = getattr(config, "head_dim", None) or hidden // max(1, getattr(config, "num_attention_heads", 1))
    dense_moe, dense_other = _dense_params(layers, decoder_layers)
    return MoEModelInfo(
        layers=layers,
        decoder_layers=decoder_layers[1] if decoder_layers else None,
        hidden=hidden,
        vocab=int(head.weight.shape[0]) if head is not None else int(getattr(config, "vocab_size", 0)),
        kv_dim=int(n_kv * head_dim) if config is not None else hidden,
        head_params=int(head.weight.numel()) if head is not None else 0,
        dense_params_per_layer=dense_moe,
        dense_layer_params=dense_other,
        expert_params=max(l.expert_params for l in layers),
        eos_token_ids=_eos_ids(model, config),
        model_type=str(getattr(config, "model_type", "") or type(model).__name__),
        config=_as_dict(config),
    )


def _as_dict(config) -> dict:
    """A config as a plain dict (a transformers config's ``to_dict``; {} without one)."""
    if config is None:
        return {}
    try:
        return config.to_dict()
    except Exception:  # noqa: BLE001 - a model whose config cannot be dumped simply gives the clocks less to read
        return {}
