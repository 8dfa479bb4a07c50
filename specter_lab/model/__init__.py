"""The model adapter: inspection (:mod:`.inspect`), the experts-interface hookup (:mod:`.dispatch`), safe loading
(:mod:`.loading`), placement for offloading (:mod:`.placement`) and tiny random models (:mod:`.tiny`)."""

from .lazy_compile import import_hqq_lazily

import_hqq_lazily()  # before anything below imports transformers' modeling (see lazy_compile: ~3.4 s saved)

from .dispatch import IMPLEMENTATION_NAME, attached, register_implementation  # noqa: E402
from .inspect import MoELayer, MoEModelInfo, inspect_model, text_config  # noqa: E402
from .loading import BUNDLED, load_model  # noqa: E402
from .placement import place_for_offload  # noqa: E402
from .tiny import tiny_random_model  # noqa: E402

__all__ = ["MoELayer", "MoEModelInfo", "inspect_model", "text_config", "attached", "register_implementation",
           "IMPLEMENTATION_NAME", "load_model", "BUNDLED", "place_for_offload", "tiny_random_model"]
