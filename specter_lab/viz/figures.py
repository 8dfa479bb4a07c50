"""Plotly figures of one run (routing, cache, timeline, tokens, steps): pure functions from a result, or its
frames, to a ``plotly.graph_objects.Figure``. Bench-table figures are in :mod:`.bench_figures`; this module also
re-exports them, the frame analysis and the palette, so ``viz.figures`` reaches every figure.

Every ``*_figure`` function accepts a :class:`~specter_lab.run.engine.GenerationResult`, its ``Trace`` or the dict
of frames from ``trace.frames()``. Each one draws the same set of traces whatever step it shows (empty traces
where a step has nothing of that kind), so a notebook widget can show another step by copying trace data into
its existing figures instead of rebuilding them (see :mod:`specter_lab.viz.widgets`).

Times are milliseconds on the clock named in ``trace.meta``; axis titles say whether that clock was simulated
(and projected onto a real model's cost shape) or measured with CUDA events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..records.trace import AHEAD
from .frames import (as_frames, clock_label, default_routing_step, grid_shape, hit_rates, positions_text,
                     residency, routing_cells, run_meta, step_outlines, timeline_steps, token_rows, token_text)
from .layout import base_layout, discrete_colorscale, legend_swatch
from .style import (COPY_COLORS, COPY_LANE, DISK_COLOR, DISK_LANE, GLYPH_LEGEND, HOST_LANE, PHASE_COLORS, RESIDENCY_CATEGORIES,
    RESIDENCY_COLORS, ROUTING_CATEGORIES, ROUTING_COLORS, ROUTING_HELP, STALL_COLOR, STATUS_COLORS, STATUS_HELP,
    PHASE_ORDER, esc)

__all__ = ["routing_figure", "cache_figure", "timeline_figure", "tokens_figure", "steps_figure", "StepView",
           "STEP_VIEWS"]


def routing_figure(result: Any, step: int | None = None) -> go.Figure:
    """Layers × experts for one step, each cell coloured by whether the forecast predicted it and the target used
    it: predicted & used (green), predicted not used (orange: a prefetch there is wasted), used not predicted
    (red: a miss unless it was cached anyway), neither (grey). Default step: :func:`default_routing_step`."""
    f = as_frames(result)
    meta = run_meta(result)
    if step is None:
        step = default_routing_step(f)
    cells = routing_cells(result, step)
    n_layers, n_experts = int(cells.layer.max()) + 1, int(cells.expert.max()) + 1
    z = cells.code.to_numpy().reshape(n_layers, n_experts)
    hover = [
        f"layer {r.layer} · expert {r.expert}<br><b>{r.category}</b><br>forecast count: {r.forecast_count}"
        f"<br>target count: {r.target_count}<br>token positions: {positions_text(r.positions)}"
        for r in cells.itertuples()
    ]
    hover = np.array(hover, dtype=object).reshape(n_layers, n_experts)
    # Counts in the cells ("forecast/target") only while cells are big enough to read them.
    show_text = n_layers * n_experts <= 24 * 16
    text = np.array([f"{r.forecast_count}/{r.target_count}" if (r.forecast_count or r.target_count) else ""
                     for r in cells.itertuples()], dtype=object).reshape(n_layers, n_experts)
    colors = [ROUTING_COLORS[c] for c in ROUTING_CATEGORIES]
    heat = go.Heatmap(
        z=z, x=list(range(n_experts)), y=list(range(n_layers)), zmin=-0.5, zmax=len(colors) - 0.5,
        colorscale=discrete_colorscale(colors), showscale=False, xgap=2, ygap=2, hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>", text=text if show_text else None,
        texttemplate="%{text}" if show_text else None, textfont=dict(size=10), name="routing",
    )
    fig = go.Figure([heat] + [legend_swatch(c, ROUTING_COLORS[c], ROUTING_HELP[c]) for c in ROUTING_CATEGORIES])
    counts = cells.category.value_counts()
    used = int((cells.target_count > 0).sum())
    pred = int((cells.forecast_count > 0).sum())
    both = int(counts.get("predicted & used", 0))
    steps = f["steps"]
    kind = steps.loc[steps.step == step, "kind"]
    kind = kind.iloc[0] if len(kind) else "step"
    n_tok = len(f["routing"].query("source == 'target' and step == @step").position.unique())
    if f["routing"].empty:
        quality = "routing was not recorded (Engine(record_routing=False))"
    elif pred:
        quality = f"recall {both / used:.0%}, precision {both / pred:.0%}" if used else f"{pred} predicted, none used"
    else:
        quality = "no forecast for this step" + (" (this strategy makes none)" if f["forecast"].empty else "")
    title = (f"Routing at step {step} ({kind}, {n_tok} target token{'s' if n_tok != 1 else ''}) · {quality}"
             f"<br><sup>cell text: forecast count / target count (token-expert picks) · strategy "
             f"{esc(meta.get('strategy', '?'))}</sup>")
    base_layout(fig, title, plot_height=max(90, 34 * n_layers), top=62)
    fig.update_xaxes(title_text="expert", dtick=1 if n_experts <= 32 else None, showgrid=False, zeroline=False,
                     range=[-0.5, n_experts - 0.5])
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 32 else None, autorange="reversed", showgrid=False,
                     zeroline=False)
    return fig

def cache_figure(result: Any, step: int | None = None) -> go.Figure:
    """Left: demand hit rate of every step (hits / (hits + misses) of that step's cache events) with the running
    decode hit rate (coverage) and, when the strategy forecasts, the forecast recall per step. Right: which
    experts are resident in device slots at the end of ``step`` (default: the last step), coloured by whether a
    demand load or a prefetch put them there, with the slot number in the cell when the panel is big enough to
    read it (up to 16 experts; else in the hover text), and the subtitle says which."""
    f = as_frames(result)
    meta = run_meta(result)
    hr = hit_rates(f)
    if step is None:
        step = int(hr.step.iloc[-1]) if len(hr) else 0
    n_layers, n_experts = grid_shape(f, meta)

    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.1,
                        subplot_titles=("demand hit rate per step", f"slot residency after step {step}"))
    sel = hr.step == step
    bar_colors = np.where(sel, "#1f5f99", "#9ecae1")
    hover = [f"step {r.step} ({r.kind})<br>{r.hit} hits / {r.miss} misses" for r in hr.itertuples()]
    fig.add_trace(go.Bar(x=hr.step, y=hr.hit_rate, marker_color=bar_colors, name="hit rate (step)",
                         hovertext=hover, hovertemplate="%{hovertext}<br>hit rate %{y:.0%}<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=hr.step, y=hr.coverage, mode="lines+markers", name="coverage (running decode hit rate)",
                             line=dict(color="#333", width=2), marker=dict(size=5),
                             hovertemplate="after step %{x}: %{y:.0%}<extra>coverage</extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=hr.step, y=hr.forecast_recall, mode="lines+markers", name="forecast recall (step)",
                             line=dict(color="#2ca02c", width=1.5, dash="dot"), marker=dict(size=5, symbol="diamond"),
                             # strategies without a forecast: no line, no legend entry (the trace stays, so
                             # every figure of a run has the same traces)
                             visible=bool(hr.forecast_recall.notna().any()),
                             showlegend=bool(hr.forecast_recall.notna().any()),
                             hovertemplate="step %{x}: %{y:.0%}<extra>forecast recall</extra>"), 1, 1)

    res = residency(f, step)
    code = np.zeros((n_layers, n_experts), dtype=int)
    text = np.full((n_layers, n_experts), "", dtype=object)
    hov = np.array([[f"layer {l} · expert {e}<br>not resident" for e in range(n_experts)] for l in range(n_layers)],
                   dtype=object)
    for r in res.itertuples():
        if r.layer < n_layers and r.expert < n_experts:
            code[r.layer, r.expert] = 2 if r.reason in AHEAD else 1
            text[r.layer, r.expert] = f"s{r.slot}"
            hov[r.layer, r.expert] = (f"layer {r.layer} · expert {r.expert}<br>resident in slot {r.slot}"
                                      f"<br>loaded at step {r.loaded_at_step} by {r.reason}")
    show_text = n_experts <= 16 and n_layers <= 32  # the panel is half the figure wide
    colors = [RESIDENCY_COLORS[c] for c in RESIDENCY_CATEGORIES]
    fig.add_trace(go.Heatmap(z=code, x=list(range(n_experts)), y=list(range(n_layers)), zmin=-0.5,
                             zmax=len(colors) - 0.5, colorscale=discrete_colorscale(colors), showscale=False,
                             xgap=2, ygap=2, hovertext=hov, hovertemplate="%{hovertext}<extra></extra>",
                             text=text if show_text else None, texttemplate="%{text}" if show_text else None,
                             textfont=dict(size=10), name="residency"), 1, 2)
    for c in RESIDENCY_CATEGORIES[1:]:
        fig.add_trace(legend_swatch(c, RESIDENCY_COLORS[c]), 1, 2)

    overall = hr.coverage.dropna()
    overall = f" · run decode hit rate {overall.iloc[-1]:.0%}" if len(overall) else ""
    title = (f"Expert cache · {len(res)} experts resident after step {step}{overall}"
             f"<br><sup>strategy {esc(meta.get('strategy', '?'))} · "
             f"{'slot numbers in the cells' if show_text else 'hover a cell for its slot'}</sup>")
    base_layout(fig, title, plot_height=max(190, 30 * n_layers), legend="below", top=80)
    fig.update_layout(bargap=0.15)
    fig.update_xaxes(title_text="step", dtick=1 if len(hr) <= 16 else None, row=1, col=1,
                     range=[-0.6, max(len(hr), 2) - 0.4])
    fig.update_yaxes(title_text="hit rate", range=[0, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_xaxes(title_text="expert", dtick=1 if n_experts <= 16 else None, showgrid=False, zeroline=False,
                     range=[-0.5, n_experts - 0.5], row=1, col=2)
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 32 else None, autorange="reversed", showgrid=False,
                     zeroline=False, row=1, col=2)
    return fig

def _span_hover(r) -> str:
    if r.layer < 0:
        what = "LM head"
    elif r.expert < 0:
        what = f"layer {r.layer} · dense part (attention, router, shared)"
    else:
        what = f"layer {r.layer} · expert {r.expert}"
    stall = f"<br><b>stalled {r.stall:.4f} ms</b> waiting on copies" if r.stall > 0 else ""
    return f"{r.phase} · {what}<br>{r.start:.4f} – {r.end:.4f} ms (step {r.step}){stall}"

def timeline_figure(result: Any, step: int | None = None, max_steps: int = 24, max_bars: int = 4000) -> go.Figure:
    """Gantt chart of the compute lanes (one per phase: prefill / decode / draft / verify), the host→device
    copy lane and, with a disk tier (``host_budget=``), the disk lane: experts read from the checkpoint files into
    the host cache. Copies are coloured by reason (a forecast's prefetch, a refresh on an idle link, a demand copy)
    and labelled layer/expert (bytes and reason on hover);
    red bars mark stalls, the time a compute op waited on a copy ([start − stall, start] on its lane).
    ``step=None`` draws the whole run, capped to the first ``max_steps`` steps / ``max_bars`` bars."""
    f = as_frames(result)
    meta = run_meta(result)
    shown, note = timeline_steps(f, step, max_steps, max_bars)
    co_all, tr_all = f["compute"], f["transfers"]
    if "lane" in co_all:  # host execution: host spans get the host lane, whatever phase they served
        co_all = co_all.assign(phase=co_all.phase.mask(co_all.lane == "host", HOST_LANE))
    dk_all = f.get("disk")
    if dk_all is None:  # frames made before the disk tier, or a live snapshot without them
        dk_all = pd.DataFrame(columns=["step", "layer", "expert", "slot", "bytes", "file_bytes", "start", "end",
                                       "reason"])
    co = co_all[co_all.step.isin(shown)]
    tr = tr_all[tr_all.step.isin(shown)]
    dk = dk_all[dk_all.step.isin(shown)]
    # Lanes and traces come from the whole run, so every step's figure has the same traces (see module doc).
    phases = [p for p in PHASE_ORDER if p in set(co_all.phase)] + sorted(set(co_all.phase) - set(PHASE_ORDER))
    lanes = [p for p in phases if p in set(co.phase)] + [COPY_LANE]  # drawn lanes: only those with bars here
    if len(dk_all):  # the disk tier's lane, on every step of a run that had one
        lanes.append(DISK_LANE)

    # Outlines separate neighbouring ops once zoomed in; over a whole run bars are a pixel wide and white
    # outlines would wash them out.
    outline = 0.4 if step is not None else 0
    traces = []
    for p in phases:
        d = co[co.phase == p]
        traces.append(go.Bar(
            y=[p] * len(d), x=(d.end - d.start).to_numpy(), base=d.start.to_numpy(), orientation="h",
            name=f"compute: {p}",
            marker=dict(color=PHASE_COLORS.get(p, "#aaa"), line=dict(color="white", width=outline)),
            hovertext=[_span_hover(r) for r in d.itertuples()], hovertemplate="%{hovertext}<extra></extra>",
            width=0.6, legendgroup="compute"))
    for reason in COPY_COLORS:  # a forecast's prefetch, a refresh on an idle link, a demand copy
        d = tr[tr.reason == reason]
        hover = [f"H2D copy ({reason}) · layer {r.layer} · expert {r.expert} → slot {r.slot}<br>"
                 f"{int(r.bytes):,} B · {r.start:.4f} – {r.end:.4f} ms (step {r.step})" for r in d.itertuples()]
        traces.append(go.Bar(
            y=[COPY_LANE] * len(d), x=(d.end - d.start).to_numpy(), base=d.start.to_numpy(), orientation="h",
            name=f"copy: {reason}", marker=dict(color=COPY_COLORS[reason],
                                                line=dict(color="white", width=1.5 * outline)),
            # Horizontal labels only: a rotated label squeezed into a narrow bar was 6 px; uniformtext hides any
            # that does not fit at 8 px (hover still names every copy).
            text=[f"L{r.layer}·E{r.expert}" for r in d.itertuples()], textposition="inside", textangle=0,
            insidetextanchor="middle", textfont=dict(color="white", size=10), hovertext=hover,
            hovertemplate="%{hovertext}<extra></extra>", width=0.6, legendgroup="copy"))
    # the disk lane (always a trace, empty without a disk tier, so every step's figure has the same traces)
    traces.append(go.Bar(
        y=[DISK_LANE] * len(dk), x=(dk.end - dk.start).to_numpy(dtype=float), base=dk.start.to_numpy(dtype=float),
        orientation="h", name="disk read (to the host cache)",
        marker=dict(color=DISK_COLOR, line=dict(color="white", width=1.5 * outline)),
        hovertext=[f"disk read ({r.reason}) · layer {r.layer} · expert {r.expert} → host slot {r.slot}<br>"
                   f"{int(r.bytes):,} B priced ({int(r.file_bytes):,} B read from the files) · "
                   f"{r.start:.4f} – {r.end:.4f} ms (step {r.step})" for r in dk.itertuples()],
        hovertemplate="%{hovertext}<extra></extra>", width=0.6, legendgroup="disk"))
    st = co[co.stall > 0]
    traces.append(go.Bar(
        y=st.phase.tolist(), x=st.stall.to_numpy(), base=(st.start - st.stall).to_numpy(), orientation="h",
        # Thinner than the compute bars it sits on, so the lane's compute stays visible above and below it.
        name="stall (waiting on a copy)", marker=dict(color=STALL_COLOR, line=dict(width=0)), width=0.3,
        opacity=0.9,
        hovertext=[f"stall {r.stall:.4f} ms before {r.phase} layer {r.layer} expert {r.expert} (step {r.step})"
                   for r in st.itertuples()], hovertemplate="%{hovertext}<extra></extra>"))
    fig = go.Figure(traces)

    steps = f["steps"][f["steps"].step.isin(shown)]
    # Step boundaries as thin lines, labelled while there are few enough to read.
    shapes, annotations = [], []
    if step is None and len(steps) > 1:
        every = max(1, math.ceil(len(steps) / 8))  # at most 8 labels: more ran into each other
        for i, r in enumerate(steps.itertuples()):
            shapes.append(dict(type="line", x0=r.start, x1=r.start, yref="paper", y0=0, y1=1,
                               line=dict(color="#bbb", width=1, dash="dot")))
            if i % every == 0:
                annotations.append(dict(x=r.start, y=1.0, yref="paper", text=f"step {r.step}", showarrow=False,
                                        xanchor="left", yanchor="bottom", font=dict(size=10, color="#777")))
    stall_ms = float(co.stall.sum())
    where = f"step {shown[0]} ({steps.kind.iloc[0]})" if step is not None and len(steps) else "whole run"
    disk_note = f", {len(dk)} disk reads" if len(dk_all) else ""
    title = (f"Timeline · {where}{note} · {len(tr)} copies ({int(tr.bytes.sum()):,} B){disk_note}, "
             f"stalls {stall_ms:.3f} ms"
             f"<br><sup>strategy {esc(meta.get('strategy', '?'))} · clock {esc(clock_label(meta))}</sup>")
    base_layout(fig, title, plot_height=46 * len(lanes), legend="below", left=90, legend_rows=2,
                 top=82 if annotations else 64)  # room for the step labels
    x0 = float(steps.start.min()) if len(steps) else 0.0
    x1 = float(max(steps.end.max() if len(steps) else 0.0, tr.end.max() if len(tr) else 0.0,
                   float(dk.end.max()) if len(dk) else 0.0, x0 + 1e-6))
    pad = 0.01 * (x1 - x0)
    fig.update_layout(barmode="overlay", shapes=shapes, annotations=annotations,
                      uniformtext=dict(minsize=8, mode="hide"))
    fig.update_xaxes(title_text=f"time (ms), {clock_label(meta)}", range=[x0 - pad, x1 + pad], zeroline=False)
    fig.update_yaxes(categoryorder="array", categoryarray=lanes, autorange="reversed", type="category")
    return fig

def tokens_figure(result: Any, tokenizer: Any = None, highlight_step: int | None = None, wrap: int = 16,
                  max_rows: int = 60) -> go.Figure:
    """The generated tokens as a strip of cells coloured by status: prefill / decode for plain decoding,
    accepted / corrected / bonus / rejected for speculative windows (one row per window, the rejected drafts after
    the committed tokens). Cell text is the decoded token if a tokenizer is given, else the id.

    ``result`` may also be a bare tokens DataFrame (the live view builds one while generating).
    ``highlight_step`` frames that step's tokens and dims every later step, so a step slider shows the text as it
    stood after that step. A strip longer than ``max_rows`` rows shows the ``max_rows`` rows that end at the
    highlighted step (the first ones without a highlight)."""
    if isinstance(result, pd.DataFrame):
        tok, kinds = result, {}
    else:
        f = as_frames(result)
        tok = f["tokens"]
        kinds = dict(zip(f["steps"].step, f["steps"].kind))
    placed = token_rows(tok, kinds, wrap) if len(tok) else tok.assign(row=[], col=[], row_label=[])
    n_rows = int(placed.row.max()) + 1 if len(placed) else 0
    truncated = n_rows > max_rows
    first_row = 0
    if truncated:
        # The rows up to the highlighted step (ending at it), so the step a slider shows is always in view.
        marked = placed.row[placed.step == highlight_step] if highlight_step is not None else placed.row[:0]
        first_row = max(0, int(marked.max()) + 1 - max_rows) if len(marked) else 0
        placed = placed[(placed.row >= first_row) & (placed.row < first_row + max_rows)]
    traces = []
    for status in STATUS_COLORS:
        d = placed[placed.status == status] if len(placed) else placed
        if highlight_step is None:
            opacity = [1.0] * len(d)
        else:
            opacity = [1.0 if s <= highlight_step else 0.25 for s in d.step]
        traces.append(go.Bar(
            y=d.row_label.tolist(), x=[0.94] * len(d), base=(d.col - 0.47).tolist(), orientation="h",
            name=status, marker=dict(color=STATUS_COLORS[status], opacity=opacity, line=dict(width=0)),
            text=[token_text(t, tokenizer) for t in d.token_id], textposition="inside", insidetextanchor="middle",
            textfont=dict(color="white", size=12), customdata=np.c_[d["index"].to_numpy(), d.step.to_numpy()]
            if len(d) else None,
            hovertemplate=f"<b>{status}</b> ({STATUS_HELP[status]})<br>token %{{text}} · index %{{customdata[0]}} · "
                          f"step %{{customdata[1]}}<extra></extra>",
            width=0.82, showlegend=bool(len(d)), constraintext="none"))
    fig = go.Figure(traces)
    rows = list(dict.fromkeys(placed.row_label)) if len(placed) else []
    n_cols = int(placed.col.max()) + 1 if len(placed) else 1
    committed = int(tok.committed.sum()) if len(tok) else 0
    counts = tok.status.value_counts() if len(tok) else pd.Series(dtype=int)
    parts = [f"{int(counts[s])} {s}" for s in STATUS_COLORS if s in counts.index and s != "prefill"]
    title = (f"Tokens · {committed} generated" + (f" ({', '.join(parts)})" if parts else "")
             + (f" · rows {first_row}–{first_row + max_rows - 1} of {n_rows} shown" if truncated else "")
             + (f"<br><sup>in the cells: {GLYPH_LEGEND} · hover a cell for its status</sup>" if tokenizer is not None
                else "<br><sup>token ids (no tokenizer)</sup>"))
    base_layout(fig, title, plot_height=max(40, 30 * len(rows)), top=62, left=90)
    fig.update_layout(barmode="overlay", bargap=0.1, uniformtext=dict(minsize=7, mode="hide"), margin=dict(b=15),
                      shapes=step_outlines(placed, rows, highlight_step))
    fig.update_xaxes(visible=False, range=[-0.6, max(n_cols, 4) - 0.4])
    fig.update_yaxes(categoryorder="array", categoryarray=rows, autorange="reversed", type="category",
                     showgrid=False)
    return fig

def steps_figure(result: Any) -> go.Figure:
    """Tokens per step: accepted drafts, the target's own token (corrected / bonus, or the decode token) and the
    rejected drafts, stacked. ``result`` may be a bare steps DataFrame (step, kind, drafted, accepted, committed)."""
    st = result if isinstance(result, pd.DataFrame) else as_frames(result)["steps"]
    st = st.copy()
    if len(st):
        own = st.committed - st.accepted
        rejected = (st.drafted - st.accepted).clip(lower=0)
    else:
        own = rejected = pd.Series(dtype=float)
    fig = go.Figure([
        go.Bar(x=st.step, y=st.accepted, name="accepted drafts", marker_color=STATUS_COLORS["accepted"]),
        go.Bar(x=st.step, y=own, name="target's token (decode / corrected / bonus)",
               marker_color=STATUS_COLORS["decode"]),
        go.Bar(x=st.step, y=rejected, name="rejected drafts", marker_color=STATUS_COLORS["rejected"], opacity=0.7),
    ])
    committed = int(st.committed.sum()) if len(st) else 0
    drafted = int(st.drafted.sum()) if len(st) else 0
    acc = f" · acceptance {st.accepted.sum() / drafted:.0%}" if drafted else ""
    base_layout(fig, f"Tokens per step · {len(st)} steps, {committed} tokens{acc}", plot_height=170, top=50)
    fig.update_layout(barmode="stack", bargap=0.2)
    fig.update_xaxes(title_text="step", dtick=1 if len(st) <= 30 else None)
    top = float((st.committed + rejected).max()) if len(st) else 1.0
    fig.update_yaxes(title_text="tokens", range=[0, max(top, 1.0) * 1.08])
    return fig

@dataclass(frozen=True)
class StepView:
    """One per-step view of a run: ``view(frames, step, tokenizer)`` draws it (``step=None``: the run as a whole,
    as a report shows it). ``needs`` names a frame without which the view has nothing to say (a report skips it)."""

    heading: str
    draw: Callable[[Any, "int | None", Any], go.Figure]
    needs: str | None = None

    def __call__(self, frames: Any, step: int | None = None, tokenizer: Any = None, **options: Any) -> go.Figure:
        return self.draw(frames, step, tokenizer, **options)


# The per-step views, in the order they are shown. The dashboard, the live run and the HTML report iterate over
# this: a new view is one figure function and one line here.
STEP_VIEWS: dict[str, StepView] = {
    # ``max_rows``: the dashboard caps the strip (a long run's 60 rows pushed every other view out of sight).
    "tokens": StepView("Tokens", lambda f, step, tok, max_rows=60: tokens_figure(f, tok, highlight_step=step,
                                                                                 max_rows=max_rows)),
    "routing": StepView("Routing vs forecast", lambda f, step, tok, **_: routing_figure(f, step), needs="routing"),
    "cache": StepView("Expert cache", lambda f, step, tok, **_: cache_figure(f, step)),
    "timeline": StepView("Timeline", lambda f, step, tok, **_: timeline_figure(f, step)),
}


# Re-exported so ``viz.figures`` stays the one place the widgets and notebooks reach every figure through.
from .bench_figures import *  # noqa: E402,F401,F403
from .frames import *  # noqa: E402,F401,F403
from .style import *  # noqa: E402,F401,F403
