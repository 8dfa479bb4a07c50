"""Group-wise weight quantization of the routed experts' fused tensors: the draft's experts.

Two methods: ``rtn`` (round-to-nearest, asymmetric min/max per group, vectorised over all experts of a layer at
once) and ``hqq`` (Half-Quadratic Quantization from the ``hqq`` library, which refines scale and zero point).
Groups run along each expert's *input* dimension (the last axis of a ``[E, out, in]`` tensor; for transposed
layouts the tensor is quantized transposed), zero-padded where the group size does not divide it.

What the draft costs on the device is the *packed* size: the codes (2, 3.2, 4 or 8 bits per weight: HQQ's
bit-packing formats, 3 bits being ten codes per 32-bit word), an fp16 scale and zero per group, fp16 biases.
Three storage layouts (``DraftExperts.layout``):

* ``dense``  – dequantized once (the CPU default for models whose experts take under
  :data:`DENSE_DRAFT_LIMIT`: fastest there, and a dequantized copy of a small model costs little; a real-size
  model's draft on the CPU is packed instead, since a dequantized copy is as large as the experts themselves);
* ``int4mm`` – 4 bits in the layout of PyTorch's int4 matmul kernel (tinygemm), which reads the packed weights
  directly: one op per projection, nothing dequantized (CUDA sm80+, and the CPU kernel for ``pack=True``);
* ``packed`` – HQQ-packed codes, unpacked (one vectorised shift/mask) and dequantized per expert when used
  (2, 3 and 8 bits, or where the int4 kernel is missing).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.memory import DENSE_DRAFT_LIMIT, QUANT_CHUNK_BYTES
from ..model.pages import file_backed, release_file_pages, trim_heap

SUPPORTED_BITS = (2, 3, 4, 8)
METHODS = ("rtn", "hqq")
# Code bits per weight as stored: HQQ packs 3-bit codes ten to a 32-bit word.
STORED_BITS = {2: 2.0, 3: 3.2, 4: 4.0, 8: 8.0}
LAYOUTS = ("dense", "int4mm", "packed")

__all__ = ["QuantSpec", "QuantizedTensor", "DraftExperts", "Int4Weight", "quantize_tensor", "pack_codes",
           "unpack_codes", "SUPPORTED_BITS", "LAYOUTS", "shared_draft"]


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
        """Bytes of ``numel`` weights grouped along an input axis of ``last_dim``: codes as stored + fp16 scale
        and zero per group."""
        rows = numel // last_dim
        groups_per_row = math.ceil(last_dim / self.group_size)
        padded = rows * groups_per_row * self.group_size
        return math.ceil(padded * STORED_BITS[self.bits] / 8) + rows * groups_per_row * 4


_PER_WORD = {2: (4, torch.uint8), 3: (10, torch.int32), 4: (2, torch.uint8), 8: (1, torch.uint8)}


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[E, ...]`` (values < 2**bits) → HQQ's packed format per expert ``[E, rows, 1]``: the flat codes
    split into ``per_word`` row blocks, packed with ``hqq.core.bitpack.BitPack`` (2 and 4 bits in uint8, 3 bits
    ten to an int32, 8 bits as they are)."""
    from hqq.core.bitpack import BitPack

    per_word, _ = _PER_WORD[bits]
    flat = codes.reshape(codes.shape[0], -1)
    pad = (-flat.shape[1]) % per_word
    if pad:
        flat = F.pad(flat, (0, pad))
    fn = {2: BitPack.pack_2bit_u8, 3: BitPack.pack_3bit_32, 4: BitPack.pack_4bit_u8, 8: BitPack.pack_8bit_u8}[bits]
    return torch.stack([fn(row.reshape(-1, 1).to(torch.uint8 if bits != 3 else torch.int32)) for row in flat])


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes` for one or more experts ``[..., rows, 1]`` → uint8 codes ``[..., n]``. One
    shift and one mask over all codes (BitPack's own unpack loops in Python, an op per code slot); a test checks
    it against BitPack's."""
    per_word, _ = _PER_WORD[bits]
    if per_word == 1:
        return packed.reshape(*packed.shape[:-2], -1)[..., :n]
    width = 32 if bits == 3 else 8
    step = bits if bits != 3 else 3
    top = 2 if bits == 3 else 0  # BitPack's 3-bit words leave the two top bits unused
    shifts = torch.arange(width - top - step, -1, -step, device=packed.device, dtype=packed.dtype)[:per_word]
    blocks = (packed.squeeze(-1).unsqueeze(-2) >> shifts.view(-1, 1)) & (2**bits - 1)  # [..., per_word, rows]
    return blocks.reshape(*packed.shape[:-2], -1)[..., :n].to(torch.uint8)


@dataclass
class QuantizedTensor:
    """One fused tensor ``[E, rows, cols]`` quantized group-wise along ``cols``: uint8 ``codes [E, rows, G, g]``,
    ``scale`` and ``zero`` ``[E, rows, G, 1]``. ``dequantize`` computes ``(code − zero) · scale`` in float32 and casts
    once, whatever layout the codes are stored in, so every layout gives the same weights."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    shape: tuple[int, ...]  # original shape
    packed_bytes: int
    rel_error: float
    bits: int | None = None  # set when ``codes`` are HQQ-packed (pack_codes)
    code_shape: tuple[int, ...] | None = None  # the uint8 codes' shape before packing

    def pack(self, bits: int) -> None:
        """Store the codes packed (what the device budget counts); dequantize() unpacks on use."""
        if self.bits is None:
            self.code_shape = tuple(self.codes.shape)
            self.codes = pack_codes(self.codes, bits)
            self.bits = bits

    def _codes(self, index=None) -> torch.Tensor:
        codes = self.codes if index is None else self.codes[index]
        if self.bits is None:
            return codes
        per_expert = self.code_shape[1:]
        return unpack_codes(codes, self.bits, math.prod(per_expert)).reshape(*codes.shape[:-2], *per_expert)

    def dequantize(self, index=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """All experts, or the one(s) at ``index`` along the first axis, as a dense tensor."""
        c = self._codes(index)
        s, z = (self.scale, self.zero) if index is None else (self.scale[index], self.zero[index])
        w = (c.float() - z.float()) * s.float()
        last = self.shape[-1]
        lead = self.shape[:-1] if index is None else self.shape[1:-1]
        return w.reshape(*lead, -1)[..., :last].to(dtype)


def _grouped(w: torch.Tensor, g: int) -> torch.Tensor:
    last = w.shape[-1]
    pad = (-last) % g
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(*w.shape[:-1], -1, g)


def _rtn(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qmax = 2**bits - 1
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    # A constant group (hi == lo: pruned or zero-padded rows) gets a scale that still represents its value.
    scale = torch.where(hi > lo, (hi - lo) / qmax, lo.abs() / qmax)
    # Stored as fp16, so quantize with that value; never 0 (the smallest fp16 subnormal), or codes become NaN.
    scale = scale.half().float().clamp(min=2.0**-24)
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


class Int4Weight:
    """One expert's projection in the int4 matmul kernel's layout (PyTorch's tinygemm: ``aten._weight_int4pack_mm``
    on CUDA, ``_weight_int4pack_mm_for_cpu`` on the CPU): computes ``x @ dequant(W).T`` from the packed weights.

    The kernel dequantizes ``(q − 8) · scale + zero'``; ours is ``(q − z) · scale``, the same with
    ``zero' = (8 − z) · scale``. The input axis is padded to whole groups (the kernel's requirement)."""

    __slots__ = ("packed", "scales_zeros", "group_size", "pad", "cpu")

    def __init__(self, packed, scales_zeros, group_size: int, pad: int, cpu: bool) -> None:
        self.packed, self.scales_zeros, self.group_size, self.pad, self.cpu = packed, scales_zeros, group_size, pad, cpu

    def packed_matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad:
            x = F.pad(x, (0, self.pad))
        op = torch.ops.aten._weight_int4pack_mm_for_cpu if self.cpu else torch.ops.aten._weight_int4pack_mm
        return op(x, self.packed, self.group_size, self.scales_zeros)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_zeros))


def _int4_weights(qt: QuantizedTensor, spec: QuantSpec, dtype: torch.dtype, device: torch.device) -> list[Int4Weight]:
    """Every expert of ``qt`` converted to the int4 kernel's layout (raises where the kernel is missing)."""
    E, rows, G, g = qt.codes.shape
    k_pad = G * g
    cpu = device.type == "cpu"
    out = []
    for e in range(E):
        q = qt.codes[e].reshape(rows, k_pad).to(torch.int32).to(device)
        if cpu:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        else:
            tiles = next(t for t in (8, 4, 2) if k_pad % (t * 16) == 0)
            packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), tiles)
        s, z = qt.scale[e].reshape(rows, G).float(), qt.zero[e].reshape(rows, G).float()
        sz = torch.stack([s, (8 - z) * s], -1).transpose(0, 1).contiguous().to(dtype).to(device)  # [G, rows, 2]
        out.append(Int4Weight(packed, sz, g, k_pad - qt.shape[-1], cpu))
    return out


def _kernel_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the int4 kernel runs here for this dtype (it needs sm80+ on CUDA; bf16 there)."""
    try:
        spec = QuantSpec(4, 32)
        w = quantize_tensor(torch.randn(1, 16, 64), spec)
        (iw,) = _int4_weights(w, spec, dtype, device)
        iw.packed_matmul(torch.randn(1, 64, dtype=dtype, device=device))
        return True
    except (RuntimeError, NotImplementedError, StopIteration):
        return False


def _chunk_experts(t: torch.Tensor) -> int:
    """How many experts of fused tensor ``t`` ([E, ...]) to quantize at once."""
    per_expert = t[0].numel() * 4
    return max(1, min(t.shape[0], QUANT_CHUNK_BYTES // max(1, per_expert)))


def _dense_bytes(info, dtype: torch.dtype, experts: "list[set[int]] | None" = None) -> int:
    """Bytes a dequantized draft would hold: the routed experts' weights (those kept) at ``dtype``."""
    total = 0
    for li, layer in enumerate(info.layers):
        share = 1.0 if experts is None else len(experts[li]) / layer.num_experts
        total += share * sum(getattr(layer.experts, n).numel() for n in layer.param_names)
    return int(total * dtype.itemsize)


class DraftExperts:
    """The draft's routed experts for every MoE layer: quantized copies of the target's fused tensors in one of
    :data:`LAYOUTS` (module docstring). Biases stay in full precision (they are tiny). Everything else the draft
    uses is the target's own tensor.

    ``pack=True`` forces the device layout on the CPU (tests; measuring what the device would hold); ``experts``
    (per layer, a set of expert ids) keeps only those experts (the hybrid draft), indexed by their own ids."""

    def __init__(self, info, spec: QuantSpec, device: torch.device | str = "cpu",
                 compute_dtype: torch.dtype | None = None, pack: bool | None = None,
                 experts: "list[set[int]] | None" = None) -> None:
        self.spec = spec
        self.device = torch.device(device)
        first = getattr(info.layers[0].experts, info.layers[0].param_names[0])
        self.dtype = compute_dtype or first.dtype
        if pack is None:  # the device layout off the CPU; on it, dense while a dequantized copy is small
            pack = self.device.type != "cpu" or _dense_bytes(info, self.dtype, experts) > DENSE_DRAFT_LIMIT
        self.packed = bool(pack)
        self.layout = "dense" if not self.packed else (
            "int4mm" if spec.bits == 4 and _kernel_ok(self.device, self.dtype) else "packed")
        self.kernel = {"dense": "dequantized once", "int4mm": "torch int4 matmul (tinygemm)",
                       "packed": "HQQ-packed codes, dequantized per expert"}[self.layout]
        self._views: list[dict[int, dict]] = []  # per layer: expert → its weights (built once)
        self._stored = 0
        self.released = 0  # bytes of mapped expert pages handed back to the OS while quantizing
        packed = numel = 0
        errs = []
        for li, layer in enumerate(info.layers):
            keep = sorted(experts[li]) if experts is not None else None
            views, p, n, err = self._quantize_layer(layer, keep)
            self._views.append(views)
            packed, numel = packed + p, numel + n
            errs += err
        self.packed_bytes = packed
        # bytes per weight relative to fp16: what fraction of the fp16 expert bytes the draft costs
        self.fp16_ratio = packed / (2 * numel) if numel else 0.0
        self.rel_error = sum(e * n for e, n in errs) / max(1, sum(n for _, n in errs))

    def _quantize_layer(self, layer, keep: "list[int] | None"):
        """(expert → weights, packed bytes, fp weights, [(rel_error, numel)]) of one MoE layer."""
        mod = layer.experts
        ids = keep if keep is not None else list(range(layer.num_experts))
        views: dict[int, dict] = {e: {} for e in ids}
        packed = numel = 0
        errs = []
        for name in layer.param_names:
            if name.endswith("_bias"):
                t = getattr(mod, name).detach()[ids].to(self.device)
                for i, e in enumerate(ids):
                    views[e][name] = t[i]
                packed += t.numel() * 2
                self._stored += t.numel() * t.element_size()
                continue
            # Groups run along the input axis: a transposed layout ([E, in, out]) is quantized transposed. A
            # real-size tensor is quantized a few experts at a time (groups never span experts, so the codes are
            # the same): its float32 working copies stay bounded instead of three times the whole tensor.
            # A tensor mapped from the checkpoint's files hands each chunk's pages back once it is quantized
            # (model/pages.py): the pass reads every expert once, and they need not all stay resident.
            full = getattr(mod, name).detach()
            step = _chunk_experts(full)
            mapped = file_backed(full) is not None
            err2 = norm2 = 0.0
            for c0 in range(0, len(ids), step):
                chunk = ids[c0: c0 + step]
                if keep is None:  # consecutive experts: a view, not a copy
                    t = full[c0: c0 + step] if step < len(ids) else full
                else:
                    t = full[chunk]
                src = t.transpose(1, 2) if mod.is_transposed else t
                qt = quantize_tensor(src, self.spec)
                packed, numel = packed + qt.packed_bytes, numel + t.numel()
                n2 = float(t.float().norm()) ** 2 if step < len(ids) else 1.0
                err2, norm2 = err2 + qt.rel_error ** 2 * n2, norm2 + n2
                for e, w in zip(chunk, self._stored_weights(qt, name, mod.is_transposed)):
                    views[e].update(w)
                if mapped:
                    for part in ([t] if keep is None else [full[e] for e in chunk]):
                        self.released += release_file_pages(part)
                del qt, src, t
                trim_heap()  # the chunk's freed temporaries go back to the OS, not held between packed weights
            errs.append(((err2 / norm2) ** 0.5 if norm2 else 0.0, full[:1].numel() * len(ids)))
        return views, packed, numel, errs

    def _stored_weights(self, qt: QuantizedTensor, name: str, transposed: bool) -> list[dict]:
        """Per expert, the entries ``weights()`` returns for one tensor, in this draft's layout."""
        if self.layout == "int4mm":
            ws = _int4_weights(qt, self.spec, self.dtype, self.device)
            self._stored += sum(w.nbytes for w in ws)
            return [{name: w} for w in ws]
        if self.layout == "packed":
            if self.spec.bits < 8:
                qt.pack(self.spec.bits)
            qt.codes, qt.scale, qt.zero = (qt.codes.to(self.device), qt.scale.half().to(self.device),
                                           qt.zero.half().to(self.device))
            self._stored += sum(p.numel() * p.element_size() for p in (qt.codes, qt.scale, qt.zero))
            return [{name: _Dequantized(qt, i, self.dtype)} for i in range(qt.shape[0])]
        dense = qt.dequantize(dtype=self.dtype).to(self.device)  # [E, out, in]
        self._stored += dense.numel() * dense.element_size()
        if transposed:  # the module's own layout [in, out], read by a plain x @ W
            return [{name: dense[i].t()} for i in range(dense.shape[0])]
        return [{name: dense[i], f"{name}.t": dense[i].t()} for i in range(dense.shape[0])]

    def stored_bytes(self) -> int:
        """Bytes the quantized experts actually occupy as stored (codes + scales + zeros + biases)."""
        return self._stored

    def weights(self, layer: int, expert: int) -> dict:
        """The draft's weights of one expert, for :func:`~specter_lab.model.experts.expert_apply`."""
        return self._views[layer][expert]

    def experts(self, layer: int) -> list[int]:
        return list(self._views[layer])


class _Dequantized:
    """A packed expert tensor that dequantizes itself when the draft multiplies by it."""

    __slots__ = ("qt", "index", "dtype")

    def __init__(self, qt: QuantizedTensor, index: int, dtype: torch.dtype) -> None:
        self.qt, self.index, self.dtype = qt, index, dtype

    def packed_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.qt.dequantize(self.index, dtype=self.dtype).t()


# Quantizing the draft is the slow part of building an engine, and on a real-size model its copy is gigabytes:
# the engines of a model and sl.record share one per (spec, device), held no longer than the model lives.
_DRAFTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def shared_draft(model, info, spec: QuantSpec, device: "torch.device | str") -> DraftExperts:
    """The draft of ``model`` in ``spec`` on ``device``, quantized on first use and then shared.

    On a GPU at most one draft per model is kept on the device (the planner and ``compare`` try several):
    building another drops the shared one, so a draft nobody uses any more is freed rather than sitting outside
    every budget."""
    device = torch.device(device)
    shared = _DRAFTS.setdefault(model, {})
    key = (spec, str(device))
    if key not in shared:
        if device.type != "cpu":
            for other in [k for k in shared if k[1] == key[1]]:
                del shared[other]
        shared[key] = DraftExperts(info, spec, device=device)
    return shared[key]
