"""A per-expert checkpoint's routed experts read straight into the model's fused ``[E, ...]`` parameters, one
shard at a time, with no mapped second copy.

transformers loads a per-expert checkpoint (the published layout: ``experts.{j}.gate_proj.weight``, ...) by mapping
every shard and concatenating the per-expert tensors into new fused tensors. The fused copy is needed (the model's
own ``[E, ...]`` parameters cannot be views of tensors that lie apart in the files), but the mapped pages it read
from stay in the process's resident set as long as the mappings live (the dense tensors keep them alive): measured
on OLMoE-1B-7B, 12 GiB of fused copies plus about 8 GiB of file pages, 1.60× the checkpoint at load
(``docs/measured/real_checkpoint_olmoe.md``).

Here the fused parameters are allocated empty and every per-expert tensor is read (``readinto``, no mapping) into
its rows, file by file in offset order (sequential reads); each file's page cache is then handed back to the OS
(``posix_fadvise(DONTNEED)``), so neither this process nor the machine keeps a second copy. The dense tensors are
left to transformers as lazy mapped slices (as it maps them itself). ``safetensors``' own ``safe_open`` was weighed
for the expert reads: its ``get_tensor`` maps the file (the pages this avoids) and then copies once more.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import CheckpointError
from .checkpoint_check import _PER_EXPERT, SAFETENSORS_DTYPES, CheckpointInfo, _renamed, expert_part

__all__ = ["fused_targets", "read_fused_experts", "per_expert_state_dict"]

# The fused expert parameters of transformers' MoE experts interface, which a per-expert checkpoint is read into.
_FUSED = ("gate_up_proj", "down_proj")


def fused_targets(ck: CheckpointInfo) -> dict[str, dict[str, dict[int, str]]]:
    """fused parameter name → {part ("gate"/"up"/"down") → {expert → checkpoint tensor name}} for a per-expert
    checkpoint (names after transformers' renamings; gate before up in ``gate_up_proj``, as transformers fuses)."""
    out: dict[str, dict[str, dict[int, str]]] = {}
    for name in ck.expert_tensors:
        m = _PER_EXPERT.match(_renamed(name, ck.model_type))
        part = expert_part(m.group(3), _FUSED) if m is not None else None
        if part is None:
            continue  # already fused (check_checkpoint refused any other name)
        fused, place, _ = part
        kind = ("gate", "up")[place] if fused == "gate_up_proj" else "down"
        out.setdefault(f"{m.group(1)}.experts.{fused}", {}).setdefault(kind, {})[int(m.group(2))] = name
    return out


def _readinto(f, offset: int, dest: torch.Tensor, path: Path, name: str) -> None:
    """Read ``dest.nbytes`` bytes at ``offset`` straight into ``dest``'s memory (no intermediate buffer)."""
    view = memoryview(dest.view(-1).view(torch.uint8).numpy())
    f.seek(offset)
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise CheckpointError(f"{path}: tensor {name!r} ends past the end of the file (truncated while "
                                  "loading?): re-download or re-save this shard.", str(path), name)
        got += n


def _drop_page_cache(f) -> None:
    """Hand a file's cached pages back to the OS once it is read (Linux; elsewhere nothing)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def read_fused_experts(ck: CheckpointInfo, dtype: torch.dtype,
                       targets: "dict[str, dict[str, dict[int, str]]] | None" = None) -> dict[str, torch.Tensor]:
    """The routed experts of per-expert checkpoint ``ck`` as fused ``[E, rows, cols]`` tensors of ``dtype`` (the
    files' own dtype: nothing is converted), read file by file without mapping (module docstring). Raises
    CheckpointError when an expert is missing or a tensor's dtype or shape does not fit its fused rows."""
    targets = fused_targets(ck) if targets is None else targets
    out: dict[str, torch.Tensor] = {}
    reads: dict[str, list[tuple[str, torch.Tensor]]] = {}  # file → (tensor name, destination rows)
    for fused, parts in targets.items():
        order = ["gate", "up"] if fused.endswith("gate_up_proj") else ["down"]
        if set(parts) != set(order):
            raise CheckpointError(f"{ck.path}: {fused} needs the per-expert parts {order} but the checkpoint holds "
                                  f"{sorted(parts)}.", str(ck.path), fused)
        count = len(parts[order[0]])
        shapes = {ck.tensors[n].shape for p in order for n in parts[p].values()}
        if any(sorted(parts[p]) != list(range(count)) for p in order) or len(shapes) != 1:
            raise CheckpointError(f"{ck.path}: {fused}: the per-expert tensors are not experts 0..{count - 1} of one "
                                  f"shape each (shapes {sorted(shapes)}).", str(ck.path), fused)
        rows, cols = next(iter(shapes))
        out[fused] = t = torch.empty((count, rows * len(order), cols), dtype=dtype)
        for e in range(count):
            for i, p in enumerate(order):
                name = parts[p][e]
                stored = SAFETENSORS_DTYPES.get(ck.tensors[name].dtype, (None,))[0]
                if stored != dtype:
                    raise CheckpointError(f"{ck.path}: {name} is {ck.tensors[name].dtype}, not {dtype}: read it "
                                          "through transformers instead (it converts).", str(ck.path), name)
                reads.setdefault(ck.tensors[name].file, []).append((name, t[e, i * rows:(i + 1) * rows]))
    for file, items in reads.items():
        path = ck.path / file
        with path.open("rb", buffering=0) as f:  # offsets from the headers check_checkpoint already read
            for name, dest in sorted(items, key=lambda it: ck.tensors[it[0]].offset):  # sequential in the file
                _readinto(f, ck.tensors[name].offset, dest, path, name)
            _drop_page_cache(f)
    return out


def per_expert_state_dict(ck: CheckpointInfo, dtype: torch.dtype, stack: ExitStack) -> dict:
    """A state dict for ``from_pretrained(None, config=..., state_dict=...)``: the dense tensors as lazy mapped
    slices of the shards (kept open by ``stack``; transformers maps them as it would itself), the routed experts as
    fused tensors read once (:func:`read_fused_experts`), under the names transformers' fused parameters have."""
    targets = fused_targets(ck)
    experts = {n for parts in targets.values() for ids in parts.values() for n in ids.values()}
    handles = {f: stack.enter_context(safe_open(str(ck.path / f), framework="pt")) for f in ck.files}
    state: dict = {n: handles[e.file].get_slice(n) for n, e in ck.tensors.items() if n not in experts}
    state.update(read_fused_experts(ck, dtype, targets))
    return state
