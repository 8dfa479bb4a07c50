"""Estimate before download: decode speed per strategy on a described machine, from a model's config.json alone
(:func:`estimate`), the commands that run the winner, and the published consumer rows it is checked against
(``sl.bench.consumer_anchors()``)."""

from .budget import RUNTIME_OVERHEAD, VramBudget, vram_budget
from .core import NOT_ESTIMATED, PLACEMENTS, Estimate, estimate, get_gpu, routing_for
from .pricing import HOST_DECODE_EFFICIENCY, Machine, TokenTime, price_token

__all__ = ["estimate", "Estimate", "PLACEMENTS", "NOT_ESTIMATED", "get_gpu", "routing_for", "Machine", "TokenTime",
           "price_token", "HOST_DECODE_EFFICIENCY", "RUNTIME_OVERHEAD", "VramBudget", "vram_budget"]
