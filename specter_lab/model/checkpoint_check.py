"""A checkpoint folder checked before any weight is read: ``config.json`` describes a mixture-of-experts model of
sane size, the index names files that are there, every shard's safetensors header is whole and agrees with the
file's length, and every tensor has the shape the config implies (the model is built on the ``meta`` device, so
its own transformers code says what the shapes are). Only headers are read: a multi-GB shard costs a few KB.

The header is parsed here rather than through ``safetensors.safe_open`` (which was weighed): ``safe_open`` maps
the file and its errors name neither the file nor the tensor; the format is 8 bytes of length, a JSON header and
the data, and checking it by hand lets every refusal say what was found and what would fit. The checks mirror
what the ``safetensors`` library itself refuses (offsets contiguous from 0 to the end of the file), so a folder
that passes here is one it opens.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

import torch

from ..errors import CheckpointError
from .inspect import inspect_model

__all__ = ["TensorEntry", "CheckpointInfo", "check_checkpoint", "read_safetensors_header", "SAFETENSORS_DTYPES",
           "BUNDLED"]

# the models shipped with the package, by name (load_model, plan_memory and check_checkpoint accept the name)
BUNDLED = {"tiny": Path(__file__).resolve().parents[1] / "assets" / "tiny-moe"}

# safetensors dtype codes → (torch dtype, bytes per element)
SAFETENSORS_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8), "I32": (torch.int32, 4), "I16": (torch.int16, 2), "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1),
    "F8_E4M3": (torch.float8_e4m3fn, 1), "F8_E5M2": (torch.float8_e5m2, 1),
}
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Config sizes beyond these are not a model anyone ships; they would only make the meta build crawl.
_BOUNDS = {"num_hidden_layers": 4096, "hidden_size": 2**20, "intermediate_size": 2**22,
           "moe_intermediate_size": 2**22, "vocab_size": 2**24, "num_attention_heads": 2**14,
           "num_key_value_heads": 2**14, "head_dim": 2**14, "max_position_embeddings": 2**26}
_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_MAX_EXPERTS = 2**16


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header describes it."""

    name: str
    dtype: str  # the safetensors code: "BF16", "F32", ...
    shape: tuple[int, ...]
    nbytes: int
    file: str  # the shard's file name
    offset: int = -1  # the tensor's first byte in the file (8 + header length + its data offset): the disk tier reads it


@dataclass
class CheckpointInfo:
    """What a checked folder holds, from headers alone: every tensor, which of them are routed experts, their bytes,
    the stored dtype and how the experts are laid out (``"fused"``: one ``[E, ...]`` tensor per projection, which
    transformers maps from the file without a copy; ``"per-expert"``: one tensor per expert, which transformers
    concatenates into a new host tensor at load)."""

    path: Path
    config: dict[str, Any]
    model_type: str
    tensors: dict[str, TensorEntry]
    files: list[str]
    expert_tensors: set[str]
    dtype: torch.dtype  # the floating dtype holding most of the bytes
    layout: str
    file_bytes: int  # the shards' sizes on disk
    unexpected: list[str] = field(default_factory=list)  # names transformers will ignore

    @property
    def expert_bytes(self) -> int:
        return sum(self.tensors[n].nbytes for n in self.expert_tensors)

    @property
    def dense_bytes(self) -> int:
        return sum(t.nbytes for n, t in self.tensors.items() if n not in self.expert_tensors)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _refuse(msg: str, path: Path | str | None = None, fld: str | None = None) -> CheckpointError:
    return CheckpointError(msg, None if path is None else str(path), fld)


