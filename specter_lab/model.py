"""Model adapter: load a Hugging Face MoE model safely, find its routed-expert modules, and attach / detach the
``specter`` experts implementation.

transformers ≥5 stores a layer's routed experts as fused tensors in a module decorated with
``use_experts_implementation`` and dispatches its forward through ``ExpertsInterface`` by the name in
``config._experts_implementation``. We register one function under the name ``"specter"`` that fetches expert
weights through the ExpertStore; the model otherwise runs unmodified (its own attention, KV cache, routers).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

ASSETS = Path(__file__).parent / "assets"
BUNDLED = {"tiny": ASSETS / "tiny-moe"}
IMPLEMENTATION_NAME = "specter"


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

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_experts(self) -> int:
        return max(l.num_experts for l in self.layers)

    @property
    def top_k(self) -> int:
        return max(l.top_k for l in self.layers)


def _is_experts_module(m: nn.Module) -> bool:
    # The decorator sets these flags in __init__; their presence is the interface's own signature.
    return all(hasattr(m, a) for a in ("has_gate", "is_transposed", "is_concatenated", "has_bias")) and hasattr(
        m, "down_proj"
    )


def _find_router(block: nn.Module, experts: nn.Module) -> nn.Module | None:
    candidates = [(n, c) for n, c in block.named_children() if c is not experts]
    for n, c in candidates:
        if "router" in type(c).__name__.lower():
            return c
    for n, c in candidates:
        if n in ("gate", "router") and not isinstance(c, nn.ModuleList):
            return c
    return None


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def inspect_model(model: nn.Module) -> MoEModelInfo:
    """Find every routed-experts module of ``model``. Raises ValueError for a model without any."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a loaded HF model), got {type(model).__name__}")
    config = _text_config(getattr(model, "config", None)) if getattr(model, "config", None) is not None else None
    found = [(n, m) for n, m in model.named_modules() if _is_experts_module(m)]
    if not found:
        raise ValueError(
            f"model {type(model).__name__} has no MoE layers: no module uses transformers' experts interface "
            "(transformers.integrations.moe.use_experts_implementation). specter_lab needs a mixture-of-experts "
            "model such as Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 or GPT-OSS."
        )
    # Decoder layers: the ModuleList that holds the MoE blocks (…layers.<i>.mlp.experts).
    decoder_layers = None
    for n, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and found[0][0].startswith(n + ".") and len(m) > 0:
            if decoder_layers is None or len(n) > len(decoder_layers[0]):
                decoder_layers = (n, m)
    named_parent = {n: m for n, m in model.named_modules()}
    layers: list[MoELayer] = []
    for i, (name, experts) in enumerate(found):
        block = named_parent[name.rsplit(".", 1)[0]] if "." in name else model
        names = tuple(
            p for p in ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias", "down_proj_bias")
            if isinstance(getattr(experts, p, None), torch.Tensor)
        )
        num_experts = int(getattr(experts, "num_experts", getattr(experts, names[0]).shape[0]))
        router = _find_router(block, experts)
        top_k = getattr(router, "top_k", None) or getattr(block, "top_k", None)
        if top_k is None and config is not None:
            top_k = getattr(config, "num_experts_per_tok", None) or getattr(config, "moe_topk", None)
        m = re.search(r"\.(\d+)\.", name[len(decoder_layers[0]):] + ".") if decoder_layers else None
        dec_idx = int(m.group(1)) if m else i
        layers.append(MoELayer(i, dec_idx, name, experts, router, names, num_experts, int(top_k or 1)))

    hidden = int(getattr(config, "hidden_size", 0) or layers[0].experts.down_proj.shape[-1])
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_params = int(head.weight.numel()) if head is not None else 0
    vocab = int(head.weight.shape[0]) if head is not None else int(getattr(config, "vocab_size", 0))
    n_kv = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", 1)
    head_dim = getattr(config, "head_dim", None) or hidden // max(1, getattr(config, "num_attention_heads", 1))
    kv_dim = int(n_kv * head_dim) if config is not None else hidden
    dense_moe, dense_other = [], 0
    if decoder_layers is not None:
        moe_dec = {l.decoder_index: l for l in layers}
        for j, dl in enumerate(decoder_layers[1]):
            total = sum(p.numel() for p in dl.parameters())
            if j in moe_dec:
                routed = sum(getattr(moe_dec[j].experts, n).numel() for n in moe_dec[j].param_names)
                dense_moe.append(total - routed)
            else:
                dense_other += total
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and config is not None:
        eos = getattr(config, "eos_token_id", None)
    eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    return MoEModelInfo(
        layers=layers,
        decoder_layers=decoder_layers[1] if decoder_layers else None,
        hidden=hidden,
        vocab=vocab,
        kv_dim=kv_dim,
        head_params=head_params,
        dense_params_per_layer=int(sum(dense_moe) / len(dense_moe)) if dense_moe else 0,
        dense_layer_params=dense_other,
        expert_params=max(l.expert_params for l in layers),
        eos_token_ids=eos_ids,
    )


