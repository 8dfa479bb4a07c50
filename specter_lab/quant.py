"""Group-wise weight quantization of the routed experts' fused tensors: the draft's experts.

Two methods: ``rtn`` (round-to-nearest, asymmetric min/max per group, vectorised over all experts of a layer at
once) and ``hqq`` (Half-Quadratic Quantization from the ``hqq`` library, which refines scale and zero point).
Groups run along the last axis of each fused tensor; a group size that does not divide it is zero-padded.

What the draft costs on the device is the *packed* size: ``bits`` per weight, plus an fp16 scale and zero per
group, plus fp16 biases. On the CPU the dequantized copy is kept for speed (CPU memory is not the budget); on
CUDA the codes are stored bit-packed (``bits`` bit-planes of 8 weights per byte, so 2, 3 and 4 bits cost exactly
that) with fp16 scales and zeros — the device holds what the budget counts — and each expert is unpacked and
dequantized when the draft uses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 3, 4, 8)
METHODS = ("rtn", "hqq")

__all__ = ["QuantSpec", "QuantizedTensor", "DraftExperts", "quantize_tensor", "pack_codes", "unpack_codes",
           "SUPPORTED_BITS"]


@dataclass(frozen=True)
class QuantSpec:
    """How the draft's routed experts are quantized: ``bits`` ∈ {2, 3, 4, 8}, ``group_size`` weights per scale,
    ``method`` ``"rtn"`` or ``"hqq"``."""

    bits: int = 4
    group_size: int = 64
    method: str = "rtn"

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or self.bits not in SUPPORTED_BITS:
            raise ValueError(f"QuantSpec(bits={self.bits!r}) is not supported; use one of {SUPPORTED_BITS}.")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or not 8 <= self.group_size <= 4096:
            raise ValueError(f"QuantSpec(group_size={self.group_size!r}) must be an integer in [8, 4096] "
                             "(32, 64 or 128 are usual); sizes that do not divide a dimension are padded.")
        if self.method not in METHODS:
            raise ValueError(f"QuantSpec(method={self.method!r}) is unknown; use one of {METHODS}.")

    @property
    def label(self) -> str:
        return f"int{self.bits}-g{self.group_size}-{self.method}"

    def packed_bytes(self, numel: int, last_dim: int) -> int:
        """Bytes of ``numel`` weights grouped along a last axis of ``last_dim``: codes + fp16 scale and zero."""
        rows = numel // last_dim
        groups_per_row = math.ceil(last_dim / self.group_size)
        padded = rows * groups_per_row * self.group_size
        return math.ceil(padded * self.bits / 8) + rows * groups_per_row * 4


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[E, ...]`` (values < 2**bits) → bit-planes ``[E, bits, ceil(n / 8)]`` uint8, n = weights per
    expert: plane b holds bit b of 8 consecutive codes per byte. Any ``bits`` packs exactly, 3 included."""
    E = codes.shape[0]
    flat = codes.reshape(E, -1)
    pad = (-flat.shape[1]) % 8
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    weights = (1 << torch.arange(8, device=codes.device, dtype=torch.int32))
    planes = [(((flat >> b) & 1).to(torch.int32).reshape(E, -1, 8) * weights).sum(-1) for b in range(bits)]
    return torch.stack(planes, 1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: bit-planes ``[..., bits, m]`` → uint8 codes ``[..., n]``."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bitsets = ((packed.unsqueeze(-1) >> shifts) & 1).reshape(*packed.shape[:-1], -1)  # [..., bits, 8m]
    codes = torch.zeros(bitsets.shape[:-2] + bitsets.shape[-1:], dtype=torch.uint8, device=packed.device)
    for b in range(bits):
        codes |= bitsets[..., b, :] << b
    return codes[..., :n]


@dataclass
class QuantizedTensor:
    codes: torch.Tensor  # uint8 [..., G, g], or bit-planes [E, bits, m] when ``bits`` is set (pack_codes)
    scale: torch.Tensor  # [..., G, 1]
    zero: torch.Tensor  # [..., G, 1]
    shape: tuple[int, ...]  # original shape
    packed_bytes: int
    rel_error: float
    bits: int | None = None  # set when ``codes`` are bit-packed
    code_shape: tuple[int, ...] | None = None  # the uint8 codes' shape before packing

    def pack(self, bits: int) -> None:
        """Store the codes bit-packed (what the device budget counts); dequantize() unpacks on use."""
        if self.bits is None:
            self.code_shape = tuple(self.codes.shape)
            self.codes = pack_codes(self.codes, bits)
            self.bits = bits

    def _codes(self, index=None) -> torch.Tensor:
        if self.bits is None:
            return self.codes if index is None else self.codes[index]
        packed = self.codes if index is None else self.codes[index]
        per_expert = self.code_shape[1:]
        return unpack_codes(packed, self.bits, math.prod(per_expert)).reshape(*packed.shape[:-2], *per_expert)

    def dequantize(self, index=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """All experts, or the one(s) at ``index`` along the first axis, as a dense tensor."""
        c = self._codes(index)
        s, z = (self.scale, self.zero) if index is None else (self.scale[index], self.zero[index])
        w = (c.to(dtype) - z.to(dtype)) * s.to(dtype)
        last = self.shape[-1]
        lead = self.shape[:-1] if index is None else self.shape[1:-1]
        return w.reshape(*lead, -1)[..., :last]


def _grouped(w: torch.Tensor, g: int) -> torch.Tensor:
    last = w.shape[-1]
    pad = (-last) % g
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(*w.shape[:-1], -1, g)


def _rtn(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qmax = 2**bits - 1
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = ((hi - lo) / qmax).clamp(min=1e-8).half().float()  # stored as fp16, so quantize with that value
    zero = torch.round(-lo / scale).clamp(0, qmax)
    codes = torch.clamp(torch.round(w / scale) + zero, 0, qmax)
    return codes.to(torch.uint8), scale, zero


def _hqq(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from hqq.core.quantize import Quantizer

    g = w.shape[-1]
    flat = w.reshape(-1, g)
    w_q, meta = Quantizer.quantize(flat, nbits=bits, group_size=g, optimize=True, axis=1, bitpack=False,
                                   compute_dtype=torch.float32, device="cpu" if flat.device.type == "cpu" else "cuda")
    codes = w_q.float().round().clamp(0, 2**bits - 1).to(torch.uint8).reshape(w.shape)
    scale = meta["scale"].float().reshape(*w.shape[:-1], 1)
    zero = meta["zero"].float().reshape(*w.shape[:-1], 1)
    return codes, scale, zero


def quantize_tensor(w: torch.Tensor, spec: QuantSpec) -> QuantizedTensor:
    """Quantize a fused expert tensor ``[E, rows, cols]`` group-wise along its last axis."""
    wf = w.detach().float()
    grouped = _grouped(wf, spec.group_size)
    codes, scale, zero = (_rtn if spec.method == "rtn" else _hqq)(grouped, spec.bits)
    qt = QuantizedTensor(codes, scale, zero, tuple(w.shape), spec.packed_bytes(w.numel(), w.shape[-1]), 0.0)
    deq = qt.dequantize()
    qt.rel_error = float((deq - wf).norm() / wf.norm().clamp(min=1e-12))
    return qt


class DraftExperts:
    """The draft's routed experts for every MoE layer: quantized copies of the target's fused tensors.
    Biases stay in full precision (they are tiny). Everything else the draft uses is the target's own tensor."""

    def __init__(self, info, spec: QuantSpec, device: torch.device | str = "cpu",
                 compute_dtype: torch.dtype | None = None, pack: bool | None = None) -> None:
        self.spec = spec
        self.device = torch.device(device)
        # Off the CPU the device memory is the budget: keep packed codes there (pack=True forces it on the CPU,
        # for tests and for measuring what the device would hold).
        self.packed = self.device.type != "cpu" if pack is None else bool(pack)
        self.layers: list[dict[str, QuantizedTensor | torch.Tensor]] = []
        self._dense: list[dict[str, torch.Tensor]] = []  # CPU: dequantized once, for speed
        self.dtype = compute_dtype
        packed = numel = 0
        errs = []
        for layer in info.layers:
            q: dict[str, QuantizedTensor | torch.Tensor] = {}
            dense: dict[str, torch.Tensor] = {}
            for name in layer.param_names:
                t = getattr(layer.experts, name).detach()
                dtype = compute_dtype or t.dtype
                self.dtype = dtype
                if name.endswith("_bias"):
                    q[name] = t.to(self.device)
                    dense[name] = q[name]
                    packed += t.numel() * 2
                    continue
                qt = quantize_tensor(t, spec)
                packed += qt.packed_bytes
                numel += t.numel()
                errs.append((qt.rel_error, t.numel()))
                if not self.packed:
                    dense[name] = qt.dequantize(dtype=dtype)
                else:
                    if spec.bits < 8:
                        qt.pack(spec.bits)
                    qt.codes, qt.scale, qt.zero = (qt.codes.to(self.device), qt.scale.half().to(self.device),
                                                   qt.zero.half().to(self.device))
                q[name] = qt
            self.layers.append(q)
            self._dense.append(dense)
        self.packed_bytes = packed
        # bytes per weight relative to fp16: what fraction of the fp16 expert bytes the draft costs
        self.fp16_ratio = packed / (2 * numel) if numel else 0.0
        self.rel_error = sum(e * n for e, n in errs) / max(1, sum(n for _, n in errs))

    def stored_bytes(self) -> int:
        """Bytes the quantized experts actually occupy (codes + scales + zeros + biases), as stored."""
        total = 0
        for q in self.layers:
            for t in q.values():
                parts = (t.codes, t.scale, t.zero) if isinstance(t, QuantizedTensor) else (t,)
                total += sum(p.numel() * p.element_size() for p in parts)
        return total

    def weights(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        dense = self._dense[layer]
        if dense and not self.packed:
            return {name: t[expert] for name, t in dense.items()}
        return {name: (t.dequantize(expert, dtype=self.dtype) if isinstance(t, QuantizedTensor) else t[expert])
                for name, t in self.layers[layer].items()}
