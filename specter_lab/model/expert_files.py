"""Where every routed expert lies in a checkpoint's safetensors files, and a read of one expert from there into a
buffer: the bottom tier of the disk tier (device slots ← host expert cache ← these files).

A fused checkpoint holds each layer's projection as one ``[E, ...]`` tensor, so one expert is one contiguous byte
range of the file; a per-expert checkpoint holds ``gate``, ``up`` and ``down`` separately, and the model's fused
``gate_up_proj`` row of an expert is ``gate`` then ``up`` (transformers' own conversion). Either way an expert is a
short list of ``(file, offset, bytes)`` pieces, read with ``os.preadv`` straight into the destination tensor's
memory (no mapping, no second copy). After each read the file's pages for that range are released from the OS page
cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` where the OS has it), so what stays resident is what the host cache
holds, and the next read of that expert is a real disk read rather than a page-cache hit.

Nothing here is trusted blindly: :meth:`ExpertFiles.verify` compares experts read this way with the loaded model's
own parameters (bit for bit) before a run uses the files, so a layout this module does not know (a transposed or
interleaved projection) is refused instead of computed with wrong weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError
from .checkpoint_check import (_PER_EXPERT, SAFETENSORS_DTYPES, CheckpointInfo, _renamed, check_checkpoint,
                               expert_part)

__all__ = ["ExpertFiles", "Piece", "checkpoint_of"]

_FADVISE = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")


@dataclass(frozen=True, slots=True)
class Piece:
    """One contiguous byte range of one expert's tensor in a shard."""

    file: str
    offset: int
    nbytes: int


def checkpoint_of(model) -> Path | None:
    """The local folder a model was loaded from (``model.name_or_path``), or None (a hub id, a model built in
    memory)."""
    p = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    if not p:
        return None
    path = Path(str(p)).expanduser()
    return path if (path / "config.json").is_file() else None


