"""Plotly figures of one run (or of a benchmark table): pure functions from a result, or its frames, to a
``plotly.graph_objects.Figure``.

Every ``*_figure`` function accepts a :class:`~specter_lab.engine.GenerationResult`, its ``Trace`` or the dict
of frames from ``trace.frames()``. Each one draws the same set of traces whatever step it shows (empty traces
where a step has nothing of that kind), so a notebook widget can show another step by copying trace data into
its existing figures instead of rebuilding them (see :mod:`specter_lab.viz.widgets`).

Times are milliseconds on the clock named in ``trace.meta``; axis titles say whether that clock was simulated
(and projected onto a real model's cost shape) or measured with CUDA events.
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = [
    "routing_figure", "cache_figure", "timeline_figure", "tokens_figure", "steps_figure", "fidelity_figure",
    "compare_figure", "speedup_figure", "cost_figure", "regime_figure", "tuner_figure", "report_html", "bench_html", "routing_cells", "residency", "clock_label",
    "default_routing_step", "ROUTING_CATEGORIES", "ROUTING_COLORS", "STATUS_COLORS", "PHASE_COLORS", "COPY_COLORS",
    "STALL_COLOR", "COPY_LANE",
]

Frames = dict[str, pd.DataFrame]

# ----------------------------------------------------------------------------------------- palette
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
COPY_COLORS = {"prefetch": "#2ca02c", "demand": "#ff7f0e"}
STALL_COLOR = "#d62728"
COPY_LANE = "copy (PCIe)"
RESIDENCY_CATEGORIES = ("not resident", "resident (demand load)", "resident (prefetch)")
RESIDENCY_COLORS = {"not resident": "#ececec", "resident (demand load)": "#ff7f0e",
                    "resident (prefetch)": "#2ca02c"}
_PHASE_ORDER = ("prefill", "decode", "draft", "verify", "head", HOST_LANE)
_FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12)


# ----------------------------------------------------------------------------------------- inputs
def _frames(result: Any) -> Frames:
    """Frames of a GenerationResult, a Trace or an already-made dict of frames."""
    if isinstance(result, Mapping):
        return dict(result)
    trace = getattr(result, "trace", result)
    return trace.frames()


def _meta(result: Any) -> dict[str, Any]:
    if isinstance(result, Mapping):
        return dict(result.get("meta", {})) if isinstance(result.get("meta"), Mapping) else {}
    trace = getattr(result, "trace", result)
    return dict(getattr(trace, "meta", {}) or {})


def clock_label(meta: Mapping[str, Any]) -> str:
    """How the times were produced, for axis titles: 'simulated (profile X)' or 'measured (CUDA)', plus
    'projected as <shape>' when experts were priced as a bigger real model."""
    clock = str(meta.get("clock") or "")
    simulated = meta.get("simulated")
    if simulated is None:
        simulated = clock.startswith("simulated")
    if simulated:
        label = f"simulated (profile {meta.get('profile') or clock.partition(':')[2] or '?'})"
    else:
        device = clock.partition(":")[2] if clock.startswith("cuda:") else ""
        label = f"measured (CUDA{', ' + device if device else ''})"
    if meta.get("projected"):
        label += f", projected as {meta.get('cost_shape')}"
    return label


def _base_layout(fig: go.Figure, title: str, plot_height: int, legend: str = "top", top: int = 75,
                 left: int = 70, legend_rows: int = 1) -> go.Figure:
    """Common look. ``plot_height`` is the plot area in px; margins are added around it so a legend never sits
    on an axis title. ``legend``: 'top' (one row between title and plot, right-aligned), 'below' (under the
    x-axis title; plotly positions legends in plot-area fractions, hence the px conversion) or 'right'."""
    bottom = 55
    leg: dict[str, Any] = dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0)
    if legend == "top":
        top += 22 * legend_rows
    elif legend == "below":
        bottom = 75 + 22 * legend_rows
        leg = dict(orientation="h", yanchor="top", y=-62 / plot_height, xanchor="left", x=0.0)
    elif legend == "right":
        leg = dict(orientation="v", yanchor="top", y=1.0, xanchor="left", x=1.02)
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", y=1 - 14 / (plot_height + top + bottom),
                                 yanchor="top", font=dict(size=15)),
                      height=plot_height + top + bottom, template="plotly_white", font=_FONT,
                      margin=dict(l=left, r=30, t=top, b=bottom), legend=leg)
    return fig


def _legend_swatch(name: str, color: str, help_text: str = "", group: str | None = None) -> go.Scatter:
    """An invisible trace whose only job is a legend entry (heatmaps have no per-category legend)."""
    return go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup=group or name,
                      marker=dict(symbol="square", size=13, color=color, line=dict(color="#999", width=0.5)),
                      hoverinfo="skip", showlegend=True, meta=help_text)


def _discrete_colorscale(colors: list[str]) -> list[list]:
    """A stepped colorscale for integer codes 0..n-1 drawn with zmin=-0.5, zmax=n-0.5 (code c sits mid-band)."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=False)


# ----------------------------------------------------------------------------------------- routing
def default_routing_step(frames: Frames) -> int:
    """The decode/window step whose target routing has the most rows (the widest verification pass); step 0
    (the prefill) only when the run has no other step. Ties go to the earliest step."""
    ro = frames["routing"]
    tgt = ro[ro.source == "target"]
    later = tgt[tgt.step >= 1]
    use = later if len(later) else tgt
    if use.empty:
        steps = frames["steps"]
        return int(steps.step.iloc[-1]) if len(steps) else 0
    counts = use.groupby("step").size()
    return int(counts.index[counts.values.argmax()])


