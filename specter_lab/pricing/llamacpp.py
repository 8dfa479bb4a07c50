"""The llama.cpp-class engine: a cost model that prices every op as a llama.cpp-class engine runs it at batch 1
(``hardware="rtx3060-12gb-pcie4@llama.cpp"`` with ``weights="q4_k_m"``): graphs, one fused MoE kernel a layer,
weights streamed in their GGUF / MXFP4 format at that format's decode efficiency, the host computing its experts
from DRAM at a measured share of its bandwidth.

Each piece the schedule asks for (the same pieces as the eager and compiled engines of :mod:`.cost`)::

    dense part of a layer  = kernels x kernel_time + max(2·dense·n / peak FLOP/s,
                             dense bytes / (datasheet VRAM bandwidth x the dense format's efficiency)
                             + KV bytes at the context / (datasheet VRAM bandwidth x bf16's efficiency))
    one routed expert      = max(2·expert·n / peak FLOP/s, expert bytes / (VRAM bandwidth x experts' efficiency))
    one expert on the host = max(2·expert·n / host FLOP/s, expert bytes / (delivered DRAM x host efficiency))
    a copy                 = copy latency + expert bytes / link bandwidth
    a layer's host work    + 2 x copy latency (the activations go to the host and back)

Kernels are counted on a tiny sibling of the family (:func:`~specter_lab.pricing.opcount.op_counts`, transformers'
``grouped_mm``; two kernels per matmul once fused); the fused MoE kernel's are in the dense part. The KV cache is
read at 2 bytes a value, each layer up to its own window (gpt-oss alternates sliding-window and full layers), at
the run's context, or at ``depth`` tokens when given (decoding deep in a conversation). ``gpu_layers`` (llama.cpp's
``-ngl``) runs the first decoder layers whole on the host (attention from DRAM, every expert there: one round trip
at the boundary), and the LM head there too unless every layer is on the GPU.

``HOST_DECODE_EFFICIENCY`` is the one constant fitted to published rows (``sl.bench.consumer_anchors()``,
leave-one-out there): the share of the host's delivered DRAM bandwidth a batch-1 quantized expert matvec reaches
(dequantization and thread barriers cost the rest). It is a field of the hardware profile
(:attr:`~.profiles.HardwareProfile.host_efficiency`), so an estimate's band can move it.

Which lanes overlap is the schedule's, not the clock's: a static split's host layers run after their dense part
with nothing beside them (as llama.cpp's ``--n-cpu-moe`` does), a per-token split runs its host lane beside the
device (as ktransformers does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .cost import CostModel
from .precision import FORMATS, WeightPrecision, get_precision

__all__ = ["build", "KV_BITS", "LlamaCppCost", "LlamaSizes", "llama_cpp_cost", "cost_of_geometry", "sizes_of_geometry", "kernel_counts",
           "DRAFT_EFFICIENCY", "PREFILL_EFFICIENCY"]

# A low-bit draft's copy (RTN, group 64: 16-bit scale per 64 weights) is read like q4_0's simple blocks.
DRAFT_EFFICIENCY = FORMATS["q4_0"].gpu_efficiency
# Bits a KV cache value takes in each type llama.cpp's -ctk / -ctv accept (block scales included).
KV_BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5, "q4_1": 5.0,
           "q4_0": 4.5, "iq4_nl": 4.5}
# The share of the profile's peak FLOP/s a quantized MoE prefill reaches (small per-expert GEMMs: 512 tokens x
# top-8 over 128 experts is ~32 tokens an expert). An assumption; only pieces over many tokens are compute-bound,
# so decode never reads it. The W7800 check row (llama.cpp #24546: Qwen3-30B-A3B Q4_K_M pp512 2254-3186 tok/s)
# sits near it.
PREFILL_EFFICIENCY = 0.45


@dataclass(frozen=True)
class LlamaSizes:
    """What the llama.cpp-class pieces read of a model: per MoE layer its KV cache per token (16-bit, K + V) and
    window, its decoder index; the dense decoder layers' KV and parameters; the decoder layer count."""

    kv: tuple[tuple[float, "int | None"], ...]  # per MoE layer: bytes per cached token, window (None: all)
    decoder_of: tuple[int, ...]  # per MoE layer: its decoder layer's index
    dense_kv: tuple[tuple[float, "int | None"], ...] = ()  # per dense decoder layer
    dense_layer_params: int = 0  # one dense decoder layer's parameters
    decoder_layers: int = 0


