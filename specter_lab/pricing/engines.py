"""Which engine class prices a run, and the one function that builds its cost model (:func:`build_cost_model`).

The profile's ``execution`` names the engine class (:data:`~.profiles.EXECUTIONS`): eager PyTorch and compiled
graphs are :class:`~.cost.CostModel`'s own pieces (:func:`~.cost.torch_cost`); another engine class is a module of
this folder whose ``build(info, profile, shape, weight_bytes, **options)`` returns its cost model (the llama.cpp-class
engine: :mod:`.llamacpp`). Adding an engine class: that module, and its name and module in ``EXECUTIONS``.
"""

from __future__ import annotations

import importlib

from ..errors import OptionError
from .cost import CostModel, torch_cost
from .profiles import EXECUTIONS, HardwareProfile
from .shapes import CostShape, get_cost_shape

__all__ = ["build_cost_model"]


def build_cost_model(info, profile: HardwareProfile, cost_shape: "str | CostShape | None" = None,
                     weight_bytes: float = 2.0, implementation: str = "specter", weights=None,
                     depth: "int | None" = None, gpu_layers: "int | None" = None,
                     kv_type: "str | None" = None) -> CostModel:
    """A CostModel for a loaded model (``info`` is a :class:`specter_lab.model.MoEModelInfo`), with the aten ops
    of ``implementation`` (the runtime's own by default) counted for the model's family, or the cost shape's.
    ``weights`` (the format), ``depth`` (KV read at that many tokens), ``gpu_layers`` (-ngl) and ``kv_type`` are
    options of an engine class that reads them (a llama.cpp-class one); the eager and compiled engines refuse them."""
    shape = get_cost_shape(cost_shape)
    module = EXECUTIONS[profile.execution]
    options = {"weights": weights, "depth": depth, "gpu_layers": gpu_layers, "kv_type": kv_type}
    if module is None:
        for name, value in options.items():
            if value is not None:
                raise OptionError(f"{name}={value!r} prices a llama.cpp-class engine: give hardware='"
                                  f"{profile.name}@llama.cpp', or drop {name}=.", name, value, ("None",))
        return torch_cost(info, profile, shape, weight_bytes, implementation)
    return importlib.import_module(module, __package__).build(info, profile, shape, weight_bytes, **options)