def routing_cells(result: Any, step: int) -> pd.DataFrame:
    """One row per (layer, expert) of the model for one step: forecast count, target count, the token positions
    that chose it, and the category (see ``ROUTING_CATEGORIES``).

    "predicted" = the step's forecast rows; "used" = the step's target routing rows (for a window step, the
    verification pass)."""
    return _routing_cells(_frames(result), _meta(result), step)


def _grid_shape(f: Frames, meta: Mapping[str, Any]) -> tuple[int, int]:
    """(layers, experts) from trace.meta, else from the largest ids seen in the frames."""
    ro, fc = f["routing"], f["forecast"]
    seen = pd.concat([ro[["layer", "expert"]], fc[["layer", "expert"]]])
    n_layers = int(meta.get("num_layers") or (seen.layer.max() + 1 if len(seen) else 1))
    n_experts = int(meta.get("num_experts") or (seen.expert.max() + 1 if len(seen) else 1))
    return n_layers, n_experts


def _routing_cells(f: Frames, meta: Mapping[str, Any], step: int) -> pd.DataFrame:
    ro, fc = f["routing"], f["forecast"]
    n_layers, n_experts = _grid_shape(f, meta)
    grid = pd.MultiIndex.from_product([range(n_layers), range(n_experts)], names=["layer", "expert"])
    tgt = ro[(ro.source == "target") & (ro.step == step)]
    used = tgt.groupby(["layer", "expert"]).agg(target_count=("position", "size"),
                                                 positions=("position", lambda p: sorted(set(int(x) for x in p))))
    pred = fc[fc.step == step].groupby(["layer", "expert"])["count"].sum().rename("forecast_count")
    cells = pd.DataFrame(index=grid).join(used).join(pred).reset_index()
    cells["target_count"] = cells.target_count.fillna(0).astype(int)
    cells["forecast_count"] = cells.forecast_count.fillna(0).astype(int)
    cells["positions"] = [p if isinstance(p, list) else [] for p in cells.positions]
    is_pred, is_used = cells.forecast_count > 0, cells.target_count > 0
    code = np.select([is_pred & is_used, is_pred & ~is_used, ~is_pred & is_used], [1, 2, 3], default=0)
    cells["code"] = code
    cells["category"] = [ROUTING_CATEGORIES[c] for c in code]
    return cells


def _positions_text(pos: list[int], limit: int = 12) -> str:
    if not pos:
        return "–"
    shown = ", ".join(str(p) for p in pos[:limit])
    return shown + (f" … (+{len(pos) - limit})" if len(pos) > limit else "")


def routing_figure(result: Any, step: int | None = None) -> go.Figure:
    """Layers × experts for one step, each cell coloured by whether the forecast predicted it and the target used
    it: predicted & used (green), predicted not used (orange: a prefetch there is wasted), used not predicted
    (red: a miss unless it was cached anyway), neither (grey). Default step: :func:`default_routing_step`."""
    f = _frames(result)
    meta = _meta(result)
    if step is None:
        step = default_routing_step(f)
    cells = _routing_cells(f, meta, step)
    n_layers, n_experts = int(cells.layer.max()) + 1, int(cells.expert.max()) + 1
    z = cells.code.to_numpy().reshape(n_layers, n_experts)
    hover = [
        f"layer {r.layer} · expert {r.expert}<br><b>{r.category}</b><br>forecast count: {r.forecast_count}"
        f"<br>target count: {r.target_count}<br>token positions: {_positions_text(r.positions)}"
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
        colorscale=_discrete_colorscale(colors), showscale=False, xgap=2, ygap=2, hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>", text=text if show_text else None,
        texttemplate="%{text}" if show_text else None, textfont=dict(size=10), name="routing",
    )
    fig = go.Figure([heat] + [_legend_swatch(c, ROUTING_COLORS[c], ROUTING_HELP[c]) for c in ROUTING_CATEGORIES])
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
             f"{_esc(meta.get('strategy', '?'))}</sup>")
    _base_layout(fig, title, plot_height=max(90, 34 * n_layers), top=62)
    fig.update_xaxes(title_text="expert", dtick=1 if n_experts <= 32 else None, showgrid=False, zeroline=False,
                     range=[-0.5, n_experts - 0.5])
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 32 else None, autorange="reversed", showgrid=False,
                     zeroline=False)
    return fig


# ----------------------------------------------------------------------------------------- cache
def residency(result: Any, step: int) -> pd.DataFrame:
    """Which experts sit in device slots at the end of ``step``: one row per resident (layer, expert) with its
    slot, the step and reason of the load that put it there.

    A transfer makes (layer, expert) resident and its 'evict' cache event removes it. An expert cannot be loaded
    again while resident, so it is resident exactly when it has had more loads than evictions up to that step;
    counting avoids relying on time order, which a prefetch issued in the past (the oracle's) would break."""
    f = _frames(result)
    tr = f["transfers"]
    tr = tr[tr.step <= step]
    ev = f["cache"]
    ev = ev[(ev.step <= step) & (ev.event == "evict")]
    loads = tr.groupby(["layer", "expert"]).size().rename("loads")
    evicts = ev.groupby(["layer", "expert"]).size().rename("evicts")
    last = tr.groupby(["layer", "expert"]).tail(1).set_index(["layer", "expert"])[["slot", "step", "reason"]]
    res = pd.concat([loads, evicts], axis=1).fillna(0)
    res = res[res.loads > res.evicts].join(last).reset_index()
    res = res.rename(columns={"step": "loaded_at_step"})[["layer", "expert", "slot", "loaded_at_step", "reason"]]
    return res.astype({"layer": int, "expert": int, "slot": int, "loaded_at_step": int})