# ------------------------------------------------------------------------------------------------ headers
def read_safetensors_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors one ``.safetensors`` file declares, checked against the file's length (nothing else is read).
    Raises :class:`CheckpointError` for a truncated or corrupt file."""
    path = Path(path)
    size = path.stat().st_size
    fix = "re-download or re-save this shard"
    if size < 8:
        raise _refuse(f"{path}: corrupt or truncated safetensors file ({size} bytes; a header alone needs 8+): {fix}.",
                      path, "header")
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n < 2 or n > MAX_HEADER_BYTES or n > size - 8:
            raise _refuse(f"{path}: corrupt or truncated safetensors file: its header claims {n:,} bytes but the "
                          f"file holds {size - 8:,} after the length field: {fix}.", path, "header")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _refuse(f"{path}: corrupt safetensors header (not valid JSON: {e.__class__.__name__} at "
                      f"{getattr(e, 'pos', getattr(e, 'start', '?'))}): {fix}.", path, "header") from None
    if not isinstance(header, dict):
        raise _refuse(f"{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object): {fix}.",
                      path, "header")
    data = size - 8 - n
    out: dict[str, TensorEntry] = {}
    spans = []
    for name, e in header.items():
        if name == "__metadata__":
            if not (isinstance(e, dict) and all(isinstance(v, str) for v in e.values())):
                raise _refuse(f"{path}: corrupt safetensors header: __metadata__ must map strings to strings.",
                              path, "__metadata__")
            continue
        out[name] = entry = _entry(path, name, e, fix, 8 + n)
        b = e["data_offsets"][0]
        spans.append((b, b + entry.nbytes, name))
    spans.sort()
    end = 0
    for b, e, name in spans:
        if b != end:
            raise _refuse(f"{path}: corrupt safetensors header: tensor {name!r} starts at byte {b:,} of the data, "
                          f"where the previous one ends at {end:,} (tensors must be contiguous): {fix}.", path, name)
        end = e
    if end != data:
        what = "truncated" if end > data else "corrupt"
        raise _refuse(f"{path}: {what} safetensors file: its tensors need {end:,} bytes of data but the file "
                      f"holds {data:,}: {fix}.", path, "data_offsets")
    return out


def _entry(path: Path, name: str, e: Any, fix: str, base: int = -1) -> TensorEntry:
    if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
        raise _refuse(f"{path}: corrupt safetensors header: entry {name!r} lacks dtype/shape/data_offsets: {fix}.",
                      path, name)
    dt, shape, off = e["dtype"], e["shape"], e["data_offsets"]
    if dt not in SAFETENSORS_DTYPES:
        raise _refuse(f"{path}: tensor {name!r} has dtype {dt!r}, not one of {sorted(SAFETENSORS_DTYPES)}: {fix}.",
                      path, name)
    ints = lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
    if not ints(shape) or not ints(off) or len(off) != 2 or off[0] > off[1]:
        raise _refuse(f"{path}: corrupt safetensors header: tensor {name!r} has shape {shape!r} and offsets {off!r} "
                      f"(non-negative integers, begin <= end): {fix}.", path, name)
    nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dt][1]
    if off[1] - off[0] != nbytes:
        raise _refuse(f"{path}: corrupt safetensors header: tensor {name!r} of shape {shape} {dt} needs {nbytes:,} "
                      f"bytes but its offsets span {off[1] - off[0]:,}: {fix}.", path, name)
    return TensorEntry(name, dt, tuple(shape), nbytes, path.name, base + off[0] if base >= 0 else -1)


# ------------------------------------------------------------------------------------------------ files
def _shards(path: Path) -> tuple[dict[str, TensorEntry], list[str]]:
    """Every tensor of the folder by name, from the index (if any) and the shards' headers."""
    index = path / INDEX
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise _refuse(f"{index}: corrupt index ({e.__class__.__name__}): re-save the checkpoint, or delete the "
                          "index if the folder holds a single model.safetensors.", index) from None
        if not isinstance(wm, dict) or not wm or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in wm.items()):
            raise _refuse(f"{index}: 'weight_map' must map tensor names to shard file names, found "
                          f"{type(wm).__name__}{'' if wm else ' (empty)'}.", index, "weight_map")
        files = sorted(set(wm.values()))
        for fname in files:
            if Path(fname).name != fname or fname in (".", ".."):
                raise _refuse(f"{index}: weight_map names {fname!r}, not a file in this folder (no paths).", index,
                              "weight_map")
            if not (path / fname).is_file():
                users = sum(1 for v in wm.values() if v == fname)
                raise _refuse(f"{index}: weight_map names {fname!r} ({users} tensors) but {path} has no such file: "
                              "the download is incomplete; fetch the missing shard.", path / fname, "weight_map")
    else:
        found = sorted(p.name for p in path.glob("*.safetensors"))
        if found != [SINGLE]:
            raise _refuse(f"{path}: {len(found)} .safetensors files {found[:4]} but no {INDEX}: transformers reads a "
                          f"single {SINGLE}, or shards through their index. Restore the index.", path / INDEX)
        wm, files = None, [SINGLE]
    tensors: dict[str, TensorEntry] = {}
    for fname in files:
        for name, t in read_safetensors_header(path / fname).items():
            if wm is not None and wm.get(name) != fname:
                raise _refuse(f"{path / fname}: holds tensor {name!r}, which {INDEX} "
                              + (f"places in {wm[name]!r}" if name in wm else "does not list")
                              + ": the index and the shards disagree; re-save the checkpoint.", path / fname, name)
            tensors[name] = t
    if wm is not None:
        lost = [k for k in wm if k not in tensors]
        if lost:
            raise _refuse(f"{index}: lists {len(lost)} tensors its shards do not hold (first {lost[0]!r} in "
                          f"{wm[lost[0]]!r}): that shard is not the one the index was written with.", index, lost[0])
    return tensors, files


