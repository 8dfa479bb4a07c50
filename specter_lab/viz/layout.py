"""The layout every plotly figure of the views shares: fonts, margins, legends, discrete colour scales.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from .shown import as_shown

__all__ = ["base_layout", "discrete_colorscale", "legend_swatch"]


_FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12)

def base_layout(fig: go.Figure, title: str, plot_height: int, legend: str = "top", top: int = 75,
                left: int = 70, legend_rows: int = 1) -> go.Figure:
    """Common look. ``plot_height`` is the plot area in px; margins are added around it so a legend never sits
    on an axis title. ``legend``: 'top' (one row between title and plot, right-aligned), 'below' (under the
    x-axis title; plotly positions legends in plot-area fractions, hence the px conversion) or 'right'."""
    bottom = 55
    leg: dict[str, Any] = dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0)
    if legend == "top":
        top += 22 * legend_rows
    elif legend == "below":
        # Under the x-axis title with room to spare: tick labels and the title take ~55 px below the plot area,
        # more where the page falls back to a taller font than Inter.
        # (E15: 78 px left the legend 50-70 px below the axis title, read as part of the next figure)
        bottom = 78 + 22 * legend_rows
        leg = dict(orientation="h", yanchor="top", y=-62 / plot_height, xanchor="left", x=0.0)
    elif legend == "right":
        leg = dict(orientation="v", yanchor="top", y=1.0, xanchor="left", x=1.02)
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", y=1 - 14 / (plot_height + top + bottom),
                                 yanchor="top", font=dict(size=15)),
                      height=plot_height + top + bottom, template="plotly_white", font=_FONT,
                      margin=dict(l=left, r=30, t=top, b=bottom), legend=leg)
    # Tick labels may overflow the figure (they never do inside these margins): plotly's default hides those that
    # would, measuring every label's box on every redraw, a third of a dashboard step's drawing (issue 37).
    fig.update_xaxes(ticklabeloverflow="allow")
    fig.update_yaxes(ticklabeloverflow="allow")
    return as_shown(fig)  # a notebook shows it as a figure panel (shown.py)

def legend_swatch(name: str, color: str, help_text: str = "", group: str | None = None) -> go.Scatter:
    """An invisible trace whose only job is a legend entry (heatmaps have no per-category legend)."""
    return go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup=group or name,
                      marker=dict(symbol="square", size=13, color=color, line=dict(color="#999", width=0.5)),
                      hoverinfo="skip", showlegend=True, meta=help_text)

def discrete_colorscale(colors: list[str]) -> list[list]:
    """A stepped colorscale for integer codes 0..n-1 drawn with zmin=-0.5, zmax=n-0.5 (code c sits mid-band)."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