class ExpertFiles:
    """Every routed expert of ``info``'s layers as byte ranges of the checkpoint ``ck`` (or its folder).

    ``pieces[layer][name][expert]``: the pieces, in order, that make the model's ``name`` row of that expert.
    ``expert_bytes[layer]``: one expert's bytes (all its tensors). Raises :class:`CheckpointError` when a routed
    tensor is missing from the files or stored in another dtype than the model's (a converted copy cannot be read
    in place: load the model in the file's dtype)."""

    def __init__(self, info, ck: "CheckpointInfo | str | Path") -> None:
        self.ck = ck if isinstance(ck, CheckpointInfo) else check_checkpoint(ck)
        self.path = self.ck.path
        self.info = info
        per_layer = {l.name: l for l in info.layers}
        found: dict[tuple[int, str], dict[int, list[tuple[int, Piece]]]] = {}
        for name, t in self.ck.tensors.items():
            if name not in self.ck.expert_tensors:
                continue
            key = _model_key(name, self.ck)
            layer, pname = _fused_target(key, per_layer)
            if layer is not None:  # fused: expert e is the e-th of E equal slices
                per = t.nbytes // t.shape[0]
                self._check_dtype(name, t.dtype, layer, pname)
                found[(layer.index, pname)] = {e: [(0, Piece(t.file, t.offset + e * per, per))]
                                               for e in range(t.shape[0])}
                continue
            m = _PER_EXPERT.match(key)
            layer = (per_layer.get(m.group(1) + ".experts") or per_layer.get("model." + m.group(1) + ".experts")
                     if m and not m.group(3).endswith("bias") else None)
            part = expert_part(m.group(3), layer.param_names) if layer is not None else None
            if part is None:
                continue
            pname, place, _ = part
            self._check_dtype(name, t.dtype, layer, pname)
            found.setdefault((layer.index, pname), {}).setdefault(int(m.group(2)), []).append(
                (place, Piece(t.file, t.offset, t.nbytes)))
        self.pieces: list[dict[str, list[list[Piece]]]] = []
        for l in info.layers:
            names = {}
            for n in l.param_names:
                got = found.get((l.index, n), {})
                if len(got) != l.num_experts:
                    raise CheckpointError(f"{self.path}: the disk tier cannot find layer {l.index}'s {n} for every "
                                          f"expert in the files ({len(got)} of {l.num_experts}); host_budget= needs "
                                          "every routed expert readable from the safetensors files.",
                                          str(self.path), f"{l.name}.{n}")
                names[n] = [[p for _, p in sorted(got[e], key=lambda op: op[0])] for e in range(l.num_experts)]
            self.pieces.append(names)
        self.expert_bytes = [sum(p.nbytes for ps in layer.values() for p in ps[0]) for layer in self.pieces]
        self._fds: dict[str, int] = {}

    def _check_dtype(self, name: str, code: str, layer, pname: str) -> None:
        want = getattr(layer.experts, pname).dtype
        have = SAFETENSORS_DTYPES[code][0]
        if have != want:
            raise CheckpointError(f"{self.path}: {name} is stored as {code} but the model computes in {want}: the "
                                  "disk tier reads experts as they lie, without conversion. Load the model in the "
                                  f"file's dtype (dtype={str(have).replace('torch.', '')!r}).", str(self.path), name)

    # ------------------------------------------------------------------ reading
    def _fd(self, file: str) -> int:
        fd = self._fds.get(file)
        if fd is None:
            fd = self._fds[file] = os.open(self.path / file, os.O_RDONLY)
        return fd

    def read_into(self, layer: int, expert: int, dst: dict[str, torch.Tensor]) -> int:
        """Read one expert's tensors into ``dst`` (name → a contiguous CPU tensor of the expert's shape and the
        model's dtype), then drop the file's pages for those ranges from the page cache. Returns bytes read."""
        total = 0
        for name, per_expert in self.pieces[layer].items():
            pieces = per_expert[expert]
            buf = memoryview(dst[name].view(torch.uint8).reshape(-1).numpy())
            at = 0
            for p in pieces:
                fd = self._fd(p.file)
                got = os.preadv(fd, [buf[at:at + p.nbytes]], p.offset)
                if got != p.nbytes:
                    raise CheckpointError(f"{self.path / p.file}: read {got} of {p.nbytes} bytes at offset "
                                          f"{p.offset} (layer {layer} expert {expert}): the file changed or is "
                                          "truncated.", str(self.path / p.file), name)
                if _FADVISE:
                    os.posix_fadvise(fd, p.offset, p.nbytes, os.POSIX_FADV_DONTNEED)
                at += p.nbytes
            total += at
        return total

    def read(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert's tensors in fresh CPU memory (an off-clock read: the oracle's look, the verification)."""
        l = self.info.layers[layer]
        out = {n: torch.empty(getattr(l.experts, n).shape[1:], dtype=getattr(l.experts, n).dtype)
               for n in l.param_names}
        self.read_into(layer, expert, out)
        return out

    def verify(self, experts: "list[tuple[int, int]] | None" = None) -> None:
        """Compare experts read from the files with the model's own parameters, bit for bit (default: the first
        and last expert of the first and last layer). Raises :class:`CheckpointError` on a difference: the files
        are not the model's, or their layout is not the one this module reads."""
        last = len(self.info.layers) - 1
        for layer, e in experts or sorted({(0, 0), (last, self.info.layers[last].num_experts - 1)}):
            got = self.read(layer, e)
            for n, t in got.items():
                ref = getattr(self.info.layers[layer].experts, n)[e].detach().to("cpu")
                if not torch.equal(t.view(torch.uint8), ref.contiguous().view(torch.uint8)):
                    raise CheckpointError(f"{self.path}: layer {layer} expert {e}'s {n} read from the files differs "
                                          "from the loaded model's: the model was not loaded from these files, or "
                                          "their expert layout is one the disk tier does not read.",
                                          str(self.path), n)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _model_key(name: str, ck: CheckpointInfo) -> str:
    return _renamed(name, ck.model_type)


def _fused_target(key: str, per_layer: dict) -> tuple:
    """(layer, param name) when ``key`` is a fused ``<experts>.<param>`` tensor, else (None, None)."""
    prefix, _, pname = key.rpartition(".")
    for cand in (prefix, "model." + prefix):
        layer = per_layer.get(cand)
        if layer is not None and pname in layer.param_names:
            return layer, pname
    return None, None