@dataclass
class LlamaCppCost(CostModel):
    """A :class:`~.cost.CostModel` whose pieces are priced as a llama.cpp-class engine runs them (module
    docstring). ``weight_bytes`` is the experts' format's bytes per weight (what a copy moves)."""

    precision: WeightPrecision = field(default_factory=lambda: get_precision(None))
    sizes: LlamaSizes | None = None
    depth: "int | None" = None  # KV read at this many tokens whatever the position (None: the run's context)
    gpu_layers: "int | None" = None  # llama.cpp -ngl: decoder layers on the GPU from the last one back (None: all)
    kv_bits: float = 16.0  # bits a KV cache value takes (llama.cpp -ctk / -ctv: f16 16, q8_0 8.5, q4_0 4.5)
    kernels: tuple[float, float, float] = (1.0, 1.0, 1.0)  # a layer's dense part, its fused MoE block, LM head

    @property
    def engine(self) -> str:
        return "llama.cpp"

    # ------------------------------------------------------------------ where a decoder layer runs
    @property
    def host_decoder_layers(self) -> int:
        """Decoder layers run whole on the host (the first ones: llama.cpp offloads from the last layer back)."""
        n = self.sizes.decoder_layers if self.sizes else 0
        return 0 if self.gpu_layers is None else max(0, n - self.gpu_layers)

    def layer_on_host(self, layer: int) -> bool:
        """Is MoE layer ``layer``'s whole decoder layer on the host (``gpu_layers``)?"""
        return self.sizes is not None and self.sizes.decoder_of[layer] < self.host_decoder_layers

    @property
    def head_on_host(self) -> bool:
        """llama.cpp keeps the output layer on the GPU only when every decoder layer is (-ngl > layers)."""
        return self.gpu_layers is not None and self.sizes is not None and self.gpu_layers <= self.sizes.decoder_layers

    @property
    def host_moe_layers(self) -> list[int]:
        """MoE layers whose experts can only run on the host (their decoder layer is there)."""
        if self.sizes is None:
            return []
        return [l for l in range(len(self.sizes.decoder_of)) if self.layer_on_host(l)]

    # ------------------------------------------------------------------ the two streams
    def _vram(self) -> float:
        p = self.profile
        return p.hbm_datasheet or p.hbm_bandwidth / 0.8

    def _device(self, params: float, bpw: float, eff: float, n: int, kv_bytes: float, kernels: float) -> float:
        stream = params * bpw / (self._vram() * eff) + kv_bytes / (self._vram() * FORMATS["bf16"].gpu_efficiency)
        flops = 2.0 * params * n / (self.profile.peak_flops * (PREFILL_EFFICIENCY if n > 1 else 1.0))
        return kernels * self.profile.kernel_time + max(flops, stream)

    def _host(self, params: float, bpw: float, n: int, extra_bytes: float = 0.0) -> float:
        p = self.profile
        return max(2.0 * params * n / p.cpu_flops, (params * bpw + extra_bytes) / (p.cpu_mem_bandwidth * p.host_efficiency))

    def _kv(self, entry: "tuple[float, int | None]", context: int) -> float:
        per, window = entry
        at = self.depth if self.depth is not None else context
        return per * (at if window is None else min(window, at)) * (self.kv_bits / 16.0)

    # ------------------------------------------------------------------ the pieces
    def expert_time(self, n_tokens: int, weight_bytes: float | None = None) -> float:
        """One routed expert over n tokens on the device; ``weight_bytes``: a low-bit draft copy's packed bytes
        (read at :data:`DRAFT_EFFICIENCY`)."""
        key = ("expert", n_tokens, weight_bytes)
        t = self._memo.get(key)
        if t is None:
            if weight_bytes is None:
                bpw, eff = self.precision.experts.bytes_per_weight, self.precision.experts.gpu_efficiency
            else:
                bpw, eff = weight_bytes / self.expert_params, DRAFT_EFFICIENCY
            t = self._memo[key] = self.depth_scale * self._device(self.expert_params, bpw, eff, n_tokens, 0.0, 0.0)
        return t

    def host_expert_time(self, n_tokens: int, weight_bytes: float | None = None) -> float:
        """One expert on the host CPU over n tokens, read from DRAM at ``weight_bytes`` per weight (default: the
        experts' format)."""
        key = ("host", n_tokens, weight_bytes)
        t = self._memo.get(key)
        if t is None:
            bpw = self.precision.experts.bytes_per_weight if weight_bytes is None else weight_bytes
            t = self._memo[key] = self.depth_scale * self._host(self.expert_params, bpw, n_tokens)
        return t

    def host_transfer_time(self, n_tokens: int) -> float:
        """Nothing per expert: the activations cross once per layer (:meth:`host_trip_time`)."""
        return 0.0

    def host_trip_time(self, layer: int) -> float:
        """A layer that hands work to the host sends its activations there and back; a layer already on the host
        (``gpu_layers``) does not."""
        return 0.0 if self.layer_on_host(layer) else self.depth_scale * 2 * self.profile.copy_latency

    def dense_layer_time(self, n_tokens: int, context: int, layer: int | None = None) -> float:
        """Attention, norms, router and shared experts of MoE layer ``layer`` (+ its fused MoE kernel's launches),
        on the device, or whole on the host for a layer ``gpu_layers`` leaves there."""
        key = ("dense", n_tokens, context if self.depth is None else -1, layer)
        t = self._memo.get(key)
        if t is None:
            entry = self._kv_entry(layer)
            kv = self._kv(entry, context)
            d = self.precision.dense
            if layer is not None and self.layer_on_host(layer):
                t = self._host(self.dense_params, d.bytes_per_weight, n_tokens, kv)
            else:
                t = self._device(self.dense_params, d.bytes_per_weight, d.gpu_efficiency, n_tokens, kv,
                                 self.kernels[0] + self.kernels[1])
            t = self._memo[key] = self.depth_scale * t
        return t

    def _kv_entry(self, layer: int | None) -> "tuple[float, int | None]":
        if self.sizes is None or layer is None:
            return (float(self.kv_bytes_per_token_per_layer), None)
        return self.sizes.kv[layer]

    def head_time(self, n_tokens: int, context: int = 0) -> float:
        """The LM head (on the host when ``gpu_layers`` leaves it there), the dense decoder layers (DeepSeek's
        first), and one round trip where the decoder layers are split between the host and the device."""
        key = ("head", n_tokens, context if self.depth is None else -1)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = sum(self.head_parts(n_tokens, context))
        return t

    def head_parts(self, n_tokens: int, context: int = 0) -> tuple[float, float, float]:
        """:meth:`head_time` by lane: (device, host, round trip) seconds."""
        d, sizes = self.precision.dense, self.sizes
        dev = host = 0.0
        head = self.head_params * self.head_scale
        if self.head_on_host:
            host += self._host(head, d.bytes_per_weight, n_tokens)
        else:
            dev += self._device(head, d.bytes_per_weight, d.gpu_efficiency, n_tokens, 0.0, self.kernels[2])
        dense_kv = sizes.dense_kv if sizes else ((float(self.kv_bytes_per_token_per_layer), None),) * self.dense_layers
        per = sizes.dense_layer_params if sizes else (self.extra_dense_params / max(1, self.dense_layers))
        for i, entry in enumerate(dense_kv):
            kv = self._kv(entry, context)
            if i < self.host_decoder_layers:
                host += self._host(per, d.bytes_per_weight, n_tokens, kv)
            else:
                dev += self._device(per, d.bytes_per_weight, d.gpu_efficiency, n_tokens, kv, self.kernels[0])
        split = sizes is not None and 0 < self.host_decoder_layers < sizes.decoder_layers
        return dev, host, 2 * self.profile.copy_latency if split else 0.0

    @property
    def assumptions(self) -> str:
        p, w = self.profile, self.precision
        ngl = "" if self.gpu_layers is None else f", -ngl {self.gpu_layers} ({self.host_decoder_layers} layers on the host)"
        return (f"profile {p.name} (llama.cpp-class: graphs, one fused MoE kernel a layer, weights {w.label} at "
                f"{w.experts.gpu_efficiency:g}/{w.dense.gpu_efficiency:g} of {self._vram() / 1e9:.0f} GB/s datasheet "
                f"VRAM, host {p.cpu_mem_bandwidth / 1e9:.1f} GB/s delivered x {p.host_efficiency:g}{ngl}); "
                f"projection {self.projection_label}")


