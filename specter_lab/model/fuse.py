"""Rewrite a checkpoint's per-expert tensors as the model's own fused ``[E, ...]`` tensors, once, so that every
later load maps the experts from the files instead of copying them.

Published MoE checkpoints (OLMoE, Qwen-MoE, Mixtral, DeepSeek) store one tensor per expert and projection;
transformers concatenates them into the fused parameters at load, which is a second host copy of every expert. A
folder whose tensors already carry the fused names and the run's dtype is mapped by transformers without a copy
(``plan_memory`` then counts the experts as mapped, not resident). The rewrite reads one MoE layer at a time
(only that layer's tensors are in memory) and writes one shard per layer; the tensors other than routed experts
are copied as they are. Names follow transformers' own conversion (gate before up in ``gate_up_proj``).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from ..atomic import atomic_folder, write_atomic
from ..errors import CheckpointError
from .checkpoint_check import check_checkpoint
from .expert_read import fused_targets

__all__ = ["fuse_experts"]


def fuse_experts(src: str | Path, dst: str | Path) -> Path:
    """Write ``src``'s checkpoint to ``dst`` with its routed experts fused (one ``[E, ...]`` tensor per projection
    and layer), everything else unchanged (config, tokenizer, other tensors). Reads one layer at a time. Returns
    ``dst``. Raises CheckpointError for a bad ``src`` and ValueError when ``dst`` exists."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise ValueError(f"fuse_experts(dst={str(dst)!r}): it exists; give a new folder.")
    ck = check_checkpoint(src)
    if ck.layout != "per-expert":
        raise CheckpointError(f"{src}: its experts are already fused (layout {ck.layout!r}); nothing to do.", str(src))
    targets = fused_targets(ck)
    done = {n for parts in targets.values() for ids in parts.values() for n in ids.values()}
    dst.parent.mkdir(parents=True, exist_ok=True)
    # built under a temporary name and renamed whole: a kill or an error never leaves a half-written checkpoint
    # under dst (the temporary is removed on an error; a killed run's is a hidden '.<dst>.<pid>.*.tmp')
    with atomic_folder(dst) as out:
        handles = {f: safe_open(str(src / f), framework="pt") for f in ck.files}

        def read(name: str) -> torch.Tensor:
            return handles[ck.tensors[name].file].get_tensor(name)

        weight_map: dict[str, str] = {}
        layers = sorted({re.sub(r"\.experts\.\w+$", "", t) for t in targets})
        shards = [("rest", [n for n in ck.tensors if n not in done])] + [
            (layer, [t for t in targets if t.startswith(layer + ".experts.")]) for layer in layers]
        for i, (label, names) in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            tensors = {}
            for name in names:
                if label == "rest":
                    tensors[name] = read(name)
                    continue
                parts = targets[name]
                order = ["gate", "up"] if name.endswith("gate_up_proj") else ["down"]
                count = len(parts[order[0]])
                tensors[name] = torch.stack([torch.cat([read(parts[p][e]) for p in order], 0) for e in range(count)])
            if tensors:
                save_file(tensors, str(out / fname), metadata={"format": "pt"})
                weight_map.update({n: fname for n in tensors})
            del tensors  # one layer's experts at a time
        total = sum(ck.tensors[n].nbytes for n in ck.tensors)
        write_atomic(out / "model.safetensors.index.json", json.dumps({"metadata": {"total_size": total},
                                                                        "weight_map": weight_map}, indent=1))
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                shutil.copy(f, out / f.name)
    check_checkpoint(dst)  # the result is a checkpoint this loader accepts
    return dst