# --------------------------------------------------------------------------------------------- experts dispatch


def _specter_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The function registered as experts implementation ``"specter"``: hands the call to the runtime that
    attached itself to this module. Without one (e.g. a stray call), it falls back to HF's eager loop."""
    runtime = self.__dict__.get("_specter_runtime")
    if runtime is None:
        return type(self).__mro__[0].forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)
    return runtime.experts_forward(self._specter_layer, self, hidden_states, top_k_index, top_k_weights)


def register_implementation() -> None:
    """Register ``"specter"`` in transformers' ExpertsInterface (idempotent, no import-time side effect)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if IMPLEMENTATION_NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION_NAME, _specter_experts_forward)


@contextmanager
def attached(model: nn.Module, info: MoEModelInfo, runtime: Any) -> Iterator[None]:
    """Route every experts module of ``model`` through ``runtime`` for the duration of the block, then leave the
    model a plain HF model again (its previous experts implementation restored), whatever happens inside."""
    register_implementation()
    before = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") else None
    for layer in info.layers:
        layer.experts.__dict__["_specter_runtime"] = runtime
        layer.experts.__dict__["_specter_layer"] = layer.index
    try:
        model.set_experts_implementation(IMPLEMENTATION_NAME)
        yield
    finally:
        for layer in info.layers:
            layer.experts.__dict__.pop("_specter_runtime", None)
            layer.experts.__dict__.pop("_specter_layer", None)
        if before is not None:
            model.set_experts_implementation(before)


# --------------------------------------------------------------------------------------------- loading


def _refuse_pickles(path: Path) -> None:
    st = list(path.glob("*.safetensors"))
    pickles = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt")]
    if not st:
        raise ValueError(
            f"{path} has no .safetensors weights"
            + (f" (found pickle checkpoints {pickles})" if pickles else "")
            + ". specter_lab loads safetensors only: pickle checkpoints can run arbitrary code when loaded. "
            "Convert it once in a trusted environment (model.save_pretrained(dir, safe_serialization=True))."
        )


def load_model(name_or_path: str | Path = "tiny", *, dtype: torch.dtype | str = torch.float32,
               device: str | torch.device = "cpu", trust_remote_code: bool = False, **kwargs: Any):
    """Load an MoE model and its tokenizer: ``"tiny"`` (bundled, offline), a local HF folder, or a hub id.

    Weights are read from safetensors only; ``trust_remote_code`` stays off unless you pass True. Raises a
    ValueError for a path that does not exist, a folder without safetensors, or a model without MoE layers.
    Returns ``(model, tokenizer)``; the model is in eval mode. ``tokenizer`` is None for a local folder without
    tokenizer files (prompts are then token ids).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
        raise ValueError(f"load_model(name_or_path={name_or_path!r}): give 'tiny', a local model folder or a hub id.")
    key = str(name_or_path)
    path = BUNDLED.get(key, Path(key).expanduser())
    if key in BUNDLED and not (path / "config.json").is_file():
        raise FileNotFoundError(f"the bundled model {key!r} is missing from {path}: reinstall specter-lab.")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"load_model(dtype={dtype!r}): use a floating torch dtype (torch.float32, 'bfloat16').")
    if not isinstance(trust_remote_code, bool):
        raise ValueError(f"load_model(trust_remote_code={trust_remote_code!r}): use True or False (default False).")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"load_model(device={device!r}): not a torch device ('cpu', 'cuda', 'cuda:1').") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"load_model(device={device!r}): CUDA is not available here; use device='cpu'.")
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"load_model(name_or_path={key!r}): {path} is not a Hugging Face model folder "
                             "(no config.json).")
        _refuse_pickles(path)
        source = str(path)
    elif key.startswith((".", "/", "~")) or key.count("/") != 1:
        raise ValueError(f"load_model(name_or_path={key!r}): no such folder, and not a hub id 'org/name'. "
                         f"Bundled models: {sorted(BUNDLED)}.")
    else:
        source = key  # hub id: transformers downloads (needs network) and we insist on safetensors below
        _check_hub_reachable(key, kwargs)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code, **kwargs)
        inspect_model(model)  # fail early, with a clear message, on a dense model (before the tokenizer)
        tokenizer = None  # a local folder without tokenizer files: the model runs on token ids
        if not path.exists() or any(path.glob("tokenizer*")) or (path / "vocab.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise ValueError(f"load_model({key!r}) failed: {e}. Offline? Pass a local folder instead.") from e
    model.eval()
    if dev.type == "cuda":
        place_for_offload(model, inspect_model(model), dev)
    else:
        model.to(dev)
    return model, tokenizer


def _check_hub_reachable(key: str, kwargs: dict) -> None:
    """Fail in seconds, not after the hub client's retries (~20 s), when a hub id is neither cached locally nor
    downloadable: offline mode, or no route to the endpoint. A proxy in the environment skips the probe (the
    direct connection it tries says nothing about the proxied one)."""
    import os
    import socket
    from urllib.parse import urlparse

    if kwargs.get("local_files_only"):
        return
    try:
        from huggingface_hub import constants, try_to_load_from_cache

        cached = try_to_load_from_cache(key, "config.json", revision=kwargs.get("revision"))
    except Exception:  # an old or missing huggingface_hub: let from_pretrained decide
        return
    if isinstance(cached, str):
        return  # in the local cache: transformers can load it offline
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"load_model({key!r}): HF_HUB_OFFLINE is set and {key!r} is not in the local Hugging Face "
                         "cache. Unset HF_HUB_OFFLINE, download it on a machine with network, or pass a local folder.")
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise ValueError(f"load_model({key!r}): {key!r} is not in the local Hugging Face cache and {host}:{port} "
                         f"cannot be reached ({e}). Offline? Pass a local model folder instead.") from e