def sizes_of_geometry(geom) -> LlamaSizes:
    """:class:`LlamaSizes` of a :class:`~specter_lab.model.geometry.ModelGeometry` (a config's sizes)."""
    moe = tuple(geom.moe_decoder_index)
    dense = [i for i in range(geom.decoder_layers) if i not in set(moe)]
    kv = list(zip(geom.kv_bytes_per_token, geom.kv_window))
    return LlamaSizes(kv=tuple(kv[i] for i in moe), decoder_of=moe, dense_kv=tuple(kv[i] for i in dense),
                      dense_layer_params=geom.dense_layer_params // len(dense) if dense else 0,
                      decoder_layers=geom.decoder_layers)


def cost_of_geometry(geom, profile, precision: "WeightPrecision | str | None", depth: "int | None" = None,
                     gpu_layers: "int | None" = None, kv_type: str = "f16") -> LlamaCppCost:
    """The llama.cpp-class cost model of the model a config describes (``geom``), on ``profile``: the same pieces
    a replay of that config's routing prices with (a test holds the two equal), for closed-form sums."""
    from .opcount import op_counts

    ops = op_counts(geom.model_type, "grouped_mm", geom.top_k)
    kv = max(geom.kv_bytes_per_token) if geom.kv_bytes_per_token else 0.0
    base = CostModel(profile, geom.expert_params, geom.dense_params_per_moe_layer, geom.head_params, int(kv),
                     geom.hidden, extra_dense_params=geom.dense_layer_params, dense_layers=geom.dense_layers, ops=ops)
    return llama_cpp_cost(base, precision, sizes_of_geometry(geom), kernel_counts(ops), depth, gpu_layers, kv_type)


