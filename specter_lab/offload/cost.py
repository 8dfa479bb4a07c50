"""The cost model that prices every op of one model on one profile for the simulated clock.

Cost of a compute op = launch_overhead · kernels + max(flops / peak_flops, bytes_read / hbm_bandwidth).
Cost of a copy      = copy_latency + bytes / pcie_bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .profiles import HardwareProfile
from .shapes import CostShape, get_cost_shape

__all__ = ["CostModel", "build_cost_model"]


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
    shape_name: str | None = None  # set when projected through a CostShape
    extra_dense_params: int = 0  # params of dense (non-MoE) layers, priced once per forward
    # Projection: the run's L MoE layers stand for L layers of the real model, so the per-model parts (LM head,
    # embeddings) are charged pro rata, L / real layers. Without it a 4-layer tiny model would pay a 27-layer
    # model's whole LM head every token and every draft step, overstating the draft's cost ~6x at that scale.
    head_scale: float = 1.0

    @property
    def projected(self) -> bool:
        return self.shape_name is not None

    @property
    def expert_bytes(self) -> int:
        return int(self.expert_params * self.weight_bytes)

    def _op(self, flops: float, nbytes: float, kernels: int) -> float:
        p = self.profile
        return p.launch_overhead * kernels + max(flops / p.peak_flops, nbytes / p.hbm_bandwidth)

    def copy_time(self, nbytes: float) -> float:
        return self.profile.copy_latency + nbytes / self.profile.pcie_bandwidth

    def expert_time(self, n_tokens: int, weight_bytes: float | None = None, kernels: int = 4) -> float:
        """One routed expert over n tokens; ``weight_bytes`` = bytes streamed (packed size for a quantized one)."""
        nbytes = self.expert_bytes if weight_bytes is None else weight_bytes
        return self._op(2.0 * self.expert_params * n_tokens, nbytes + 4 * self.hidden * n_tokens, kernels)

    def host_expert_time(self, n_tokens: int, weight_bytes: float = 4.0) -> float:
        """One fp expert computed on the host CPU: weights streamed from DRAM at ``weight_bytes`` per weight
        (4: the ``host`` draft prices fp32 host copies; host execution passes the deployment dtype's width),
        plus two copy latencies for the activations (their bytes are negligible at batch 1)."""
        p = self.profile
        nbytes = self.expert_params * weight_bytes
        t = max(2.0 * self.expert_params * n_tokens / p.cpu_flops, nbytes / p.cpu_mem_bandwidth)
        return t + 2 * p.copy_latency

    def dense_layer_time(self, n_tokens: int, context: int) -> float:
        """Attention + norms + router + shared experts of one MoE layer over n tokens with ``context`` cached."""
        flops = 2.0 * self.dense_params * n_tokens + 4.0 * n_tokens * context * self.hidden
        nbytes = self.dense_params * self.weight_bytes + context * self.kv_bytes_per_token_per_layer
        return self._op(flops, nbytes, kernels=12)

    def head_time(self, n_tokens: int) -> float:
        """LM head (+ final norm and any dense layers) for n tokens."""
        params = (self.head_params + self.extra_dense_params) * self.head_scale
        return self._op(2.0 * params * n_tokens, params * self.weight_bytes, kernels=3)

    def state_copy_time(self, nbytes: float) -> float:
        """A device-to-device copy of ``nbytes`` (a recurrent-state checkpoint or its restore): read + write."""
        return self.profile.launch_overhead + 2 * nbytes / self.profile.hbm_bandwidth

    def with_profile(self, profile: HardwareProfile) -> "CostModel":
        return replace(self, profile=profile)


def build_cost_model(info, profile: HardwareProfile, cost_shape: "str | CostShape | None" = None,
                     weight_bytes: float = 2.0) -> CostModel:
    """A CostModel for a loaded model (``info`` is a :class:`specter_lab.model.MoEModelInfo`)."""
    shape = get_cost_shape(cost_shape)
    if shape is None:
        return CostModel(profile, info.expert_params, info.dense_params_per_layer, info.head_params,
                         int(info.kv_dim * 2 * weight_bytes), info.hidden, weight_bytes,
                         extra_dense_params=info.dense_layer_params)
    return CostModel(profile, shape.expert_params, shape.dense_params, shape.vocab * shape.hidden,
                     shape.kv_bytes_per_token_per_layer, shape.hidden, weight_bytes, shape_name=shape.name,
                     head_scale=min(1.0, info.num_layers / shape.num_layers))