def _hit_rates(frames: Frames) -> pd.DataFrame:
    """Per step: demand hits, misses, hit rate and the running decode hit rate (coverage so far; its last value
    is the run's ``hit_rate``, which excludes the prefill)."""
    steps = frames["steps"][["step", "kind"]]
    ce = frames["cache"]
    dem = ce[ce.event.isin(["hit", "miss"])]
    cnt = dem.groupby(["step", "event"]).size().unstack(fill_value=0).reindex(columns=["hit", "miss"], fill_value=0)
    out = steps.set_index("step").join(cnt).fillna({"hit": 0, "miss": 0}).reset_index()
    out[["hit", "miss"]] = out[["hit", "miss"]].astype(int)
    tot = out.hit + out.miss
    out["hit_rate"] = np.where(tot > 0, out.hit / tot.where(tot > 0, 1), np.nan)
    dec = out.step >= 1
    cum_h = out.hit.where(dec, 0).cumsum()
    cum_t = tot.where(dec, 0).cumsum()
    out["coverage"] = np.where(dec & (cum_t > 0), cum_h / cum_t.where(cum_t > 0, 1), np.nan)
    # Forecast recall per step (what fraction of the experts the target used had been forecast).
    fc, ro = frames["forecast"], frames["routing"]
    if len(fc):
        used = ro[ro.source == "target"][["step", "layer", "expert"]].drop_duplicates()
        pred = fc[["step", "layer", "expert"]].drop_duplicates()
        both = used.merge(pred).groupby("step").size()
        n_used = used[used.step.isin(pred.step.unique())].groupby("step").size()
        out["forecast_recall"] = out.step.map((both.reindex(n_used.index, fill_value=0) / n_used)).astype(float)
    else:
        out["forecast_recall"] = np.nan
    return out


