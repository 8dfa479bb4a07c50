"""Small multi-shard checkpoints and the ways a folder gets corrupted: shared by tests/test_checkpoints.py and
scripts/fuzz_checkpoints.py (which counts outcomes over many folders)."""

from __future__ import annotations

import json
import random
import shutil
import signal
from pathlib import Path

import torch

import specter_lab as sl
from specter_lab.errors import CheckpointError, NotEnoughMemory

SIZES = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
             vocab_size=512)
PROJECT_ERRORS = (CheckpointError, NotEnoughMemory)


def make_checkpoint(path: Path, layout: str = "per-expert", shard_bytes: int = 1_000_000, seed: int = 0,
                    dtype: torch.dtype = torch.bfloat16, **sizes) -> Path:
    """A tiny random OLMoE written to ``path`` in ``dtype``, sharded with an index: ``per-expert`` as transformers
    saves it (one tensor per expert, the published layout), or ``fused`` (the model's own ``[E, ...]`` tensors)."""
    from safetensors.torch import save_file

    model = sl.tiny_random_model("olmoe", seed=seed, **{**SIZES, **sizes}).to(dtype)
    path.mkdir(parents=True, exist_ok=True)
    if layout == "per-expert":
        model.save_pretrained(path, max_shard_size=shard_bytes)
        return path
    model.config.save_pretrained(path)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
             or not model.config.tie_word_embeddings}
    shards, cur, size = [], {}, 0
    for k, v in state.items():
        if cur and size + v.nbytes > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k], size = v, size + v.nbytes
    shards.append(cur)
    weight_map = {}
    for i, sh in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in sh})
    total = sum(v.nbytes for v in state.values())
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=2))
    return path


# ------------------------------------------------------------------------------------------- corruptions
def _shards(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def _truncate(path: Path, rng: random.Random) -> str:
    f = rng.choice(_shards(path))
    size = f.stat().st_size
    keep = rng.choice([0, 4, 8, rng.randrange(8, 200), rng.randrange(size // 2, size), size - 1])
    with f.open("r+b") as h:
        h.truncate(keep)
    return f"truncate {f.name} to {keep} of {size} bytes"


def _flip(path: Path, rng: random.Random) -> str:
    f = rng.choice(_shards(path))
    data = bytearray(f.read_bytes())
    n = int.from_bytes(data[:8], "little")
    where = rng.choice(["length", "header", "header", "data"])
    lo, hi = {"length": (0, 8), "header": (8, 8 + n), "data": (8 + n, len(data))}[where]
    flips = rng.randint(1, 4)
    for _ in range(flips):
        i = rng.randrange(lo, hi)
        data[i] ^= 1 << rng.randrange(8)
    f.write_bytes(bytes(data))
    return f"flip {flips} bits in the {where} of {f.name}"


def _remove(path: Path, rng: random.Random) -> str:
    f = rng.choice(_shards(path))
    f.unlink()
    return f"remove {f.name}"


def _edit_index(path: Path, rng: random.Random) -> str:
    idx = path / "model.safetensors.index.json"
    if not idx.exists():
        return _remove(path, rng)
    doc = json.loads(idx.read_text())
    wm = doc["weight_map"]
    key = rng.choice(sorted(wm))
    kind = rng.choice(["missing file", "drop entry", "move entry", "garbage", "path", "not a map", "delete"])
    if kind == "missing file":
        wm[key] = "model-99999-of-99999.safetensors"
    elif kind == "drop entry":
        del wm[key]
    elif kind == "move entry":
        wm[key] = rng.choice(sorted(set(wm.values())))
    elif kind == "path":
        wm[key] = "../" + wm[key]
    elif kind == "not a map":
        doc["weight_map"] = rng.choice([None, [], 3, "x"])
    elif kind == "delete":
        idx.unlink()
        return "delete the index"
    if kind == "garbage":
        idx.write_bytes(idx.read_bytes()[: rng.randrange(1, 200)])
    else:
        idx.write_text(json.dumps(doc))
    return f"index: {kind} ({key})"


_CONFIG_FIELDS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_experts", "num_experts_per_tok",
                  "vocab_size", "num_attention_heads", "num_key_value_heads", "model_type", "rms_norm_eps",
                  "tie_word_embeddings", "hidden_act", "rope_parameters", "max_position_embeddings", "dtype"]


def _edit_config(path: Path, rng: random.Random) -> str:
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    fields = rng.sample(_CONFIG_FIELDS, rng.randint(1, 2))
    for f in fields:
        old = cfg.get(f)
        choices = [None, -1, 0, 10**12, "x", [], {}, 1.5, True]
        if isinstance(old, int) and not isinstance(old, bool):
            choices += [old * 2, old // 2, old + 1, max(1, old - 1)]
        if f == "model_type":
            choices += ["llama", "mixtral", "qwen3_moe", "no_such_family"]
        cfg[f] = rng.choice(choices)
    if rng.random() < 0.1:
        cfg_path.write_bytes(cfg_path.read_bytes()[: rng.randrange(1, 50)])
        return "truncate config.json"
    cfg_path.write_text(json.dumps(cfg))
    return "config: " + ", ".join(f"{f}={cfg[f]!r}" for f in fields)


MUTATIONS = {"truncate": _truncate, "flip": _flip, "remove": _remove, "index": _edit_index, "config": _edit_config}


def corrupt(src: Path, dst: Path, seed: int, kind: str | None = None) -> str:
    """Copy the checkpoint ``src`` to ``dst`` and corrupt it one way (``kind``, or drawn from ``seed``)."""
    rng = random.Random(seed)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    kind = kind or rng.choice(sorted(MUTATIONS))
    return MUTATIONS[kind](dst, rng)


class Hung(Exception):
    pass


def outcome(path: Path, timeout_s: int = 30, ids=(5, 6, 7)) -> tuple[str, str]:
    """Load ``path`` with sl.load_model and, if it loads, generate 2 tokens with ``lru``: ("refused", message) for
    a project error at load, ("accepted", "") when the load and the run both work, ("refused late", message) for a
    ValueError from the run after a load that passed, ("crashed", repr) for any other exception, ("hung", "") past
    ``timeout_s``."""

    def alarm(*_):
        raise Hung()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout_s)
    try:
        try:
            model, _ = sl.load_model(path)
        except PROJECT_ERRORS as e:
            return "refused", f"{type(e).__name__}: {e}"
        try:
            sl.Engine(model, None, "lru", cache_slots=2).generate(list(ids), max_new_tokens=2)
        except ValueError as e:  # accepted at load, refused by the run: the check at load missed it
            return "refused late", f"{type(e).__name__}: {str(e)[:300]}"
        return "accepted", ""
    except Hung:
        return "hung", ""
    except Exception as e:  # what the fuzz is looking for
        return "crashed", f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
