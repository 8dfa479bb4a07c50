"""Attach a runtime to a model's experts: register ``"specter"`` in transformers' ExpertsInterface and route every
experts module through the runtime for the duration of a ``with`` block, restoring the model afterwards.

transformers ≥5 stores a layer's routed experts as fused tensors in a module decorated with
``use_experts_implementation`` and dispatches its forward through ``ExpertsInterface`` by the name in
``config._experts_implementation``. The model otherwise runs unmodified (its own attention, cache, routers):
no module surgery, so nothing is left half-applied after an error.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from torch import nn

from .inspect import MoEModelInfo

__all__ = ["IMPLEMENTATION_NAME", "register_implementation", "attached"]

IMPLEMENTATION_NAME = "specter"


def _specter_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The function registered as experts implementation ``"specter"``: hands the call to the runtime that
    attached itself to this module. Without one (e.g. a stray call), it falls back to HF's eager loop."""
    runtime = self.__dict__.get("_specter_runtime")
    if runtime is None:
        # transformers wraps the experts class's forward in its implementation dispatcher; __wrapped__ is the
        # eager loop it wraps, which calling self.forward would dispatch straight back here
        return type(self).__mro__[0].forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)
    return runtime.experts_forward(self._specter_layer, self, hidden_states, top_k_index, top_k_weights)


def register_implementation() -> None:
    """Register ``"specter"`` in transformers' ExpertsInterface (idempotent, no import-time side effect)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if IMPLEMENTATION_NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION_NAME, _specter_experts_forward)


@contextmanager
def attached(model: nn.Module, info: MoEModelInfo, runtime: Any) -> Iterator[None]:
    """Route every experts module of ``model`` through ``runtime`` for the duration of the block, then leave the
    model a plain HF model again (its previous experts implementation restored), whatever happens inside."""
    register_implementation()
    before = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") else None
    for layer in info.layers:
        # plain instance attributes, set and read (__dict__.get, in the forward above) past nn.Module's
        # __setattr__ / __getattr__: never a parameter, buffer or submodule, and a module without them (a stray
        # call after detaching) falls back without nn.Module's AttributeError path on every call
        layer.experts.__dict__["_specter_runtime"] = runtime
        layer.experts.__dict__["_specter_layer"] = layer.index
        # the implementation HF would run: the runtime reproduces its numerics (model/experts.py)
        layer.experts.__dict__.setdefault("_specter_math", layer.experts.config._experts_implementation)
    try:
        model.set_experts_implementation(IMPLEMENTATION_NAME)
        yield
    finally:
        for layer in info.layers:
            layer.experts.__dict__.pop("_specter_runtime", None)
            layer.experts.__dict__.pop("_specter_layer", None)
            layer.experts.__dict__.pop("_specter_math", None)
        if before is not None:
            model.set_experts_implementation(before)