def cache_figure(result: Any, step: int | None = None) -> go.Figure:
    """Left: demand hit rate of every step (hits / (hits + misses) of that step's cache events) with the running
    decode hit rate (coverage) and, when the strategy forecasts, the forecast recall per step. Right: which
    experts are resident in device slots at the end of ``step`` (default: the last step), coloured by whether a
    demand load or a prefetch put them there, with the slot number in the cell when the panel is big enough to
    read it (up to 16 experts; else in the hover text), and the subtitle says which."""
    f = _frames(result)
    meta = _meta(result)
    hr = _hit_rates(f)
    if step is None:
        step = int(hr.step.iloc[-1]) if len(hr) else 0
    n_layers, n_experts = _grid_shape(f, meta)

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
            code[r.layer, r.expert] = 2 if r.reason == "prefetch" else 1
            text[r.layer, r.expert] = f"s{r.slot}"
            hov[r.layer, r.expert] = (f"layer {r.layer} · expert {r.expert}<br>resident in slot {r.slot}"
                                      f"<br>loaded at step {r.loaded_at_step} by {r.reason}")
    show_text = n_experts <= 16 and n_layers <= 32  # the panel is half the figure wide
    colors = [RESIDENCY_COLORS[c] for c in RESIDENCY_CATEGORIES]
    fig.add_trace(go.Heatmap(z=code, x=list(range(n_experts)), y=list(range(n_layers)), zmin=-0.5,
                             zmax=len(colors) - 0.5, colorscale=_discrete_colorscale(colors), showscale=False,
                             xgap=2, ygap=2, hovertext=hov, hovertemplate="%{hovertext}<extra></extra>",
                             text=text if show_text else None, texttemplate="%{text}" if show_text else None,
                             textfont=dict(size=10), name="residency"), 1, 2)
    for c in RESIDENCY_CATEGORIES[1:]:
        fig.add_trace(_legend_swatch(c, RESIDENCY_COLORS[c]), 1, 2)

    overall = hr.coverage.dropna()
    overall = f" · run decode hit rate {overall.iloc[-1]:.0%}" if len(overall) else ""
    title = (f"Expert cache · {len(res)} experts resident after step {step}{overall}"
             f"<br><sup>strategy {_esc(meta.get('strategy', '?'))} · "
             f"{'slot numbers in the cells' if show_text else 'hover a cell for its slot'}</sup>")
    _base_layout(fig, title, plot_height=max(190, 30 * n_layers), legend="below", top=80)
    fig.update_layout(bargap=0.15)
    fig.update_xaxes(title_text="step", dtick=1 if len(hr) <= 16 else None, row=1, col=1,
                     range=[-0.6, max(len(hr), 2) - 0.4])
    fig.update_yaxes(title_text="hit rate", range=[0, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_xaxes(title_text="expert", dtick=1 if n_experts <= 16 else None, showgrid=False, zeroline=False,
                     range=[-0.5, n_experts - 0.5], row=1, col=2)
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 32 else None, autorange="reversed", showgrid=False,
                     zeroline=False, row=1, col=2)
    return fig


# ----------------------------------------------------------------------------------------- timeline
def _timeline_steps(frames: Frames, step: int | None, max_steps: int, max_bars: int) -> tuple[list[int], str]:
    """Which steps to draw and a note for the title. One step, or the first steps of the run up to
    ``max_steps`` and ``max_bars`` bars (a long run would make the browser draw tens of thousands of rects)."""
    all_steps = [int(s) for s in frames["steps"].step]
    if step is not None:
        return [int(step)], ""
    bars = (frames["compute"].groupby("step").size().add(frames["transfers"].groupby("step").size(), fill_value=0)
            .reindex(all_steps, fill_value=0))
    chosen, total = [], 0
    for s in all_steps[:max_steps]:
        if chosen and total + bars[s] > max_bars:
            break
        chosen.append(s)
        total += bars[s]
    note = "" if len(chosen) == len(all_steps) else f" · first {len(chosen)} of {len(all_steps)} steps shown"
    return chosen, note


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
    """Gantt chart of the compute lanes (one per phase: prefill / decode / draft / verify) and the host→device
    copy lane. Copies are coloured prefetch vs demand and labelled layer/expert (bytes and reason on hover);
    red bars mark stalls, the time a compute op waited on a copy ([start − stall, start] on its lane).
    ``step=None`` draws the whole run, capped to the first ``max_steps`` steps / ``max_bars`` bars."""
    f = _frames(result)
    meta = _meta(result)
    shown, note = _timeline_steps(f, step, max_steps, max_bars)
    co_all, tr_all = f["compute"], f["transfers"]
    if "lane" in co_all:  # host execution: host spans get the host lane, whatever phase they served
        co_all = co_all.assign(phase=co_all.phase.mask(co_all.lane == "host", HOST_LANE))
    co = co_all[co_all.step.isin(shown)]
    tr = tr_all[tr_all.step.isin(shown)]
    # Lanes and traces come from the whole run, so every step's figure has the same traces (see module doc).
    phases = [p for p in _PHASE_ORDER if p in set(co_all.phase)] + sorted(set(co_all.phase) - set(_PHASE_ORDER))
    lanes = [p for p in phases if p in set(co.phase)] + [COPY_LANE]  # drawn lanes: only those with bars here

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
    for reason in ("prefetch", "demand"):
        d = tr[tr.reason == reason]
        hover = [f"H2D copy ({reason}) · layer {r.layer} · expert {r.expert} → slot {r.slot}<br>"
                 f"{int(r.bytes):,} B · {r.start:.4f} – {r.end:.4f} ms (step {r.step})" for r in d.itertuples()]
        traces.append(go.Bar(
            y=[COPY_LANE] * len(d), x=(d.end - d.start).to_numpy(), base=d.start.to_numpy(), orientation="h",
            name=f"copy: {reason}", marker=dict(color=COPY_COLORS[reason],
                                                line=dict(color="white", width=1.5 * outline)),
            text=[f"L{r.layer}·E{r.expert}" for r in d.itertuples()], textposition="inside",
            insidetextanchor="middle", textfont=dict(color="white", size=10), hovertext=hover,
            hovertemplate="%{hovertext}<extra></extra>", width=0.6, legendgroup="copy"))
    st = co[co.stall > 0]
    traces.append(go.Bar(
        y=st.phase.tolist(), x=st.stall.to_numpy(), base=(st.start - st.stall).to_numpy(), orientation="h",
        name="stall (waiting on a copy)", marker=dict(color=STALL_COLOR, line=dict(width=0)), width=0.9,
        opacity=0.85,
        hovertext=[f"stall {r.stall:.4f} ms before {r.phase} layer {r.layer} expert {r.expert} (step {r.step})"
                   for r in st.itertuples()], hovertemplate="%{hovertext}<extra></extra>"))
    fig = go.Figure(traces)

    steps = f["steps"][f["steps"].step.isin(shown)]
    # Step boundaries as thin lines, labelled while there are few enough to read.
    shapes, annotations = [], []
    if step is None and len(steps) > 1:
        every = max(1, math.ceil(len(steps) / 16))
        for i, r in enumerate(steps.itertuples()):
            shapes.append(dict(type="line", x0=r.start, x1=r.start, yref="paper", y0=0, y1=1,
                               line=dict(color="#bbb", width=1, dash="dot")))
            if i % every == 0:
                annotations.append(dict(x=r.start, y=1.0, yref="paper", text=f"step {r.step}", showarrow=False,
                                        xanchor="left", yanchor="bottom", font=dict(size=10, color="#777")))
    stall_ms = float(co.stall.sum())
    where = f"step {shown[0]} ({steps.kind.iloc[0]})" if step is not None and len(steps) else "whole run"
    title = (f"Timeline · {where}{note} · {len(tr)} copies ({int(tr.bytes.sum()):,} B), stalls {stall_ms:.3f} ms"
             f"<br><sup>strategy {_esc(meta.get('strategy', '?'))} · clock {_esc(clock_label(meta))}</sup>")
    _base_layout(fig, title, plot_height=46 * len(lanes), legend="below", left=90, legend_rows=2,
                 top=82 if annotations else 64)  # room for the step labels
    x0 = float(steps.start.min()) if len(steps) else 0.0
    x1 = float(max(steps.end.max() if len(steps) else 0.0, tr.end.max() if len(tr) else 0.0, x0 + 1e-6))
    pad = 0.01 * (x1 - x0)
    fig.update_layout(barmode="overlay", shapes=shapes, annotations=annotations,
                      uniformtext=dict(minsize=8, mode="hide"))
    fig.update_xaxes(title_text=f"time (ms), {clock_label(meta)}", range=[x0 - pad, x1 + pad], zeroline=False)
    fig.update_yaxes(categoryorder="array", categoryarray=lanes, autorange="reversed", type="category")
    return fig


# ----------------------------------------------------------------------------------------- tokens
def _token_text(token_id: int, tokenizer: Any) -> str:
    if token_id < 0:  # a rejected draft seen only by count (live view)
        return "?"
    if tokenizer is None:
        return str(int(token_id))
    s = tokenizer.decode([int(token_id)])
    s = s.replace("\n", "↵").replace("\t", "⇥").replace(" ", "·") or "∅"
    return _esc(s)


def _token_rows(tok: pd.DataFrame, kinds: Mapping[int, str], wrap: int) -> pd.DataFrame:
    """Place each token on a (row, column): one row per window for speculative runs (committed tokens first,
    then the rejected drafts), otherwise the tokens in index order wrapped ``wrap`` to a row."""
    tok = tok.copy()
    tok["rejected"] = tok.status == "rejected"
    tok = tok.sort_values(["step", "rejected", "index"], kind="stable").reset_index(drop=True)
    windows = any(k == "window" for k in kinds.values()) or (tok.status == "accepted").any() or tok.rejected.any()
    if windows:
        tok["row"] = tok.step.rank(method="dense").astype(int) - 1
        tok["col"] = tok.groupby("step").cumcount()
        labels = {r: f"step {s}" for r, s in zip(tok.row, tok.step)}
    else:
        tok["row"] = np.arange(len(tok)) // wrap
        tok["col"] = np.arange(len(tok)) % wrap
        labels = {r: f"tokens {r * wrap}–{min((r + 1) * wrap, len(tok)) - 1}" for r in tok.row.unique()}
    tok["row_label"] = tok.row.map(labels)
    return tok


def tokens_figure(result: Any, tokenizer: Any = None, highlight_step: int | None = None, wrap: int = 16,
                  max_rows: int = 60) -> go.Figure:
    """The generated tokens as a strip of cells coloured by status: prefill / decode for plain decoding,
    accepted / corrected / bonus / rejected for speculative windows (one row per window, the rejected drafts after
    the committed tokens). Cell text is the decoded token if a tokenizer is given, else the id.

    ``result`` may also be a bare tokens DataFrame (the live view builds one while generating).
    ``highlight_step`` frames that step's tokens and dims every later step, so a step slider shows the text as it
    stood after that step."""
    if isinstance(result, pd.DataFrame):
        tok, kinds = result, {}
    else:
        f = _frames(result)
        tok = f["tokens"]
        kinds = dict(zip(f["steps"].step, f["steps"].kind))
    placed = _token_rows(tok, kinds, wrap) if len(tok) else tok.assign(row=[], col=[], row_label=[])
    truncated = len(placed) and placed.row.max() >= max_rows
    if truncated:
        placed = placed[placed.row < max_rows]
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
            text=[_token_text(t, tokenizer) for t in d.token_id], textposition="inside", insidetextanchor="middle",
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
             + (f" · first {max_rows} rows shown" if truncated else "")
             + ("" if tokenizer is not None else "<br><sup>token ids (no tokenizer)</sup>"))
    _base_layout(fig, title, plot_height=max(40, 30 * len(rows)), top=62, left=90)
    fig.update_layout(barmode="overlay", bargap=0.1, uniformtext=dict(minsize=7, mode="hide"), margin=dict(b=15),
                      shapes=_step_frames(placed, rows, highlight_step))
    fig.update_xaxes(visible=False, range=[-0.6, max(n_cols, 4) - 0.4])
    fig.update_yaxes(categoryorder="array", categoryarray=rows, autorange="reversed", type="category",
                     showgrid=False)
    return fig


