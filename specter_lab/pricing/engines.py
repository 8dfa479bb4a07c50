"""Which engine class prices a run, and the one function that builds its cost model (:func:`build_cost_model`):
eager PyTorch and compiled graphs (:class:`~.cost.CostModel`'s own pieces, :func:`~.cost.piece_time`), or a
llama.cpp-class engine (:class:`~.llamacpp.LlamaCppCost`). The profile's ``execution`` names the class.

Adding an engine class: its cost model (a :class:`~.cost.CostModel` whose pieces it prices) in a file of its own,
and one branch here.
"""

from __future__ import annotations

from ..errors import OptionError
from .cost import CostModel
from .llamacpp import LlamaSizes, kernel_counts, llama_cpp_cost
from .opcount import op_counts
from .profiles import HardwareProfile
from .shapes import CostShape, get_cost_shape

__all__ = ["build_cost_model"]


def build_cost_model(info, profile: HardwareProfile, cost_shape: "str | CostShape | None" = None,
                     weight_bytes: float = 2.0, implementation: str = "specter", weights=None,
                     depth: "int | None" = None, gpu_layers: "int | None" = None,
                     kv_type: "str | None" = None) -> CostModel:
    """A CostModel for a loaded model (``info`` is a :class:`specter_lab.model.MoEModelInfo`), with the aten ops
    of ``implementation`` (the runtime's own by default) counted for the model's family, or the cost shape's.
    A ``llama.cpp`` profile builds the llama.cpp-class engine (:mod:`.llamacpp`), whose ``weights`` format,
    KV ``depth`` and ``gpu_layers`` (-ngl) the other engines do not read (they refuse them)."""
    shape = get_cost_shape(cost_shape)
    if profile.execution != "llama.cpp":
        for name, value in (("weights", weights), ("depth", depth), ("gpu_layers", gpu_layers), ("kv_type", kv_type)):
            if value is not None:
                raise OptionError(f"{name}={value!r} prices a llama.cpp-class engine: give hardware='"
                                  f"{profile.name}@llama.cpp', or drop {name}=.", name, value, ("None",))
        return _torch_cost(info, profile, shape, weight_bytes, implementation)
    family = shape.family if shape is not None else (info.model_type or "qwen2_moe")
    top_k = info.top_k if shape is None else shape.top_k
    base = _torch_cost(info, profile, shape, weight_bytes, "grouped_mm")
    sizes = None if shape is not None else _llama_sizes(info)
    if gpu_layers is not None and (isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int) or gpu_layers < 0):
        raise OptionError(f"gpu_layers={gpu_layers!r}: the decoder layers on the GPU (llama.cpp -ngl), an integer "
                          ">= 0, or None for all.", "gpu_layers", gpu_layers, ("None", "0, 1, ..."))
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise OptionError(f"depth={depth!r}: tokens in the KV cache while decoding, an integer >= 0, or None for "
                          "the run's own positions.", "depth", depth, ("None", "0, 4096, ..."))
    return llama_cpp_cost(base, weights, sizes, kernel_counts(op_counts(family, "grouped_mm", top_k)), depth,
                          gpu_layers, kv_type)


def _torch_cost(info, profile: HardwareProfile, shape: "CostShape | None", weight_bytes: float,
                implementation: str) -> CostModel:
    """The eager / compiled engine's cost model (the pieces priced by :func:`piece_time`)."""
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


def _llama_sizes(info):
    """Per-layer KV and the dense decoder layers of the model ``info`` describes, for the llama.cpp-class engine
    (its config's layer kinds and windows; every layer full attention without one)."""
    from ..model.geometry import kv_layout

    n = len(info.decoder_layers) if info.decoder_layers is not None else info.num_layers
    kv, window, _ = kv_layout(info.config or {}, info.kv_dim, n)
    moe = [l.decoder_index for l in info.layers]
    dense = [i for i in range(n) if i not in set(moe)]
    n_dense = len(dense)
    return LlamaSizes(kv=tuple((kv[i], window[i]) for i in moe), decoder_of=tuple(moe),
                      dense_kv=tuple((kv[i], window[i]) for i in dense),
                      dense_layer_params=info.dense_layer_params // n_dense if n_dense else 0, decoder_layers=n)


def _dense_decoder_layers(info) -> int:
    """Decoder layers of the run model that have no routed experts."""
    if info.decoder_layers is None:
        return 0
    return max(0, len(info.decoder_layers) - info.num_layers)
