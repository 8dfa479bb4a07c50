"""specter_lab: run Hugging Face MoE models with offloaded experts, speculative decoding with a quantized draft
that forecasts routing (Specter, arXiv 2511.14102), and notebook views of what the cache and the link do.

    import specter_lab as sl
    model, tok = sl.load_model("tiny")
    engine = sl.Engine(model, tok, strategy="specter", expert_budget=0.5, hardware="rtx4090-pcie4")
    result = engine.generate("def fib(n):", max_new_tokens=32)

This module is the top of the package: it names the layers below it (see the README's code map), never the
reverse. Every name loads on first use (PEP 562), so ``import specter_lab`` imports neither torch nor transformers
nor plotly: a config-only question (``sl.estimate``) pays only for what it reads.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it (relative to this package)
_NAMES: dict[str, str] = {
    **dict.fromkeys(["BudgetTooSmall", "ConfigError", "CopyFault", "NotExact", "CheckpointError", "NotEnoughMemory",
                     "DiskFull", "ResultsFileError", "ResumeMismatch"], ".errors"),
    **dict.fromkeys(["Estimate", "estimate"], ".estimator"),
    **dict.fromkeys(["inspect_model", "load_model", "tiny_random_model"], ".model"),
    **dict.fromkeys(["CheckpointInfo", "check_checkpoint"], ".model.checkpoint_check"),
    **dict.fromkeys(["MemoryPlan", "plan_memory"], ".model.memory"),
    "fuse_experts": ".model.fuse",
    "calibrate": ".pricing.calibrate",
    "calibrate_host": ".pricing.hostcal",
    **dict.fromkeys(["FORMATS", "WeightPrecision"], ".pricing.precision"),
    **dict.fromkeys(["HOSTS", "PROFILES", "HardwareProfile", "HostCPU"], ".pricing.profiles"),
    **dict.fromkeys(["COST_SHAPES", "CostShape"], ".pricing.shapes"),
    **dict.fromkeys(["BoundResult", "bound"], ".analysis.bound"),
    **dict.fromkeys(["BoundGap", "bound_gap"], ".analysis.gap"),
    "record": ".analysis.record",
    "replay": ".analysis.replay",
    **dict.fromkeys(["gate_recall", "import_routing"], ".traces.importing"),
    **dict.fromkeys(["less_local", "lru_hit_curve"], ".traces.locality"),
    **dict.fromkeys(["RoutingTrace", "TraceError", "load_trace"], ".traces.trace_file"),
    **dict.fromkeys(["DRAFT_VARIANTS", "DraftSpec"], ".run.drafts"),
    **dict.fromkeys(["Engine", "GenerationResult"], ".run.engine"),
    "QuantSpec": ".run.quant",
    **dict.fromkeys(["STRATEGIES", "Strategy"], ".run.strategies"),
    **dict.fromkeys(["compare", "summarize"], ".studies.bench"),
    "fidelity": ".studies.fidelity",
    **dict.fromkeys(["Plan", "plan", "regime_map"], ".studies.planner"),
    "heldout_prompts": ".studies.prompts",
}
# namespaces: sl.bench, sl.paper, sl.planner (studies), sl.viz (notebook views), and the floors themselves
_MODULES = {"bench": ".studies.bench", "paper": ".studies.paper", "planner": ".studies.planner", "viz": ".viz",
            "analysis": ".analysis", "traces": ".traces", "caching": ".caching", "pricing": ".pricing",
            "estimator": ".estimator", "run": ".run", "model": ".model", "studies": ".studies", "offload": ".offload",
            "records": ".records", "decode": ".decode", "predict": ".predict", "errors": ".errors",
            "units": ".units"}

__all__ = sorted([*_NAMES, "viz", "paper", "bench", "planner"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name], __name__)
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    else:
        raise AttributeError(f"module 'specter_lab' has no attribute {name!r}")
    if name == "Engine" or _NAMES.get(name) == ".run.engine":
        # strategy="auto" asks the planner, which registers itself on import: an Engine from here can plan
        importlib.import_module(".studies.planner", __name__)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_MODULES))
