"""Loading a model safely: the bundled one, a local folder or a hub id; safetensors only, remote code off unless
asked, and a hub id that cannot be fetched fails in seconds."""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from tqdm.auto import tqdm

from ..errors import CheckpointError
from .checkpoint_check import BUNDLED, CheckpointInfo, check_checkpoint
from .expert_read import fused_targets, per_expert_state_dict
from .inspect import inspect_model
from .memory import check_fits, plan_memory
from .placement import place_for_offload

__all__ = ["load_model", "BUNDLED"]



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


def load_model(name_or_path: str | Path = "tiny", *, dtype: torch.dtype | str | None = None,
               device: str | torch.device = "cpu", trust_remote_code: bool = False,
               memory_limit: int | str | None = None, progress: bool = False, **kwargs: Any):
    """Load an MoE model and its tokenizer: ``"tiny"`` (bundled, offline), a local HF folder, or a hub id.

    Weights are read from safetensors only; ``trust_remote_code`` stays off unless you pass True. ``dtype``
    defaults to the checkpoint's own (a bf16 checkpoint stays bf16 on the CPU: never a silent upcast); on CUDA a
    float32 checkpoint loads as bfloat16 (fp32 would double every expert copy and the pinned host memory). Pass
    ``dtype`` to convert. Returns ``(model, tokenizer)``; the model is in eval mode. ``tokenizer`` is None for a
    local folder without tokenizer files (prompts are then token ids). With ``device="cuda"`` the model is placed
    for offloading: everything but the routed experts on the GPU, the experts on the host.

    A local folder is checked before any weight is read (:func:`~specter_lab.model.checkpoint_check.check_checkpoint`:
    a :class:`~specter_lab.errors.CheckpointError` names the file and field for a missing, truncated or corrupt
    shard, an index naming an absent file, a shape that disagrees with config.json, a config that is not MoE), and
    what it will hold is compared with the RAM available (or ``memory_limit``, bytes or '8GiB'):
    :class:`~specter_lab.errors.NotEnoughMemory` shows the numbers and the fixes before anything is allocated
    (:func:`~specter_lab.model.memory.plan_memory`). Other ValueErrors: a path that does not exist, a folder
    without safetensors, a model without MoE layers.

    ``progress=True`` shows a bar of its three stages (check, weights, tokenizer): the first import of
    transformers' model code alone takes seconds, which a notebook cell would otherwise spend silent.
    """
    dtype, dev = _check_load_args(name_or_path, dtype, device, trust_remote_code)
    key = str(name_or_path)
    with tqdm(total=3, desc=f"load_model({key!r}): checking", disable=not progress) as bar:
        return _load(key, dtype, dev, trust_remote_code, memory_limit, kwargs, bar)


def _load(key: str, dtype, dev: torch.device, trust_remote_code: bool, memory_limit, kwargs: dict, bar):
    """:func:`load_model`'s stages, each ticking ``bar``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, source = _resolve_source(key, kwargs)
    ck = _check_local(path, source, dtype, dev, memory_limit, trust_remote_code)
    bar.update()
    bar.set_description(f"load_model({key!r}): weights")
    if ck is not None and dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" and ck.dtype == torch.float32 else ck.dtype
    elif dtype is None:  # a hub id: the checkpoint's dtype as its config says (transformers' "auto")
        dtype = "auto"
    try:
        loaded = _load_per_expert(ck, dtype, trust_remote_code, kwargs) if ck is not None else None
        if loaded is None:
            loaded = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code,
                output_loading_info=True, **kwargs)
        model, loading = loaded
        _check_loading(key, loading)
        if dev.type == "cuda" and model.dtype == torch.float32 and dtype == "auto":
            model.to(torch.bfloat16)
        inspect_model(model)  # fail early, with a clear message, on a dense model (before the tokenizer)
        bar.update()
        bar.set_description(f"load_model({key!r}): tokenizer")
        tokenizer = None  # a local folder without tokenizer files: the model runs on token ids
        if not path.exists() or any(path.glob("tokenizer*")) or (path / "vocab.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise ValueError(f"load_model({key!r}) failed: {e}. Offline? Pass a local folder instead.") from e
    except RuntimeError as e:  # transformers refuses a size mismatch the header check could not map
        if ck is not None and ("mismatch" in str(e) or "size" in str(e)):
            raise CheckpointError(f"load_model({key!r}): transformers refused the weights: {str(e)[:400]}",
                                  str(path), None) from None
        raise
    model.eval()
    if dev.type == "cuda":
        place_for_offload(model, inspect_model(model), dev)
    else:
        model.to(dev)
    bar.update()
    bar.set_description(f"load_model({key!r})")
    return model, tokenizer


def _load_per_expert(ck: CheckpointInfo, dtype, trust_remote_code: bool, kwargs: dict):
    """A per-expert checkpoint (the published layout) in its own dtype: the experts read once into the model's
    fused parameters, shard by shard, without the mapped second copy transformers' own concatenation leaves
    resident (:mod:`.expert_read`); ``(model, loading info)``, or None where transformers' own path is taken
    (another dtype, a quantized or remote-code model, extra ``from_pretrained`` options, a layout this does not
    fuse)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig  # as the module's other loaders

    if (ck.layout != "per-expert" or kwargs or trust_remote_code or dtype != ck.dtype
            or "quantization_config" in ck.config):
        return None
    targets = fused_targets(ck)
    if {n for parts in targets.values() for ids in parts.values() for n in ids.values()} != set(ck.expert_tensors):
        return None
    config = AutoConfig.from_pretrained(ck.path, trust_remote_code=False)
    cls = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if cls is None:
        return None
    with ExitStack() as stack:
        state = per_expert_state_dict(ck, dtype, stack)
        model, loading = cls.from_pretrained(None, config=config, state_dict=state, dtype=dtype,
                                             output_loading_info=True)
        del state
    if loading.get("unexpected_keys") and set(loading["unexpected_keys"]) & set(targets):
        raise CheckpointError(f"load_model({str(ck.path)!r}): the fused expert names "
                              f"{sorted(set(loading['unexpected_keys']) & set(targets))[:2]} are not this model's; "
                              "report it (the per-expert reader's naming is wrong for this family).", str(ck.path))
    if (ck.path / "generation_config.json").is_file():  # from_pretrained(None, ...) does not read it
        model.generation_config = GenerationConfig.from_pretrained(ck.path)
    model.name_or_path = str(ck.path)
    return model, loading


