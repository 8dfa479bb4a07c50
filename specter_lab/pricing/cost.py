"""The cost model that prices every op of one model on one profile for the simulated clock.

Each priced piece of a forward (the non-expert part of a MoE layer, one routed expert, the head) costs

    max(device time, host time)
    device time = kernels · kernel_time + max(flops / peak_flops, bytes_read / hbm_bandwidth)
    host time   = aten ops · host_op_cost          (execution="eager"; 0 when "compiled")

with the aten ops and kernels *counted* for the model's family (:mod:`specter_lab.pricing.opcount`), not assumed,
plus ``syncs · sync_time`` for the host synchronisations counted in the same piece (:func:`sync_time`).
Why a max per piece: eager PyTorch enqueues kernels asynchronously, so host and device overlap within a piece,
but the runtime reads each layer's routing back to the host (a sync per layer), so they cannot drift further
apart than a layer. ``compiled`` fuses pointwise work (kernels = 2 per matmul) and dispatches from a graph.

Cost of a copy = copy_latency + bytes / pcie_bandwidth.

A projection through a :class:`CostShape` prices the run's layers at the real model's sizes; ``@full`` also at
its real depth (``depth_scale`` real MoE layers per run layer, dense first layers and the whole LM head).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the counts are made by torch (opcount): the prices read them without importing it
    from .opcount import OpCounts
from .profiles import HardwareProfile

__all__ = ["CostModel", "piece_time", "sync_time", "torch_cost"]

Count = tuple[float, float, float]  # (aten ops, kernels, matmuls)


def sync_time(profile: HardwareProfile) -> float:
    """What one host synchronisation adds to a piece: the host waits for the device's queue to drain, then the
    device idles until the host issues its next kernel. Priced as one launch gap plus one kernel's time (an
    assumption: no published per-sync figure exists for these systems; it is the same in both execution modes,
    since a data-dependent read-back breaks a graph as it breaks eager overlap)."""
    return profile.launch_overhead + profile.kernel_time


def piece_time(profile: HardwareProfile, flops: float, nbytes: float, count: Count, syncs: float = 0.0) -> float:
    """max(device, host) of one forward piece with ``count`` = (aten ops, kernels, matmuls) dispatched, plus
    ``syncs`` host synchronisations (:func:`sync_time` each)."""
    ops, kernels, matmuls = (max(0.0, c) for c in count)
    if profile.execution != "eager":  # graphs (compiled, or a llama.cpp-class engine): no per-op host dispatch
        kernels, host = max(1.0, 2.0 * matmuls), 0.0
    else:
        host = ops * profile.host_op_cost
    device = kernels * profile.kernel_time + max(flops / profile.peak_flops, nbytes / profile.hbm_bandwidth)
    return max(device, host) + max(0.0, syncs) * sync_time(profile)


@dataclass
class CostModel:
    """Prices the ops of one model on one profile. Bytes are priced at ``weight_bytes`` per parameter (the
    deployment dtype, bf16/fp16 by default) even when the CPU run computes in float32, so budgets and copies
    mean what they would on a GPU."""

    profile: HardwareProfile
    expert_params: int
    dense_params: int  # per MoE layer, everything but routed experts
    head_params: int
    kv_bytes_per_token_per_layer: int
    hidden: int
    weight_bytes: float = 2.0
    shape_name: str | None = None  # set when projected through a CostShape ("name" or "name@full")
    extra_dense_params: int = 0  # params of dense (non-MoE) layers, priced once per forward
    # Projection "layers": the run's L MoE layers stand for L layers of the real model, so the per-model parts
    # (LM head, embeddings) are charged pro rata, L / real layers. Without it a 4-layer tiny model would pay a
    # 27-layer model's whole LM head every token and every draft step, overstating the draft's cost ~6x.
    head_scale: float = 1.0
    # Projection "full": each run MoE layer stands for depth_scale real ones (compute and copies priced so).
    depth_scale: float = 1.0
    dense_layers: int = 0  # dense decoder layers priced in the head (their ops are counted per layer)
    ops: "OpCounts | None" = None  # aten ops per piece; None prices no host time and one kernel per piece
    projection: str = "none"  # none | layers | full, with the shape's label in projection_label
    projection_label: str = "none (the model as it is)"
    # Prices are pure functions of their arguments: memoised, since a replay asks for the same few thousands of
    # times per second (dataclasses.replace builds a new model, and a new memo, for another profile)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def projected(self) -> bool:
        return self.shape_name is not None

    @property
    def engine(self) -> str:
        """Which engine class prices the ops: the profile's execution (``eager`` / ``compiled``)."""
        return self.profile.execution

    @property
    def execution(self) -> str:
        return self.profile.execution

    @property
    def expert_bytes(self) -> int:
        return int(self.expert_params * self.weight_bytes)

    @property
    def assumptions(self) -> str:
        """Profile, execution mode, projection and op counts behind every figure this model prices."""
        counted = f"aten ops counted on a tiny {self.ops.family} ({self.ops.implementation})" if self.ops else "no op counts"
        return (f"profile {self.profile.name} ({self.profile.execution}, host {self.profile.host_op_cost * 1e6:.1f} "
                f"us/op: {self.profile.host_source}); projection {self.projection_label}; {counted}")

    def _count(self, part: str, n_experts: float = 0.0) -> Count:
        if self.ops is None:
            return (0.0, 1.0, 0.0)
        if part == "moe_layer":  # attention, norms, router, shared experts + the experts block's fixed part
            return tuple(a + b for a, b in zip(self.ops.moe_layer, self.ops.experts_fixed))
        if part == "expert":
            return self.ops.per_expert
        if part == "head":
            return tuple(h + self.dense_layers * d for h, d in zip(self.ops.head, self.ops.dense_layer))
        raise KeyError(part)

    def _syncs(self, part: str) -> float:
        """Host synchronisations counted in one piece (0 without op counts)."""
        if self.ops is None or not self.ops.syncs:
            return 0.0
        s = self.ops.syncs
        return {"moe_layer": s["moe_layer"] + s["experts_fixed"], "expert": s["per_expert"],
                "head": s["head"] + self.dense_layers * s["dense_layer"]}[part]

    def _op(self, flops: float, nbytes: float, count: Count, part: str | None = None) -> float:
        return piece_time(self.profile, flops, nbytes, count, self._syncs(part) if part else 0.0)

    def copy_time(self, nbytes: float) -> float:
        return self.depth_scale * (self.profile.copy_latency + nbytes / self.profile.pcie_bandwidth)

    def disk_time(self, nbytes: float, reads: int = 1) -> float:
        """One expert read from the checkpoint's files into the host cache (the disk tier): ``reads`` pieces,
        each paying the profile's ``disk_latency``, then ``nbytes / disk_bandwidth``. Priced at the bytes the
        files hold (the run's own dtype), scaled like copies for a projected depth."""
        p = self.profile
        return self.depth_scale * (reads * p.disk_latency + nbytes / p.disk_bandwidth)

    def __getstate__(self) -> dict:  # a cost model sent to another process starts with an empty memo
        return {**self.__dict__, "_memo": {}}

    def expert_time(self, n_tokens: int, weight_bytes: float | None = None) -> float:
        """One routed expert over n tokens; ``weight_bytes`` = bytes streamed (packed size for a quantized one)."""
        key = ("expert", n_tokens, weight_bytes)
        t = self._memo.get(key)
        if t is None:
            nbytes = self.expert_bytes if weight_bytes is None else weight_bytes
            t = self._memo[key] = self.depth_scale * self._op(2.0 * self.expert_params * n_tokens,
                                                              nbytes + 4 * self.hidden * n_tokens,
                                                              self._count("expert"), "expert")
        return t

    def host_expert_time(self, n_tokens: int, weight_bytes: float | None = None) -> float:
        """One fp expert computed on the host CPU (host execution, and the ``host`` draft variant): weights
        streamed from DRAM at ``weight_bytes`` per weight (default: the deployment dtype's), plus two copy
        latencies for the activations."""
        key = ("host", n_tokens, weight_bytes)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        weight_bytes = self.weight_bytes if weight_bytes is None else weight_bytes
        p = self.profile
        nbytes = self.expert_params * weight_bytes
        t = max(2.0 * self.expert_params * n_tokens / p.cpu_flops, nbytes / p.cpu_mem_bandwidth)
        # CPU ops run where they are dispatched: their dispatch cost adds to their compute (eager)
        dispatch = self._count("expert")[0] * p.host_op_cost if p.execution == "eager" else 0.0
        out = self._memo[key] = self.depth_scale * (t + dispatch + 2 * p.copy_latency)
        return out

    def host_transfer_time(self, n_tokens: int) -> float:
        """A host expert's activations to the host and its output back over the link (fp32, n tokens)."""
        return 2 * 4 * self.hidden * n_tokens / self.profile.pcie_bandwidth

    def host_trip_time(self, layer: int) -> float:
        """What a layer pays once for handing work to the host beyond each expert's own transfer (none here: each
        host expert's copy latencies are in :meth:`host_expert_time`)."""
        return 0.0

    def dense_layer_time(self, n_tokens: int, context: int, layer: int | None = None) -> float:
        """Attention + norms + router + shared experts of one MoE layer over n tokens with ``context`` cached
        (every layer alike here: ``layer`` is for engines that price layers apart)."""
        key = ("dense", n_tokens, context)
        t = self._memo.get(key)
        if t is None:
            flops = 2.0 * self.dense_params * n_tokens + 4.0 * n_tokens * context * self.hidden
            nbytes = self.dense_params * self.weight_bytes + context * self.kv_bytes_per_token_per_layer
            t = self._memo[key] = self.depth_scale * self._op(flops, nbytes, self._count("moe_layer"), "moe_layer")
        return t

    def head_time(self, n_tokens: int, context: int = 0) -> float:
        """LM head (+ final norm, embeddings, the decode step and any dense layers) for n tokens (``context``: for
        engines that price the dense layers' KV cache)."""
        key = ("head", n_tokens)
        t = self._memo.get(key)
        if t is None:
            params = (self.head_params + self.extra_dense_params) * self.head_scale
            t = self._memo[key] = self._op(2.0 * params * n_tokens, params * self.weight_bytes, self._count("head"),
                                           "head")
        return t

    def state_copy_time(self, nbytes: float) -> float:
        """A device-to-device copy of ``nbytes`` (a recurrent-state checkpoint or its restore): read + write."""
        return self.profile.launch_overhead + 2 * nbytes / self.profile.hbm_bandwidth