# ------------------------------------------------------------------------------------------------ config
def _read_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _refuse(f"{cfg_path}: not valid JSON ({e}): restore the model's own config.json.", cfg_path) from None
    if not isinstance(cfg, dict):
        raise _refuse(f"{cfg_path}: a JSON {type(cfg).__name__}, not an object: restore the model's config.json.",
                      cfg_path)
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    if not isinstance(cfg.get("model_type"), str):
        raise _refuse(f"{cfg_path}: 'model_type' is {cfg.get('model_type')!r}; transformers needs the family name "
                      "(e.g. 'olmoe', 'qwen3_moe').", cfg_path, "model_type")
    for key, top in _BOUNDS.items():
        v = tc.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= top):
            raise _refuse(f"{cfg_path}: {key} = {v!r}; expected an integer in [1, {top:,}].", cfg_path, key)
    # Whether it is MoE at all is decided by the meta model (families name their expert count differently).
    counts = {k: tc[k] for k in _EXPERT_COUNT_KEYS if tc.get(k) is not None}
    for k, v in counts.items():
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _MAX_EXPERTS:
            raise _refuse(f"{cfg_path}: {k} = {v!r}; expected an integer in [0, {_MAX_EXPERTS:,}] (0: dense).",
                          cfg_path, k)
    experts = max(counts.values(), default=_MAX_EXPERTS)
    k = tc.get("num_experts_per_tok")
    if k is not None and experts > 0 and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= experts):
        raise _refuse(f"{cfg_path}: num_experts_per_tok = {k!r}; expected an integer in [1, {experts}] (the number "
                      "of experts).", cfg_path, "num_experts_per_tok")
    return cfg


