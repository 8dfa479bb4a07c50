"""Loading a model safely: the bundled one, a local folder or a hub id; safetensors only, remote code off unless
asked, and a hub id that cannot be fetched fails in seconds."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from .inspect import inspect_model
from .placement import place_for_offload

__all__ = ["load_model", "BUNDLED"]

ASSETS = Path(__file__).resolve().parents[1] / "assets"
BUNDLED = {"tiny": ASSETS / "tiny-moe"}


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
               device: str | torch.device = "cpu", trust_remote_code: bool = False, **kwargs: Any):
    """Load an MoE model and its tokenizer: ``"tiny"`` (bundled, offline), a local HF folder, or a hub id.

    Weights are read from safetensors only; ``trust_remote_code`` stays off unless you pass True. Raises a
    ValueError for a path that does not exist, a folder without safetensors, or a model without MoE layers.
    Returns ``(model, tokenizer)``; the model is in eval mode. ``tokenizer`` is None for a local folder without
    tokenizer files (prompts are then token ids). With ``device="cuda"`` the model is placed for offloading:
    everything but the routed experts on the GPU, the experts in pinned host memory. ``dtype`` defaults to
    float32 on the CPU (the exactness tests' reference precision) and bfloat16 on CUDA (fp32 would double every
    expert copy and the pinned host memory).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype, dev = _check_load_args(name_or_path, dtype, device, trust_remote_code)
    key = str(name_or_path)
    path, source = _resolve_source(key, kwargs)
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


def _check_load_args(name_or_path, dtype, device, trust_remote_code) -> tuple[torch.dtype, torch.device]:
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
        raise ValueError(f"load_model(name_or_path={name_or_path!r}): give 'tiny', a local model folder or a hub id.")
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
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