def torch_cost(info, profile: HardwareProfile, shape: "CostShape | None", weight_bytes: float,
                implementation: str) -> CostModel:
    """The eager / compiled engine's cost model (the pieces priced by :func:`piece_time`), with the aten ops of
    ``implementation`` counted for the model's family, or the cost shape's."""
    from .opcount import op_counts  # counted with torch, once per family and process

    family = shape.family if shape is not None else (info.model_type or "qwen2_moe")
    ops = op_counts(family, implementation, info.top_k if shape is None else shape.top_k)
    if shape is None:
        return CostModel(profile, info.expert_params, info.dense_params_per_layer, info.head_params,
                         int(info.kv_dim * 2 * weight_bytes), info.hidden, weight_bytes,
                         extra_dense_params=info.dense_layer_params, dense_layers=_dense_decoder_layers(info),
                         ops=ops)
    common = dict(shape_name=shape.key, ops=ops, projection=shape.projection, projection_label=shape.label)
    if shape.projection == "full":
        return CostModel(profile, shape.expert_params, shape.dense_params, shape.vocab * shape.hidden,
                         shape.kv_bytes_per_token_per_layer, shape.hidden, weight_bytes,
                         extra_dense_params=shape.dense_layers * shape.dense_layer_params,
                         depth_scale=shape.moe_layers / info.num_layers, dense_layers=shape.dense_layers, **common)
    return CostModel(profile, shape.expert_params, shape.dense_params, shape.vocab * shape.hidden,
                     shape.kv_bytes_per_token_per_layer, shape.hidden, weight_bytes,
                     head_scale=min(1.0, info.num_layers / shape.num_layers), **common)


def _dense_decoder_layers(info) -> int:
    """Decoder layers of the run model that have no routed experts."""
    if info.decoder_layers is None:
        return 0
    return max(0, len(info.decoder_layers) - info.num_layers)
