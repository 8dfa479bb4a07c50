"""Estimate before download: decode speed of every strategy on a described machine, from a model's config.json
alone (:func:`estimate`: a replay of routing at the model's geometry on the machine's llama.cpp-class clock), the
commands that run the winner, and the published consumer rows that check that clock
(``sl.bench.consumer_anchors()``)."""

from .core import NOT_A_DEPLOYMENT, Estimate, estimate, get_gpu
from .lanes import Machine, TokenTime, price_token
from .vram import RUNTIME_OVERHEAD, VramBudget, vram_budget

__all__ = ["estimate", "Estimate", "NOT_A_DEPLOYMENT", "get_gpu", "Machine", "TokenTime", "price_token",
           "RUNTIME_OVERHEAD", "VramBudget", "vram_budget"]