def place_for_offload(model: nn.Module, info: MoEModelInfo | None = None, device="cuda") -> nn.Module:
    """Put everything but the routed experts on ``device`` and keep the routed experts in pinned host memory:
    the layout the runtime offloads from (the ExpertStore copies experts into its device slots on demand).
    HF's own forward needs the experts on the device, so run such a model through an Engine."""
    info = info or inspect_model(model)
    expert_params = {id(getattr(l.experts, n)) for l in info.layers for n in l.param_names}
    for p in model.parameters():
        p.data = p.data.to("cpu").pin_memory() if id(p) in expert_params else p.data.to(device)
    for m in model.modules():
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = b.to(device)
    return model


def tiny_random_model(family: str = "qwen2_moe", seed: int = 0, **overrides: Any) -> nn.Module:
    """A tiny randomly initialised MoE model of one transformers family (for tests, notebooks, bring-your-own
    walkthroughs). Families: mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, gpt_oss."""
    import transformers as tf

    common = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    families: dict[str, tuple[str, str, dict]] = {
        "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                    dict(num_hidden_layers=2, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2)),
        "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                      dict(num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                           num_experts_per_tok=2, shared_expert_intermediate_size=64, decoder_sparse_step=1)),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      dict(num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                           num_experts_per_tok=2, head_dim=16, decoder_sparse_step=1)),
        "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
                  dict(num_hidden_layers=2, intermediate_size=32, num_experts=8, num_experts_per_tok=2)),
        "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                        dict(num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
                             n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                             n_group=2, topk_group=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                             qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4)),
        "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                    dict(num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                         head_dim=16, sliding_window=64, layer_types=["sliding_attention", "full_attention"])),
    }
    if family not in families:
        raise ValueError(f"family={family!r} is unknown; use one of {sorted(families)}.")
    cfg_name, model_name, extra = families[family]
    cfg = getattr(tf, cfg_name)(**{**common, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(tf, model_name)(cfg)
    # Random init leaves gpt-oss router biases and expert biases at zero/empty; give every tensor real values so
    # a wrong slot or a wrong bias shows in the output.
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "bias" in name or "sinks" in name or "e_score_correction" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        for n, b in model.named_buffers():
            if "e_score_correction_bias" in n:
                b.copy_(torch.randn(b.shape, generator=g) * 0.02)
    return model.eval()
