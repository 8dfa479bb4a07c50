"""specter_lab: run Hugging Face MoE models with offloaded experts, speculative decoding with a quantized draft
that forecasts routing (Specter, arXiv 2511.14102), and notebook views of what the cache and the link do.

    import specter_lab as sl
    model, tok = sl.load_model("tiny")
    engine = sl.Engine(model, tok, strategy="specter", expert_budget=0.5, hardware="rtx4090-pcie4")
    result = engine.generate("def fib(n):", max_new_tokens=32)

This module is the top of the package: it imports the layers below it (see the README's code map), never the
reverse. The notebook views (``sl.viz``) load on first use, so importing specter_lab loads neither plotly nor
ipywidgets.
"""

from .errors import BudgetTooSmall, ConfigError, CopyFault, NotExact
from .estimate import Estimate, estimate
from .model import inspect_model, load_model, tiny_random_model
from .model.checkpoint_check import CheckpointInfo, check_checkpoint
from .model.memory import MemoryPlan, plan_memory
from .model.fuse import fuse_experts
from .errors import CheckpointError, DiskFull, NotEnoughMemory, ResultsFileError, ResumeMismatch
from .pricing.calibrate import calibrate
from .pricing.hostcal import calibrate_host
from .pricing.precision import FORMATS, WeightPrecision
from .pricing.profiles import HOSTS, PROFILES, HardwareProfile, HostCPU
from .pricing.shapes import COST_SHAPES, CostShape
from .routing.bound import BoundResult, bound
from .routing.gap import BoundGap, bound_gap
from .routing.importing import gate_recall, import_routing
from .routing.locality import less_local, lru_hit_curve
from .routing.record import record
from .routing.replay import replay
from .routing.trace_file import RoutingTrace, TraceError, load_trace
from .run.drafts import DRAFT_VARIANTS, DraftSpec
from .run.engine import Engine, GenerationResult
from .run.quant import QuantSpec
from .run.strategies import STRATEGIES, Strategy
# sl.bench, sl.paper and sl.planner are namespaces of studies; importing the planner registers sl.plan as the
# planner behind strategy="auto".
from .studies import bench, paper, planner
from .studies.bench import compare, summarize
from .studies.fidelity import fidelity
from .studies.planner import Plan, plan, regime_map
from .studies.prompts import heldout_prompts

__version__ = "0.1.0"

__all__ = [
    "Engine", "GenerationResult", "load_model", "inspect_model", "tiny_random_model", "HardwareProfile", "PROFILES",
    "COST_SHAPES", "CostShape", "calibrate", "calibrate_host", "QuantSpec", "DraftSpec", "DRAFT_VARIANTS", "STRATEGIES", "Strategy",
    "compare", "summarize", "fidelity", "plan", "Plan", "regime_map", "heldout_prompts", "BudgetTooSmall", "ConfigError",
    "CopyFault", "NotExact", "viz", "paper", "record", "replay", "RoutingTrace", "load_trace", "TraceError", "bound",
    "BoundResult", "estimate", "Estimate", "HOSTS", "HostCPU", "FORMATS", "WeightPrecision",
    "import_routing", "gate_recall", "lru_hit_curve", "less_local", "bound_gap", "BoundGap",
]
__all__ += ["check_checkpoint", "CheckpointInfo", "plan_memory", "MemoryPlan", "CheckpointError", "NotEnoughMemory",
            "fuse_experts", "ResumeMismatch", "ResultsFileError", "DiskFull"]


def __getattr__(name):
    # The views load on first use: no plotly/ipywidgets unless asked.
    if name == "viz":
        import importlib

        return importlib.import_module(".viz", __name__)
    raise AttributeError(f"module 'specter_lab' has no attribute {name!r}")
