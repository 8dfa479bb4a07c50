"""Which model this is, as a few short strings: its config's digest and a fingerprint of its weights. A resumed
recording (``sl.record(out=, resume=True)``) or sweep (``sl.compare(results=)``) compares them with what its file
was written by, so work done with one model is never mixed with another's.

The weights' fingerprint reads every parameter's name, shape and dtype, and 64 values spread over each one (not
every byte: hashing a 30 GB checkpoint would cost minutes; 64 samples a tensor cost milliseconds and still tell
apart two checkpoints, two fine-tunes or a quantized copy, whose sampled values all differ). A change confined to
values between the samples goes unseen: the fingerprint says "another model", never "the same bytes".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

__all__ = ["config_digest", "weights_fingerprint", "model_identity", "SAMPLES_PER_TENSOR"]

SAMPLES_PER_TENSOR = 64

# config keys that say how transformers runs the model, not what the model is (set and reset by attaching a
# runtime, by the attention backend chosen at load, or by the library version that saved it)
_RUNTIME_KEYS = ("transformers_version", "torch_dtype", "dtype", "use_cache")


def config_digest(config: "dict[str, Any] | Any") -> str:
    """SHA-256 (16 hex digits) of the config as a sorted JSON object, without the keys that describe how it runs
    (names starting with ``_``, the library version, ``use_cache``)."""
    d = config if isinstance(config, dict) else config.to_dict()
    kept = {k: v for k, v in d.items() if not k.startswith("_") and k not in _RUNTIME_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 (16 hex digits) of every parameter's name, shape and dtype and :data:`SAMPLES_PER_TENSOR` of its
    values at evenly spaced positions (see the module docstring for what it can and cannot tell)."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            h.update(f"{name}|{tuple(p.shape)}|{p.dtype}\n".encode())
            n = p.numel()
            if n == 0 or p.device.type == "meta":
                continue
            flat = p.detach().reshape(-1)  # a view for the contiguous tensors parameters are
            idx = torch.linspace(0, n - 1, min(n, SAMPLES_PER_TENSOR), device=flat.device).long()
            h.update(flat[idx].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()[:16]


def model_identity(model: torch.nn.Module) -> dict[str, str]:
    """``{"type", "config", "weights"}``: the model's type, :func:`config_digest` and :func:`weights_fingerprint`
    (what a resumed run checks, field by field)."""
    return {"type": str(getattr(model.config, "model_type", "?")), "config": config_digest(model.config),
            "weights": weights_fingerprint(model)}
