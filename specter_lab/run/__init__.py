"""Running one strategy on one model: the strategies (typed records), the assembly that turns one into a run's
parts, the budget split, the draft and its quantization, and the :class:`~specter_lab.run.engine.Engine` that binds
them to a live model.

Tools above this folder (the estimator, the planner) read the strategy table through the names exported here.
"""

from .strategies import (AUTO, BASELINES, NOT_CANDIDATES, PLANNER_MARGIN, STRATEGIES, Strategy, describe,
                         get_strategy, planner_choice, strategy_names)

__all__ = ["STRATEGIES", "Strategy", "get_strategy", "BASELINES", "AUTO", "strategy_names", "describe",
           "NOT_CANDIDATES", "PLANNER_MARGIN", "planner_choice"]
