"""The estimate as a notebook view: pick a config, a GPU, its VRAM and RAM, a host and the weights' format; see the
placements table with its bands, the cache cliff, the time to first token and the commands (notebook 07).

Everything shown comes from :meth:`specter_lab.estimator.Estimate.summary`: a MODELLED figure from a config alone,
with its assumptions printed beside it.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from . import tables
from .layout import base_layout
from .tables import Table
from .panel import FigurePanel
from .widgets import figure_widget, sync_figure

__all__ = ["EstimateExplorer", "band_text", "cliff_figure", "estimate_table", "ESTIMATE_COLUMNS"]

# What the placements table shows by default (the rest: the "all columns" section, or ``summary["table"]``).
ESTIMATE_COLUMNS = ["strategy", "tokens_per_s", "band_tok_s", "dominant_unknown", "hit_rate", "runs_as"]


def estimate_table(table: pd.DataFrame) -> Table:
    """The placements, fastest first: the columns that matter, formatted, the rest one click away (with the disk
    reads where host RAM is short, ``ram=``)."""
    disk = ["disk_reads_per_token"] if "disk_ms" in table and table.disk_ms.max() > 0 else []
    if {"low_tok_s", "high_tok_s"} <= set(table):  # one format for every band (E15: "50-60.7", "8.47-25.6")
        table = table.assign(band_tok_s=[band_text(lo, hi) for lo, hi in zip(table.low_tok_s, table.high_tok_s)])
    return tables.table(table, ESTIMATE_COLUMNS[:-1] + disk + ESTIMATE_COLUMNS[-1:], digits=3,
                        formats={"tokens_per_s": "{:.1f}".format, "hit_rate": "{:.0%}".format})


def band_text(lo: float, hi: float) -> str:
    """A band of tokens/s as the views print it: one decimal at both ends."""
    return f"{lo:.1f}–{hi:.1f}"


def _choices_text(choices: pd.DataFrame) -> str:
    """The planner's pick and llama.cpp's best row in words, each with its tokens/s and what runs it."""
    return "; ".join(f"{html.escape(c.who)}: <b>{c.strategy}</b>, {c.tokens_per_s:.1f} tok/s ({html.escape(c.runs_as)})"
                     for c in choices.itertuples() if c.who in ("the planner's pick", "llama.cpp's best"))


def cliff_figure(sizing) -> go.Figure:
    """Tokens/s and hit rate of a global expert cache against its size, with the cliff and the size past which
    more cache stops paying (modelled)."""
    sw = sizing.sweep
    fig = go.Figure()
    fig.add_scatter(x=sw.cache_mib, y=sw.tokens_per_s, mode="lines+markers", name="tokens/s (modelled)")
    fig.add_scatter(x=sw.cache_mib, y=sw.hit_rate * 100, mode="lines", name="hit rate %", yaxis="y2",
                    line=dict(dash="dot"))
    # The three sizes as lines of their own in the legend: as annotations at the top they overlapped, and read as
    # three unlabelled lines (E15).
    top = float(sw.tokens_per_s.max()) * 1.05 or 1.0
    for x, label, dash in ((sizing.cliff_mib, "cliff: no hits below", "solid"),
                           (sizing.enough_mib, "knee: more stops paying", "dash"),
                           (sizing.budget_mib, "what the VRAM leaves", "dot")):
        if x is None:
            continue
        fig.add_scatter(x=[x, x], y=[0, top], mode="lines", name=f"{label} ({x:,.0f} MiB)", hoverinfo="name",
                        line=dict(width=1.5, color="#555", dash=dash))
    fig.update_xaxes(type="log", title_text="--moe-cache-mib (MiB, log)")
    fig.update_layout(yaxis=dict(title="tokens/s", rangemode="tozero"),
                      yaxis2=dict(title="hit rate %", overlaying="y", side="right", range=[0, 100],
                                  tickvals=[0, 25, 50, 75, 100], showgrid=False))
    return base_layout(fig, "A global expert cache: the cliff and the knee (modelled)", 260, legend="below",
                       legend_rows=2)


class EstimateExplorer:
    """Widgets over :func:`specter_lab.estimate`: change any field and press Estimate (a few seconds each)."""

    def __init__(self, config: str = "qwen3-30b-a3b", gpu: str = "rtx3060", vram: str = "12GB",
                 host: str = "ddr4-3200x2", weights: str = "q4_k_m", prompt: int = 2048, context: int = 4096,
                 ram: str = "", run_now: bool = True, tokens: int = 64) -> None:
        import ipywidgets as W

        from ..estimator import estimate  # noqa: F401 - fail here, not on the first click, if it cannot load
        from ..model.geometry import CONFIG_DIR
        from ..pricing.gpus import CARDS
        from ..pricing.hosts import host_examples
        from ..pricing.precision import FORMATS

        lay = W.Layout(width="250px")
        self.config = W.Combobox(value=config, options=sorted(p.stem for p in CONFIG_DIR.glob("*.json")),
                                 description="config", placeholder="a bundled name or a config.json path", layout=lay)
        self.gpu = W.Combobox(value=gpu, options=sorted(CARDS), description="GPU", layout=lay)
        self.vram = W.Text(value=vram, description="VRAM", layout=W.Layout(width="160px"))
        self.ram = W.Text(value=ram, description="RAM", placeholder="e.g. 32GB", layout=W.Layout(width="250px"),
                          tooltip="host RAM free for the model's weights (empty: assumed to hold them all)")
        self.host = W.Combobox(value=host, options=host_examples(), description="host", layout=lay)
        self.weights = W.Dropdown(value=weights, options=list(FORMATS), description="weights",
                                  layout=W.Layout(width="190px"))
        self.prompt = W.BoundedIntText(value=prompt, min=1, max=1_000_000, description="prompt",
                                       layout=W.Layout(width="170px"))
        self.context = W.BoundedIntText(value=context, min=1, max=10_000_000, description="context",
                                        layout=W.Layout(width="180px"))
        self.button = W.Button(description="Estimate", icon="calculator", button_style="primary")
        self.status, self.table, self.commands = W.HTML(), W.HTML(), W.HTML()
        self.figure: FigurePanel | None = None  # made on the first estimate with a cache (figure_widget)
        self._show_figure = False
        self.button.on_click(lambda _: self.run())
        for w in (self.config, self.gpu, self.vram, self.ram, self.host, self.weights, self.prompt, self.context):
            w.observe(lambda _: self._stale(), names="value")
        self._controls = [W.HBox([self.config, self.gpu, self.vram, self.ram]),
                          W.HBox([self.host, self.weights, self.prompt, self.context, self.button])]
        self.box = W.VBox()
        self.tokens = tokens  # decode tokens replayed per row: fewer than the CLI's, so a change answers quickly
        self.summary: dict[str, Any] | None = None
        if run_now:
            self.run(progress=True)  # in the cell that makes it: its bars show there (a click's would go to the log)
        self._layout()

    def _layout(self) -> None:
        """The controls, the status, the table, the cache figure (when there is a cache to size), the commands."""
        figure = [self.figure] if self.figure is not None and self._show_figure else []
        self.box.children = (*self._controls, self.status, self.table, *figure, self.commands)

    def _stale(self) -> None:
        if self.summary is not None:
            self.status.value = "<b>stale</b>: the fields changed — press <b>Estimate</b>"

    def run(self, progress: bool = False) -> None:
        """Estimate with the fields as they are; a bad field is shown, never raised into the notebook. ``progress``:
        bars over the rows' replays (the status line says "estimating …" either way)."""
        from ..estimator import estimate

        self.status.value = "estimating …"
        try:
            e = estimate(self.config.value, gpu=self.gpu.value, vram=self.vram.value or None,
                         host=self.host.value or None, weights=self.weights.value, context=self.context.value,
                         ram=self.ram.value.strip() or None, tokens=self.tokens, progress=progress)
            s = self.summary = e.summary(prompt=self.prompt.value, progress=progress)
        except (ValueError, FileNotFoundError) as exc:
            # The previous estimate's table, figure and commands would read as this setting's (E14): cleared.
            self.status.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            self.table.value = self.commands.value = ""
            self._show_figure = False
            self._layout()
            return
        lo, hi = s["band_tok_s"]
        host = "" if s["host_given"] else " (no host given: the band covers a desktop's range)"
        self.status.value = (f"<b>{html.escape(s['model'])}</b> on {html.escape(s['machine'])}, "
                             f"{html.escape(s['weights'])}{host}: fastest <b>{s['best']}</b>, "
                             f"{lo:.1f}–{hi:.1f} tok/s (widest unknown: {html.escape(s['dominant_unknown'])}); "
                             f"{_choices_text(s['choices'])}. MODELLED from the config, not measured.")
        self.table.value = estimate_table(s["table"])._repr_html_()
        sizing = s["cache_sizing"]
        self._show_figure = sizing is not None  # every expert fits in VRAM: no cache to size
        if sizing is not None and self.figure is None:  # the views' own panel (config)
            self.figure = figure_widget(cliff_figure(sizing))
        elif sizing is not None:
            sync_figure(self.figure, cliff_figure(sizing))
        self._layout()
        ttft = s["prefill"]
        first = "" if ttft is None else (f"time to first token at {self.prompt.value} prompt tokens: "
                                         f"{ttft.ttft_s.iloc[0]:.2f} s ({ttft.strategy.iloc[0]}, modelled)<br>")
        cache = "" if sizing is None else html.escape(sizing.describe()) + "<br>"
        self.commands.value = (f"{first}{cache}<pre style='white-space:pre-wrap'>{html.escape(s['llama_cpp'])}\n"
                               f"{html.escape(s['engine_call'])}</pre>")

    def _repr_mimebundle_(self, **kwargs):
        return self.box._repr_mimebundle_(**kwargs)