def _step_frames(placed: pd.DataFrame, rows: list[str], step: int | None) -> list[dict]:
    """Rectangles around the cells of ``step``, one per strip row it occupies (a marker outline would also
    outline the legend swatch)."""
    if step is None or not len(placed):
        return []
    cur = placed[placed.step == step]
    shapes = []
    for label, d in cur.groupby("row_label", sort=False):
        i = rows.index(label)
        shapes.append(dict(type="rect", xref="x", yref="y", x0=float(d.col.min()) - 0.52, x1=float(d.col.max()) + 0.52,
                           y0=i - 0.5, y1=i + 0.5, line=dict(color="#111", width=2), fillcolor="rgba(0,0,0,0)"))
    return shapes


def steps_figure(result: Any) -> go.Figure:
    """Tokens per step: accepted drafts, the target's own token (corrected / bonus, or the decode token) and the
    rejected drafts, stacked. ``result`` may be a bare steps DataFrame (step, kind, drafted, accepted, committed)."""
    st = result if isinstance(result, pd.DataFrame) else _frames(result)["steps"]
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
    _base_layout(fig, f"Tokens per step · {len(st)} steps, {committed} tokens{acc}", plot_height=170, top=50)
    fig.update_layout(barmode="stack", bargap=0.2)
    fig.update_xaxes(title_text="step", dtick=1 if len(st) <= 30 else None)
    top = float((st.committed + rejected).max()) if len(st) else 1.0
    fig.update_yaxes(title_text="tokens", range=[0, max(top, 1.0) * 1.08])
    return fig


# ----------------------------------------------------------------------------------------- benchmark tables
def _table_clock(df: pd.DataFrame) -> str:
    """'simulated' / 'measured (CUDA)' and 'projected as X' from a compare table's clock/projected/cost_shape."""
    clocks = set(str(c) for c in df.get("clock", pd.Series(dtype=str)).dropna())
    if clocks and all(c.startswith("simulated") for c in clocks):
        label = "simulated"
    elif clocks and not any(c.startswith("simulated") for c in clocks):
        label = "measured (CUDA)"
    elif clocks:
        label = "simulated and measured mixed"
    else:
        label = "clock unknown"
    projected = df["projected"].map(lambda v: bool(v) if pd.notna(v) else False) if "projected" in df else None
    if projected is not None and projected.any():
        shapes = sorted(set(str(s) for s in df.loc[projected, "cost_shape"].dropna())) if "cost_shape" in df else []
        label += f", projected as {', '.join(shapes) or '?'}"
    return label