def _meta_model(path: Path, cfg: dict[str, Any]):
    """The model ``cfg`` describes, built on the meta device (no memory). Every failure of transformers' own config
    validation or module construction is refused as a CheckpointError naming config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_path = path / "config.json"
    raw = {k: v for k, v in cfg.items() if k != "quantization_config"}  # counted unquantized: no kernels needed
    try:
        conf = AutoConfig.for_model(**raw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(conf)
    except Exception as e:  # transformers' validation raises many types (StrictDataclass…, KeyError, TypeError)
        fld = getattr(e, "field", None) or getattr(e, "name", None)
        raise _refuse(f"{cfg_path}: transformers cannot build model_type {cfg.get('model_type')!r} from it "
                      f"({type(e).__name__}: {str(e)[:300]}). Restore the model's own config.json.", cfg_path,
                      fld if isinstance(fld, str) else None) from None
    try:
        info = inspect_model(model)
    except ValueError as e:  # inspect_model's own message names the class and the families that work
        raise _refuse(f"{cfg_path}: {e}", cfg_path, "model_type") from None
    return model, info


# ------------------------------------------------------------------------------------------------ shapes
_PER_EXPERT = re.compile(r"^(.*)\.experts\.(\d+)\.(.+)$")


def _renamed(key: str, model_type: str) -> str:
    """``key`` after transformers' own renamings for this family (``block_sparse_moe`` → ``mlp`` for Mixtral)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        rules = get_checkpoint_conversion_mapping(model_type) or []
    except Exception:  # an older transformers: names are compared as they are
        return key
    for r in rules:
        if type(r).__name__ == "WeightRenaming":
            for src, tgt in zip(r.source_patterns, r.target_patterns):
                try:
                    key = re.sub(src, tgt.replace("\\", ""), key)
                except re.error:
                    pass
    return key


def expert_part(part: str, fused: Collection[str]) -> tuple[str, int, int] | None:
    """Where a per-expert tensor goes among the model's fused expert parameters ``fused`` (their names), from its
    name's last part (``gate_proj.weight``, ``w3.weight``, ...): (fused parameter, its place among the sources the
    parameter concatenates, how many sources). Gate (``w1``) is the first half of ``gate_up_proj`` and up (``w3``)
    the second, as transformers fuses them; down (``w2``) is ``down_proj``. None for a part the model has no
    parameter for. The one reading of per-expert names: the check, the per-expert load and the disk tier use it."""
    p = part.lower()
    if any(s in p for s in ("down", "w2")):
        return ("down_proj", 0, 1) if "down_proj" in fused else None
    if any(s in p for s in ("gate", "up", "w1", "w3")):
        if "gate_up_proj" in fused:
            return "gate_up_proj", (1 if any(s in p for s in ("up", "w3")) else 0), 2
        return ("up_proj", 0, 1) if "up_proj" in fused else None
    return None


