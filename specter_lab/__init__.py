"""specter_lab: run Hugging Face MoE models with offloaded experts, speculative decoding with a quantized draft
that forecasts routing (Specter, arXiv 2511.14102), and notebook views of what the cache and the link do.

    import specter_lab as sl
    model, tok = sl.load_model("tiny")
    engine = sl.Engine(model, tok, strategy="specter", expert_budget=0.5, hardware="rtx4090-pcie4")
    result = engine.generate("def fib(n):", max_new_tokens=32)
"""

from .engine import Engine, GenerationResult
from .model import inspect_model, load_model, tiny_random_model
from .offload.hardware import COST_SHAPES, PROFILES, CostShape, HardwareProfile, calibrate
from .drafts import DRAFT_VARIANTS, DraftSpec
from .quant import QuantSpec
from .strategies import STRATEGIES, Strategy

__version__ = "0.1.0"

__all__ = [
    "Engine", "GenerationResult", "load_model", "inspect_model", "tiny_random_model", "HardwareProfile", "PROFILES",
    "COST_SHAPES", "CostShape", "calibrate", "QuantSpec", "DraftSpec", "DRAFT_VARIANTS", "STRATEGIES", "Strategy", "compare", "fidelity", "plan", "viz",
]


def __getattr__(name):
    # Heavy or optional pieces load on first use: no import-time side effects, no plotly/ipywidgets unless asked.
    if name in ("compare", "fidelity"):
        from . import bench

        return getattr(bench, name)
    if name in ("plan", "regime_map"):
        from . import planner

        return getattr(planner, name)
    if name in ("viz", "bench", "planner"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'specter_lab' has no attribute {name!r}")