def _strategy_order(names: Iterable[str]) -> list[str]:
    from ..strategies import STRATEGIES

    names = list(dict.fromkeys(names))
    known = [s for s in STRATEGIES if s in names]
    return known + [s for s in names if s not in known]


_HW_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def compare_figure(df: pd.DataFrame) -> go.Figure:
    """Mean TPOT per strategy (bars grouped by hardware profile, error bars = spread over prompts), one panel per
    expert budget when the table has several. The title says whether the times are simulated / projected."""
    if df.empty:
        raise ValueError("compare_figure: the table is empty")
    budgets = list(dict.fromkeys(df.expert_budget)) if "expert_budget" in df else [None]
    hws = list(dict.fromkeys(df.hardware)) if "hardware" in df else ["?"]
    order = _strategy_order(df.strategy)
    fig = make_subplots(rows=1, cols=len(budgets), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"expert budget {b}" for b in budgets] if len(budgets) > 1 else None)
    for ci, b in enumerate(budgets, start=1):
        sub = df if b is None else df[df.expert_budget == b]
        for hi, hw in enumerate(hws):
            d = sub[sub.hardware == hw] if "hardware" in sub else sub
            g = d.groupby("strategy")["tpot_ms"].agg(["mean", "std", "count"]).reindex(order)
            err = g["std"].where(g["count"] > 1)
            fig.add_trace(go.Bar(
                x=order, y=g["mean"], name=str(hw), legendgroup=str(hw), showlegend=ci == 1,
                marker_color=_HW_COLORS[hi % len(_HW_COLORS)],
                error_y=dict(type="data", array=err.fillna(0).to_numpy(), visible=bool(err.notna().any()),
                             thickness=1, width=3),
                text=[f"{v:.2f}" if pd.notna(v) else "" for v in g["mean"]], textposition="outside",
                textfont=dict(size=10), cliponaxis=False,
                hovertemplate=f"{hw}<br>%{{x}}: %{{y:.3f}} ms/token<extra></extra>"), 1, ci)
    n_prompts = df.prompt.nunique() if "prompt" in df else 1
    title = (f"TPOT by strategy · {_table_clock(df)}"
             f"<br><sup>mean over {n_prompts} prompt{'s' if n_prompts != 1 else ''}; lower is better</sup>")
    _base_layout(fig, title, plot_height=280, legend="right", top=88)
    fig.update_layout(barmode="group", legend_title_text="hardware", margin=dict(b=90))
    fig.update_yaxes(title_text=f"TPOT (ms, {_table_clock(df).split(',')[0]})", row=1, col=1, rangemode="tozero")
    fig.update_xaxes(tickangle=-30)
    return fig


_METRIC_TITLES = {"routing_recall": "routing recall", "token_agreement": "token agreement",
                  "acceptance_rate": "acceptance rate"}
_GROUP_COLORS = {32: "#1f77b4", 64: "#ff7f0e", 128: "#2ca02c"}
_METHOD_DASH = {"rtn": "solid", "hqq": "dash"}


def fidelity_figure(df: pd.DataFrame) -> go.Figure:
    """How well the quantized draft imitates the target against bits: one panel each for routing recall, token
    agreement and (when measured) acceptance; one line per group size (colour) and method (dash)."""
    if df.empty:
        raise ValueError("fidelity_figure: the table is empty")
    metrics = [m for m in _METRIC_TITLES if m in df and df[m].notna().any()]
    fig = make_subplots(rows=1, cols=len(metrics), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[_METRIC_TITLES[m] for m in metrics])
    extra = [c for c in ("draft_bytes", "rel_error") if c in df]
    palette = iter(_HW_COLORS)
    colors = {g: _GROUP_COLORS.get(g) or next(palette) for g in sorted(df.group_size.unique())}
    for ci, m in enumerate(metrics, start=1):
        for (_, method, g), d in (df.assign(_m=df.method.map({"rtn": 0, "hqq": 1}).fillna(2)).sort_values("bits")
                                  .groupby(["_m", "method", "group_size"], sort=True)):
            custom = d[extra].to_numpy() if extra else None
            extra_hover = "".join(f"<br>{c.replace('_', ' ')} %{{customdata[{i}]:,.4g}}" for i, c in enumerate(extra))
            fig.add_trace(go.Scatter(
                x=d.bits, y=d[m], mode="lines+markers", name=f"{method} g{g}", legendgroup=f"{method} g{g}",
                showlegend=ci == 1, line=dict(color=colors[g], dash=_METHOD_DASH.get(method, "dot"), width=2),
                marker=dict(size=7, symbol="circle" if method == "rtn" else "square"), customdata=custom,
                hovertemplate=f"{method} g{g} · %{{x}} bits<br>{_METRIC_TITLES[m]} %{{y:.3f}}{extra_hover}"
                              "<extra></extra>"), 1, ci)
    bits = sorted(df.bits.unique())
    fig.update_xaxes(title_text="bits", tickvals=bits, ticktext=[str(b) for b in bits])
    fig.update_yaxes(range=[0, 1.03], tickformat=".0%")
    fig.update_yaxes(title_text="fraction", row=1, col=1)
    _base_layout(fig, "Draft fidelity by quantization<br><sup>colour = group size, dash = method "
                      "(solid rtn, dashed hqq)</sup>", plot_height=240, legend="below", top=100)
    return fig