def _check_shapes(path: Path, cfg: dict, tensors: dict[str, TensorEntry], model, info):
    """(routed-expert tensor names, layout, unexpected names). Raises on a shape that disagrees with the config, an
    expert id beyond ``num_experts`` or a tensor the model needs that no shard holds."""
    params = dict(model.named_parameters())
    expected = {**{n: tuple(p.shape) for n, p in params.items()},
                **{n: tuple(b.shape) for n, b in model.state_dict().items() if n not in params}}
    experts_mods = {l.name: l for l in info.layers}
    routed_names = {f"{l.name}.{n}" for l in info.layers for n in l.param_names}
    covered: dict[str, int] = {}  # fused param → per-expert tensors seen
    expert_tensors, unexpected, seen = set(), [], set()
    per_expert = False
    for name, t in tensors.items():
        key = name if name in expected else (
            "model." + name if "model." + name in expected else _renamed(name, cfg["model_type"]))
        if key in expected:
            if t.shape != expected[key]:
                raise _refuse(f"{path / t.file}: tensor {name!r} has shape {list(t.shape)} but config.json implies "
                              f"{list(expected[key])}: the config and the weights are of different models.",
                              path / t.file, name)
            seen.add(key)
            if key in routed_names:
                expert_tensors.add(name)
            continue
        m = _PER_EXPERT.match(key)
        layer = experts_mods.get(m.group(1) + ".experts") if m else None
        if layer is None:
            unexpected.append(name)
            continue
        fused = {n: getattr(layer.experts, n) for n in layer.param_names}
        j, proj = int(m.group(2)), expert_part(m.group(3), fused)
        if j >= layer.num_experts:
            raise _refuse(f"{path / t.file}: tensor {name!r} is expert {j}, but config.json gives "
                          f"{layer.num_experts} experts per layer: the config and the weights disagree.",
                          path / t.file, name)
        if proj is None or m.group(3).endswith("bias"):
            unexpected.append(name)
            continue
        pname, _, n_src = proj
        full = tuple(fused[pname].shape[1:])
        want = (full[0] // n_src, *full[1:])
        if t.shape != want:
            raise _refuse(f"{path / t.file}: tensor {name!r} has shape {list(t.shape)} but config.json implies "
                          f"{list(want)} per expert: the config and the weights are of different models.",
                          path / t.file, name)
        covered[f"{layer.name}.{pname}"] = covered.get(f"{layer.name}.{pname}", 0) + 1
        expert_tensors.add(name)
        per_expert = True
    for l in info.layers:
        for n in l.param_names:
            full = f"{l.name}.{n}"
            if full not in seen and covered.get(full, 0) == l.num_experts * (2 if n == "gate_up_proj" else 1):
                seen.add(full)
    missing = [n for n in params if n not in seen]
    if missing and not unexpected:  # names we cannot map may still supply them: transformers then decides
        raise _refuse(f"{path}: no shard holds {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                      else "") + " that config.json's model needs: the checkpoint is incomplete or of another model.",
                      path, missing[0])
    return expert_tensors, ("per-expert" if per_expert else "fused"), unexpected


def _stored_dtype(tensors: dict[str, TensorEntry]) -> torch.dtype:
    by: dict[str, int] = {}
    for t in tensors.values():
        if t.dtype in ("F64", "F32", "F16", "BF16"):
            by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    return SAFETENSORS_DTYPES[max(by, key=by.get)][0] if by else torch.float32


def check_checkpoint(path: str | Path, trust_remote_code: bool = False) -> CheckpointInfo:
    """Check a local checkpoint folder from its ``config.json`` and safetensors headers alone (no tensor data is
    read) and describe it. Raises :class:`~specter_lab.errors.CheckpointError` naming the file and the field for a
    config that is not MoE or not sane, a missing/extra shard, a corrupt or truncated shard, an index that disagrees
    with its shards, a tensor whose shape disagrees with the config, or a tensor the model needs that is absent.
    A config that asks for custom code (``auto_map``) is refused unless ``trust_remote_code``; with it, only the
    files are checked (building its model would run that code). ``path`` may name a bundled model ("tiny")."""
    path = BUNDLED.get(str(path), Path(path))
    if not (path / "config.json").is_file():
        raise _refuse(f"{path}: no config.json; a Hugging Face model folder needs one.", path / "config.json")
    cfg = _read_config(path)
    custom = "auto_map" in cfg
    if custom and not trust_remote_code:
        raise _refuse(f"{path / 'config.json'}: this model needs custom code from its folder (auto_map "
                      f"{cfg['auto_map']!r}); it is not run unless you pass trust_remote_code=True, and only if you "
                      "trust its source.", path / "config.json", "auto_map")
    tensors, files = _shards(path)
    if not tensors:
        raise _refuse(f"{path}: its shards declare no tensors.", path)
    quantized = "quantization_config" in cfg
    if custom:
        return CheckpointInfo(path=path, config=cfg, model_type=cfg["model_type"], tensors=tensors, files=files,
                              expert_tensors={n for n in tensors if ".experts." in n}, dtype=_stored_dtype(tensors),
                              layout="unknown", file_bytes=sum((path / f).stat().st_size for f in files))
    model, info = _meta_model(path, cfg)
    if quantized:  # packed/quantized tensors are named and shaped by the quantizer: integrity checks only
        experts, layout, unexpected = {n for n in tensors if ".experts." in n}, "fused", []
    else:
        experts, layout, unexpected = _check_shapes(path, cfg, tensors, model, info)
    return CheckpointInfo(path=path, config=cfg, model_type=cfg["model_type"], tensors=tensors, files=files,
                          expert_tensors=experts, dtype=_stored_dtype(tensors), layout=layout,
                          file_bytes=sum((path / f).stat().st_size for f in files), unexpected=unexpected)
