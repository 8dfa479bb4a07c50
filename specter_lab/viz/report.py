"""Standalone HTML reports of a run (``result.to_html``) and of a bench table (``specter-lab bench --html``):
the figures inlined with plotly.js once, metrics and tables beside them, readable offline.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .bench_figures import table_clock, compare_figure, cost_figure, regime_figure, speedup_figure
from .figures import STEP_VIEWS, steps_figure
from .frames import as_frames, run_meta, clock_label
from .style import esc

__all__ = ["report_html", "bench_html", "figures_page"]


_CSS = """
body{font-family:Inter,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.note{color:#555;font-size:13px} table.metrics{border-collapse:collapse;font-size:13px}
table.metrics td,table.metrics th{border-bottom:1px solid #eee;padding:3px 12px;text-align:left}
table.metrics td.v{text-align:right;font-variant-numeric:tabular-nums} pre{white-space:pre-wrap;background:#f6f6f6;
padding:8px;border-radius:4px;font-size:13px}
"""

def _fmt_value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "–"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {val}" for k, val in v.items())
    return str(v)

def _metrics_table(metrics: Mapping[str, Any], columns: int = 3) -> str:
    """Metrics as name/value tables side by side (one long table wastes the page)."""
    items = list(metrics.items())
    per = max(1, math.ceil(len(items) / columns))
    tables = []
    for i in range(0, len(items), per):
        rows = "".join(f"<tr><th>{esc(k)}</th><td class='v'>{esc(_fmt_value(v))}</td></tr>"
                       for k, v in items[i:i + per])
        tables.append(f"<table class='metrics'>{rows}</table>")
    return f"<div style='display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start'>{''.join(tables)}</div>"

def _figures_html(figs: Iterable[tuple[str, go.Figure]]) -> str:
    """Figures as HTML fragments; plotly.js is inlined once (the first figure) so the page works offline."""
    out = []
    for i, (heading, fig) in enumerate(figs):
        out.append(f"<h2>{esc(heading)}</h2>")
        out.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False}))
    return "\n".join(out)

def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>")

def figures_page(title: str, note: str, figs: Iterable[tuple[str, go.Figure]]) -> str:
    """A standalone HTML page of some figures under a title and a one-line note (a dashboard's views of one
    step, :meth:`~.widgets.Dashboard.export`)."""
    return _page(title, f"<h1>{esc(title)}</h1><p class='note'>{esc(note)}</p>" + _figures_html(figs))

def report_html(result: Any, tokenizer: Any = None) -> str:
    """A standalone HTML report of one run: settings, metrics table, the step figure and every per-step view of
    :data:`~.figures.STEP_VIEWS` over the whole run (plotly.js inline once, so the file opens offline)."""
    meta = run_meta(result)
    metrics = dict(getattr(result, "metrics", {}) or {})
    strategy = getattr(result, "strategy", meta.get("strategy", "?"))
    text = getattr(result, "text", None)
    ids = getattr(result, "token_ids", None)
    frames = as_frames(result)
    figs: list[tuple[str, go.Figure]] = [("Steps", steps_figure(result))]
    figs += [(view.heading, view(result, None, tokenizer)) for view in STEP_VIEWS.values()
             if view.needs is None or len(frames[view.needs])]
    output = text if text is not None else (" ".join(str(t) for t in ids) if ids is not None else "")
    body = (f"<h1>specter_lab run · strategy {esc(strategy)}</h1>"
            f"<p class='note'>clock: {esc(meta.get('clock', '?'))} — times are {esc(clock_label(meta))}. "
            f"{len(ids) if ids is not None else '?'} new tokens; model: {esc(meta.get('num_layers', '?'))} MoE layers "
            f"× {esc(meta.get('num_experts', '?'))} experts, top-{esc(meta.get('top_k', '?'))}.</p>"
            f"<h2>Output</h2><pre>{esc(output)}</pre>"
            f"<h2>Metrics</h2>{_metrics_table(metrics)}" + _figures_html(figs))
    return _page(f"specter_lab · {strategy}", body)

def _df_html(df: pd.DataFrame) -> str:
    return df.to_html(index=False, classes="metrics", float_format=lambda v: f"{v:.4g}", border=0)

def bench_html(df: pd.DataFrame, summary: pd.DataFrame | None = None, info: Mapping[str, Any] | None = None) -> str:
    """A standalone HTML report of ``sl.compare``: the TPOT figure, the speedup summary, any extra tables in
    ``info`` (ablations, k_sweep, cpu_overhead, regimes: lists of records) and every run."""
    info = dict(info or {})
    body = [f"<h1>specter_lab benchmark</h1><p class='note'>{esc(info.get('note', table_clock(df)))}"
            + (f" · model {esc(info['model'])}" if "model" in info else "")
            + (f" · draft {esc(info['draft'])}" if "draft" in info else "") + "</p>"]
    figs = [("TPOT by strategy", compare_figure(df))]
    if "specter" in set(df.strategy):
        figs.append(("Speedup of specter", speedup_figure(df)))
    figs.append(("Stalls and transfers", cost_figure(df)))
    if info.get("regimes"):
        figs.append(("Regime map", regime_figure(pd.DataFrame(info["regimes"]))))
    body.append(_figures_html(figs))
    if summary is not None and len(summary):
        body.append(f"<h2>Summary</h2>{_df_html(summary)}")
    for key, heading in (("ablations", "Ablations"), ("k_sweep", "K sweep"),
                         ("cpu_overhead", "CPU wall-clock vs HF generate"), ("regimes", "Regime map")):
        if info.get(key):
            body.append(f"<h2>{heading}</h2>{_df_html(pd.DataFrame(info[key]))}")
    body.append(f"<h2>All runs</h2>{_df_html(df)}")
    return _page("specter_lab benchmark", "\n".join(body))