def speedup_figure(df: pd.DataFrame, target: str = "specter") -> go.Figure:
    """Speedup of ``target`` over each other strategy (baseline TPOT / target TPOT, same prompts and budget), one
    bar group per (hardware, budget). Bars above the 1× line are wins; the ``oracle`` bar shows the headroom."""
    mean = df.groupby(["hardware", "expert_budget", "strategy"], sort=False)["tpot_ms"].mean().unstack("strategy")
    if target not in mean:
        raise ValueError(f"speedup_figure: no {target!r} rows in the table")
    groups = [f"{h} · {b}" for h, b in mean.index]
    fig = go.Figure()
    for i, s_ in enumerate(c for c in _strategy_order(mean.columns) if c != target):
        sp = mean[s_] / mean[target]
        fig.add_trace(go.Bar(x=groups, y=sp, name=s_, marker_color=_HW_COLORS[i % len(_HW_COLORS)],
                             text=[f"{v:.2f}×" for v in sp], textposition="outside", textfont=dict(size=9),
                             cliponaxis=False,
                             hovertemplate=f"{s_} TPOT / {target} TPOT = %{{y:.3f}}×<extra>%{{x}}</extra>"))
    fig.add_hline(y=1.0, line=dict(color="#444", dash="dash", width=1))
    _base_layout(fig, f"Speedup of {target} over each strategy · {_table_clock(df)}<br><sup>TPOT of the other / "
                      f"TPOT of {target}; above 1× {target} is faster (oracle below 1× = headroom to the bound)</sup>",
                 plot_height=300, legend="right", top=88)
    fig.update_layout(barmode="group", legend_title_text="against")
    fig.update_yaxes(title_text="speedup (×)", rangemode="tozero")
    fig.update_xaxes(title_text="hardware · expert budget")
    return fig


def cost_figure(df: pd.DataFrame) -> go.Figure:
    """Where the time goes: stall (ms waiting on copies) and host→device MB per token, per strategy."""
    mean = df.groupby(["strategy"], sort=False)[["stall_ms_per_token", "h2d_bytes_per_token"]].mean()
    order = _strategy_order(mean.index)
    mean = mean.reindex(order)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("stall per token (ms)", "host→device per token (MB)"),
                        horizontal_spacing=0.1)
    fig.add_trace(go.Bar(x=order, y=mean.stall_ms_per_token, marker_color=STALL_COLOR, showlegend=False,
                         hovertemplate="%{x}: %{y:.3f} ms<extra></extra>"), 1, 1)
    fig.add_trace(go.Bar(x=order, y=mean.h2d_bytes_per_token / 1e6, marker_color=COPY_COLORS["demand"],
                         showlegend=False, hovertemplate="%{x}: %{y:.2f} MB<extra></extra>"), 1, 2)
    _base_layout(fig, f"Stalls and transfers · {_table_clock(df)}<br><sup>mean over hardware, budgets and "
                      "prompts</sup>", plot_height=260, legend="right", top=88)
    fig.update_xaxes(tickangle=-30)
    return fig


def regime_figure(df: pd.DataFrame) -> go.Figure:
    """Where each wins: speedup over the best baseline (≥ 1 wins) of faithful ``specter`` (top row) and ``auto``
    (bottom row), per expert budget (x) and hardware profile (y), one column per cost shape. Green wins, red
    loses; each cell says the number and, for ``auto``, what the planner chose."""
    shapes = list(dict.fromkeys(df.cost_shape))
    fig = make_subplots(rows=2, cols=len(shapes), shared_xaxes=True, shared_yaxes=True, vertical_spacing=0.12,
                        horizontal_spacing=0.05,
                        subplot_titles=[f"specter · {c}" for c in shapes] + [f"auto · {c}" for c in shapes])
    budgets = sorted(df.expert_budget.unique())
    hws = list(dict.fromkeys(df.hardware))
    # log2 colour scale centred on 1×: as far red for 0.5× as green for 2×
    scale = [[0.0, "#b2182b"], [0.5, "#f7f7f7"], [1.0, "#1b7837"]]
    for ci, c in enumerate(shapes, start=1):
        sub = df[df.cost_shape == c]
        for ri, col in enumerate(("speedup_specter", "speedup_auto"), start=1):
            z = sub.pivot_table(index="hardware", columns="expert_budget", values=col).reindex(index=hws, columns=budgets)
            text = z.map(lambda v: "" if pd.isna(v) else f"{v:.2f}×")
            if col == "speedup_auto" and "auto_choice" in sub:
                ch = sub.pivot_table(index="hardware", columns="expert_budget", values="auto_choice",
                                     aggfunc="first").reindex(index=hws, columns=budgets)
                text = text + "<br>" + ch.fillna("").astype(str).map(lambda s: s.replace("spec ", ""))
            fig.add_trace(go.Heatmap(
                z=np.log2(z.to_numpy(dtype=float)), x=[str(b) for b in budgets], y=hws, text=text.to_numpy(),
                texttemplate="%{text}", textfont=dict(size=10), zmin=-1, zmax=1, colorscale=scale,
                showscale=ci == 1 and ri == 1, colorbar=dict(title="speedup", tickvals=[-1, 0, 1],
                                                              ticktext=["0.5×", "1×", "2×"]),
                hovertemplate="budget %{x}<br>%{y}<br>%{text}<extra></extra>"), ri, ci)
    fig.update_xaxes(title_text="expert budget (fraction of routed-expert bytes)", row=2)
    projected = "projected, " if df.cost_shape.notna().any() else ""
    _base_layout(fig, f"Speedup over the best baseline ({projected}simulated)<br><sup>best of on_demand, lru, "
                      "gate_lookahead, spec_lru, specmoeoff at the same budget; above 1× wins</sup>",
                 plot_height=170 * 2, legend="right", top=95)
    return fig