def llama_cpp_cost(base: CostModel, precision: "WeightPrecision | str | None", sizes: LlamaSizes | None,
                   kernels: tuple[float, float, float], depth: "int | None" = None,
                   gpu_layers: "int | None" = None, kv_type: "str | None" = None) -> LlamaCppCost:
    """The llama.cpp-class cost model of the model ``base`` prices (its sizes, projection and op counts), with the
    weights in ``precision`` (a name such as ``"q4_k_m"``, ``"mxfp4+q8_0"``; None: bf16) and the KV cache in
    ``kv_type`` (llama.cpp's -ctk / -ctv: ``"f16"``, ``"q8_0"``, ``"q4_0"``, ...)."""
    prec = get_precision(precision)
    bits = KV_BITS.get(kv_type or "f16")
    if bits is None:
        raise ValueError(f"kv_type={kv_type!r}: use one of {sorted(KV_BITS)} (llama.cpp's -ctk / -ctv types).")
    fields_ = {f: getattr(base, f) for f in ("profile", "expert_params", "dense_params", "head_params",
                                              "kv_bytes_per_token_per_layer", "hidden", "shape_name",
                                              "extra_dense_params", "head_scale", "depth_scale", "dense_layers", "ops",
                                              "projection", "projection_label")}
    fields_["weight_bytes"] = prec.experts.bytes_per_weight
    return LlamaCppCost(**fields_, precision=prec, sizes=sizes, depth=depth, gpu_layers=gpu_layers, kernels=kernels,
                        kv_bits=bits)


def kernel_counts(ops: Any) -> tuple[float, float, float]:
    """Kernels of a layer's dense part, of its fused MoE block, of the LM head: two per matmul once fused (the
    compiled engine's rule, :func:`~.cost.piece_time`)."""
    if ops is None:
        return (1.0, 1.0, 1.0)
    kern = lambda triple: max(1.0, 2.0 * triple[2])
    return (kern(ops.moe_layer), kern(ops.experts_fixed), kern(ops.head))


def build(info, profile, shape, weight_bytes: float, weights=None, depth: "int | None" = None,
          gpu_layers: "int | None" = None, kv_type: "str | None" = None) -> LlamaCppCost:
    """The llama.cpp-class cost model of a model (``info``: a :class:`specter_lab.model.MoEModelInfo`) or of its
    cost shape's (``shape``), on ``profile`` (what :func:`~.engines.build_cost_model` calls for this engine)."""
    from ..errors import OptionError
    from .cost import torch_cost
    from .opcount import op_counts

    if gpu_layers is not None and (isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int) or gpu_layers < 0):
        raise OptionError(f"gpu_layers={gpu_layers!r}: the decoder layers on the GPU (llama.cpp -ngl), an integer "
                          ">= 0, or None for all.", "gpu_layers", gpu_layers, ("None", "0, 1, ..."))
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise OptionError(f"depth={depth!r}: tokens in the KV cache while decoding, an integer >= 0, or None for "
                          "the run's own positions.", "depth", depth, ("None", "0, 4096, ..."))
    family = shape.family if shape is not None else (info.model_type or "qwen2_moe")
    top_k = info.top_k if shape is None else shape.top_k
    base = torch_cost(info, profile, shape, weight_bytes, "grouped_mm")
    sizes = None if shape is not None else _llama_sizes(info)
    return llama_cpp_cost(base, weights, sizes, kernel_counts(op_counts(family, "grouped_mm", top_k)), depth,
                          gpu_layers, kv_type)


def _llama_sizes(info):
    """Per-layer KV and the dense decoder layers of the model ``info`` describes, for the llama.cpp-class engine
    (its config's layer kinds and windows; every layer full attention without one)."""
    from ..model.geometry import kv_layout  # a config's layer kinds: read when a model's info is priced

    n = len(info.decoder_layers) if info.decoder_layers is not None else info.num_layers
    kv, window, _ = kv_layout(info.config or {}, info.kv_dim, n)
    moe = [l.decoder_index for l in info.layers]
    dense = [i for i in range(n) if i not in set(moe)]
    n_dense = len(dense)
    return LlamaSizes(kv=tuple((kv[i], window[i]) for i in moe), decoder_of=tuple(moe),
                      dense_kv=tuple((kv[i], window[i]) for i in dense),
                      dense_layer_params=info.dense_layer_params // n_dense if n_dense else 0, decoder_layers=n)
