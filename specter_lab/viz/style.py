"""The views' palette: the colours, categories and lane names every figure and widget shares (no plotly).
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["ROUTING_CATEGORIES", "ROUTING_COLORS", "ROUTING_HELP", "STATUS_COLORS", "STATUS_HELP", "PHASE_COLORS",
           "HOST_LANE", "COPY_COLORS", "STALL_COLOR", "COPY_LANE", "DISK_LANE", "DISK_COLOR", "RESIDENCY_CATEGORIES", "RESIDENCY_COLORS",
           "PHASE_ORDER", "GLYPH_LEGEND", "esc"]


# Routing cells: green = the forecast was right, orange = bytes moved for nothing, red = the target waited.
ROUTING_CATEGORIES = ("neither", "predicted & used", "predicted, not used", "used, not predicted")

ROUTING_COLORS = {
    "neither": "#ececec",
    "predicted & used": "#2ca02c",
    "predicted, not used": "#ff9f1c",
    "used, not predicted": "#d62728",
}

ROUTING_HELP = {
    "neither": "not forecast, not used",
    "predicted & used": "forecast and used by the target",
    "predicted, not used": "forecast but not used (a prefetch here is wasted)",
    "used, not predicted": "used by the target without a forecast (a miss unless already cached)",
}

STATUS_COLORS = {
    "prefill": "#7f7f7f",
    "decode": "#1f77b4",
    "accepted": "#2ca02c",
    "corrected": "#ff7f0e",
    "bonus": "#9467bd",
    "rejected": "#d62728",
}

STATUS_HELP = {
    "prefill": "first token, from the prefill",
    "decode": "one target forward per token",
    "accepted": "draft token the target agreed with",
    "corrected": "target's token where it disagreed with the draft",
    "bonus": "target's extra token after a fully accepted window",
    "rejected": "draft token discarded by verification",
}

PHASE_COLORS = {
    "prefill": "#8c8c8c",
    "decode": "#1f77b4",
    "draft": "#9467bd",
    "verify": "#17becf",
    "head": "#bcbd22",
    "host CPU": "#8c564b",
}

HOST_LANE = "host CPU"  # experts computed on the host (host execution): their own lane, beside the device's

COPY_COLORS = {"prefetch": "#2ca02c", "refresh": "#17becf", "demand": "#ff7f0e"}

STALL_COLOR = "#d62728"

COPY_LANE = "copy (PCIe)"

DISK_LANE = "disk read"  # the disk tier: experts read from the checkpoint files into the host cache
DISK_COLOR = "#7f7f7f"

RESIDENCY_CATEGORIES = ("not resident", "resident (demand load)", "resident (prefetch)")

RESIDENCY_COLORS = {"not resident": "#ececec", "resident (demand load)": "#ff7f0e",
                    "resident (prefetch)": "#2ca02c"}

PHASE_ORDER = ("prefill", "decode", "draft", "verify", "head", HOST_LANE)

# How a token cell shows whitespace (frames.token_text): every strip says so next to its colours.
GLYPH_LEGEND = "· space, ↵ newline, ⇥ tab, ∅ empty"

def esc(s: Any) -> str:
    """HTML-escape text for plotly titles, hover texts and the HTML views."""
    return html.escape(str(s), quote=False)