def tuner_figure(table: pd.DataFrame | None, clock: str = "simulated") -> go.Figure:
    """The QuantTuner's chart: TPOT per strategy (left) and the speculative strategies' routing recall and
    acceptance (right). Always three traces, so a live widget can update them in place."""
    t = table if table is not None and len(table) else pd.DataFrame(
        columns=["strategy", "tpot_ms", "recall", "acceptance_rate"])
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=(f"TPOT in ms · {clock}", "draft quality"))
    colors = ["#d62728" if s == "specter" else "#7f7f7f" for s in t.strategy]
    fig.add_trace(go.Bar(x=t.strategy, y=t.tpot_ms, marker_color=colors, name="TPOT",
                         text=[f"{v:.3f}" if pd.notna(v) else "n/a" for v in t.tpot_ms], textposition="outside",
                         cliponaxis=False, showlegend=False,
                         hovertemplate="%{x}: %{y:.4f} ms/token<extra></extra>"), 1, 1)
    spec = t[t.recall.notna() | t.acceptance_rate.notna()] if len(t) else t
    fig.add_trace(go.Bar(x=spec.strategy, y=spec.recall, name="routing recall", marker_color="#2ca02c",
                         hovertemplate="%{x}: recall %{y:.0%}<extra></extra>"), 1, 2)
    fig.add_trace(go.Bar(x=spec.strategy, y=spec.acceptance_rate, name="acceptance", marker_color="#1f77b4",
                         hovertemplate="%{x}: acceptance %{y:.0%}<extra></extra>"), 1, 2)
    _base_layout(fig, "Quantized draft vs baselines at equal device memory", plot_height=220, legend="below",
                 top=62)
    fig.update_layout(barmode="group", legend=dict(x=1.0, xanchor="right"))
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=2)
    return fig


# ----------------------------------------------------------------------------------------- HTML
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
        rows = "".join(f"<tr><th>{_esc(k)}</th><td class='v'>{_esc(_fmt_value(v))}</td></tr>"
                       for k, v in items[i:i + per])
        tables.append(f"<table class='metrics'>{rows}</table>")
    return f"<div style='display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start'>{''.join(tables)}</div>"


def _figures_html(figs: Iterable[tuple[str, go.Figure]]) -> str:
    """Figures as HTML fragments; plotly.js is inlined once (the first figure) so the page works offline."""
    out = []
    for i, (heading, fig) in enumerate(figs):
        out.append(f"<h2>{_esc(heading)}</h2>")
        out.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False}))
    return "\n".join(out)


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>")


def report_html(result: Any, tokenizer: Any = None) -> str:
    """A standalone HTML report of one run: settings, metrics table and the token, step, routing, cache and
    timeline figures (plotly.js inline once, so the file opens offline)."""
    meta = _meta(result)
    metrics = dict(getattr(result, "metrics", {}) or {})
    strategy = getattr(result, "strategy", meta.get("strategy", "?"))
    text = getattr(result, "text", None)
    ids = getattr(result, "token_ids", None)
    figs: list[tuple[str, go.Figure]] = [("Tokens", tokens_figure(result, tokenizer)), ("Steps", steps_figure(result))]
    frames = _frames(result)
    if len(frames["routing"]):
        figs.append(("Routing vs forecast", routing_figure(result)))
    figs += [("Expert cache", cache_figure(result)), ("Timeline", timeline_figure(result))]
    output = text if text is not None else (" ".join(str(t) for t in ids) if ids is not None else "")
    body = (f"<h1>specter_lab run · strategy {_esc(strategy)}</h1>"
            f"<p class='note'>clock: {_esc(meta.get('clock', '?'))} — times are {_esc(clock_label(meta))}. "
            f"{len(ids) if ids is not None else '?'} new tokens; model: {_esc(meta.get('num_layers', '?'))} MoE layers "
            f"× {_esc(meta.get('num_experts', '?'))} experts, top-{_esc(meta.get('top_k', '?'))}.</p>"
            f"<h2>Output</h2><pre>{_esc(output)}</pre>"
            f"<h2>Metrics</h2>{_metrics_table(metrics)}" + _figures_html(figs))
    return _page(f"specter_lab · {strategy}", body)


def _df_html(df: pd.DataFrame) -> str:
    return df.to_html(index=False, classes="metrics", float_format=lambda v: f"{v:.4g}", border=0)


def bench_html(df: pd.DataFrame, summary: pd.DataFrame | None = None, info: Mapping[str, Any] | None = None) -> str:
    """A standalone HTML report of ``sl.compare``: the TPOT figure, the speedup summary, any extra tables in
    ``info`` (ablations, k_sweep, cpu_overhead, regimes: lists of records) and every run."""
    info = dict(info or {})
    body = [f"<h1>specter_lab benchmark</h1><p class='note'>{_esc(info.get('note', _table_clock(df)))}"
            + (f" · model {_esc(info['model'])}" if "model" in info else "")
            + (f" · draft {_esc(info['draft'])}" if "draft" in info else "") + "</p>"]
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