def _check_local(path: Path, source: str, dtype, dev, memory_limit, trust_remote_code) -> CheckpointInfo | None:
    """A local folder's checkpoint check and memory plan (None for a hub id: its files are not here yet)."""
    if not path.exists():
        if memory_limit is not None:
            raise ValueError(f"load_model(memory_limit=...): only a local folder can be sized before loading; "
                             f"download {source!r} first and pass its folder.")
        return None
    ck = check_checkpoint(path, trust_remote_code)
    check_fits(plan_memory(ck, dtype=dtype, device=dev if dev.type == "cpu" else "cpu",
                           memory_limit=memory_limit))
    return ck


def _check_loading(key: str, loading: dict) -> None:
    """Refuse what transformers would only warn about: weights the model needs that no shard held (they would be
    random), or weights of another shape."""
    missing = sorted(loading.get("missing_keys") or [])
    mismatched = list(loading.get("mismatched_keys") or [])
    if missing or mismatched:
        what = (f"{len(missing)} weights the model needs are missing (first {missing[0]!r})" if missing else
                f"{len(mismatched)} weights have another shape than config.json implies ({mismatched[0]!r})")
        raise CheckpointError(f"load_model({key!r}): {what}; transformers would fill them with random values. "
                              "The checkpoint is incomplete or of another model.", key,
                              missing[0] if missing else str(mismatched[0]))


def _check_load_args(name_or_path, dtype, device, trust_remote_code) -> tuple[torch.dtype | None, torch.device]:
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
        raise ValueError(f"load_model(name_or_path={name_or_path!r}): give 'tiny', a local model folder or a hub id.")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise ValueError(f"load_model(dtype={dtype!r}): use a floating torch dtype (torch.float32, 'bfloat16'), "
                         "or None for the checkpoint's own.")
    if not isinstance(trust_remote_code, bool):
        raise ValueError(f"load_model(trust_remote_code={trust_remote_code!r}): use True or False (default False).")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"load_model(device={device!r}): not a torch device ('cpu', 'cuda', 'cuda:1').") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"load_model(device={device!r}): CUDA is not available here; use device='cpu'.")
    return dtype, dev


def _resolve_source(key: str, kwargs: dict) -> tuple[Path, str]:
    """(local path, what from_pretrained reads): a bundled model, a local folder with safetensors, or a hub id."""
    path = BUNDLED.get(key, Path(key).expanduser())
    if key in BUNDLED and not (path / "config.json").is_file():
        raise FileNotFoundError(f"the bundled model {key!r} is missing from {path}: reinstall specter-lab.")
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"load_model(name_or_path={key!r}): {path} is not a Hugging Face model folder "
                             "(no config.json).")
        _refuse_pickles(path)
        return path, str(path)
    if key.startswith((".", "/", "~")) or key.count("/") != 1:
        raise ValueError(f"load_model(name_or_path={key!r}): no such folder, and not a hub id 'org/name'. "
                         f"Bundled models: {sorted(BUNDLED)}.")
    _check_hub_reachable(key, kwargs)  # hub id: transformers downloads (needs network); safetensors enforced
    return path, key


def _check_hub_reachable(key: str, kwargs: dict) -> None:
    """Fail in seconds, not after the hub client's retries (~20 s), when a hub id is neither cached locally nor
    downloadable: offline mode, or no route to the endpoint. A proxy in the environment skips the probe (the
    direct connection it tries says nothing about the proxied one)."""
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

