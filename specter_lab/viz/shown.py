"""The package's figures, shown in a notebook as :class:`~.panel.FigurePanel` s rather than by JupyterLab's
plotly renderer (issue 55).

The renderer evaluates its own copy of the full plotly.js (4.6 MB) at the first figure it draws, in one
main-thread task (1.1-2.6 s on a 2-core box), beside the copy the panels load; it also snapshots every figure it
draws to a PNG on the same thread. A :class:`Figure` is an ordinary ``go.Figure`` (save it, update it, ``.show()``
it as any other), except that a notebook cell showing it shows a panel: one plotly.js per page, the light one
where its traces allow (:mod:`.panel`). Without ipywidgets and anywidget (the ``notebook`` extra) it shows as
plotly shows any figure.
"""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["Figure", "as_shown"]


class Figure(go.Figure):
    """A ``go.Figure`` that a notebook shows in a :class:`~.panel.FigurePanel`."""

    def _ipython_display_(self) -> None:
        try:
            from IPython.display import display

            from .panel import FIGURE_CONFIG, FigurePanel
        except ImportError:  # no notebook extra: plotly's own display
            return super()._ipython_display_()
        display(FigurePanel(self, config=FIGURE_CONFIG))  # as widgets.figure_widget makes one


def as_shown(fig: go.Figure) -> Figure:
    """``fig`` itself, shown as a panel from now on. It changes the object's class, not its content: a copy of a
    figure of thousands of bars would validate every one of them again."""
    if isinstance(fig, go.Figure) and not isinstance(fig, Figure):
        fig.__class__ = Figure
    return fig
