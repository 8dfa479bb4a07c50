"""The model adapter: inspection (:mod:`.inspect`), the experts-interface hookup (:mod:`.dispatch`), safe loading
(:mod:`.loading`), placement for offloading (:mod:`.placement`) and tiny random models (:mod:`.tiny`)."""

from .dispatch import IMPLEMENTATION_NAME, attached, register_implementation
from .inspect import MoELayer, MoEModelInfo, inspect_model, text_config
from .loading import BUNDLED, load_model
from .placement import place_for_offload
from .tiny import tiny_random_model

__all__ = ["MoELayer", "MoEModelInfo", "inspect_model", "text_config", "attached", "register_implementation",
           "IMPLEMENTATION_NAME", "load_model", "BUNDLED", "place_for_offload", "tiny_random_model"]
