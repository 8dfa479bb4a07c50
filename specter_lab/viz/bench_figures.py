"""Plotly figures of benchmark tables: ``compare``, ``fidelity``, speedups, the cost model, the regime map and the
QuantTuner's chart. Pure functions from a DataFrame to a ``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .layout import base_layout
from .style import COPY_COLORS, STALL_COLOR

__all__ = ["compare_figure", "fidelity_figure", "speedup_figure", "cost_figure", "regime_figure", "tuner_figure",
           "table_clock", "waterfall_figure"]


def table_clock(df: pd.DataFrame) -> str:
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
    from ..run.strategies import strategy_names

    names = list(dict.fromkeys(names))
    known = [s for s in strategy_names() if s in names]
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
                # The value at the bar's base, across it: clear of the error bar's whisker (which crosses the top)
                # and at a legible size however narrow the bars get.
                text=[f"{v:.2f}" if pd.notna(v) else "" for v in g["mean"]], textposition="inside",
                insidetextanchor="start", textangle=-90, textfont=dict(size=10, color="white"),
                hovertemplate=f"{hw}<br>%{{x}}: %{{y:.3f}} ms/token<extra></extra>"), 1, ci)
    n_prompts = df.prompt.nunique() if "prompt" in df else 1
    title = (f"TPOT by strategy · {table_clock(df)}"
             f"<br><sup>mean over {n_prompts} prompt{'s' if n_prompts != 1 else ''}; lower is better"
             + (f" · whiskers: ± one standard deviation over the {n_prompts} prompts" if n_prompts > 1 else "")
             + "</sup>")
    base_layout(fig, title, plot_height=280, legend="right", top=72)
    fig.update_layout(barmode="group", legend_title_text="hardware", margin=dict(b=90),
                      uniformtext=dict(minsize=10, mode="show"))
    fig.update_yaxes(title_text=f"TPOT (ms, {table_clock(df).split(',')[0]})", row=1, col=1, rangemode="tozero")
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
    base_layout(fig, "Draft fidelity by quantization<br><sup>colour = group size, dash = method "
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
    base_layout(fig, f"Speedup of {target} over each strategy · {table_clock(df)}<br><sup>TPOT of the other / "
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
    base_layout(fig, f"Stalls and transfers · {table_clock(df)}<br><sup>mean over hardware, budgets and "
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
    base_layout(fig, f"Speedup over the best baseline ({projected}simulated)<br><sup>best of on_demand, lru, "
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
    base_layout(fig, "Quantized draft vs baselines at equal device memory", plot_height=220, legend="below",
                 top=62)
    fig.update_layout(barmode="group", legend=dict(x=1.0, xanchor="right"))
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=2)
    return fig


def waterfall_figure(df: pd.DataFrame, claim: tuple[float, float] = (1.50, 1.88)) -> go.Figure:
    """What Specter's speedup over the artifact's Mixtral-Offloading is made of (``sl.bench.paper_waterfall``):
    the headline under the artifact's protocol, then one bar per difference switched off (its change in
    speedup), a total where only the method is left (Specter against lean LRU at equal memory), the change from
    dropping its prefetch, and what speculation alone gives. Dashed lines: 1× and the paper's mean / max."""
    if df.empty:
        raise ValueError("waterfall_figure: the table is empty")
    s = df.speedup.tolist()
    x = list(df.step)
    measure = ["absolute"] + ["relative"] * (len(s) - 1)
    y = [s[0]] + [b - a for a, b in zip(s, s[1:])]
    # a running total where only the method is left (after 'memory split'), and at the end
    split = next((i for i, t in enumerate(df.step) if t.startswith("memory split")), None)
    if split is not None:
        x.insert(split + 1, "specter vs lean LRU, equal memory")
        measure.insert(split + 1, "total")
        y.insert(split + 1, 0.0)
    x.append("speculation alone (no prefetch)")
    measure.append("total")
    y.append(0.0)
    # Drawn as floating bars (a bar's base is the running total before it), not as plotly's waterfall trace: that
    # one is not in the light plotly.js the notebooks load (viz/panel.py, issue 55).
    ends = _running_totals(y, measure)
    starts = [0.0 if m != "relative" else (ends[i - 1] if i else 0.0) for i, m in enumerate(measure)]
    heights = [e - b for b, e in zip(starts, ends)]
    colors = ["#4d4d4d" if m != "relative" else ("#1b7837" if v >= 0 else "#b2182b") for v, m in zip(y, measure)]
    fig = go.Figure(go.Bar(
        x=x, y=heights, base=starts, marker=dict(color=colors), cliponaxis=False,
        # A relative bar's height is the change in speedup; its label is the factor that step multiplies the
        # speedup by (the table's ``factor`` column), so figure and table read the same. A total's label sits
        # inside its bar: above it, a total near 1× put its label on the dashed 1× line (E15).
        text=_labels(y, measure), textposition=["inside" if m != "relative" else "outside" for m in measure],
        insidetextanchor="end", textfont=dict(size=11), customdata=[[m, e] for m, e in zip(measure, ends)],
        hovertemplate="%{x}<br>speedup %{customdata[1]:.3f}<extra></extra>", showlegend=False))
    for i in range(len(x) - 1):  # connectors: each bar's end level to the next bar
        fig.add_shape(type="line", x0=i + 0.4, x1=i + 0.6, y0=ends[i], y1=ends[i], line=dict(color="#999", width=1))
    fig.add_hline(y=1.0, line=dict(color="#444", dash="dash", width=1))
    for v, name in zip(claim, ("paper mean", "paper max")):
        fig.add_hline(y=v, line=dict(color="#2166ac", dash="dot", width=1), annotation_text=f"{name} {v:.2f}×",
                      annotation_position="top right", annotation_font=dict(size=10, color="#2166ac"))
    a = df.attrs
    sub = (f"{a.get('case', '?')} · {a.get('profile', '?')} {a.get('execution', '')} · simulated, projected "
           "(routing of the run model) · one difference off at a time, in this order<br>bar: the change in speedup "
           "· label: the factor it multiplies the speedup by")
    base_layout(fig, f"What Specter's speedup over the artifact's Mixtral-Offloading is made of<br><sup>{sub}"
                      "</sup>", plot_height=320, legend="right", top=110)
    fig.update_yaxes(title_text="speedup of specter (×)", rangemode="tozero")
    fig.update_xaxes(tickangle=-25, tickfont=dict(size=10))
    fig.update_layout(showlegend=False)
    return fig


def _labels(y: list[float], measure: list[str]) -> list[str]:
    """Bar labels: the speedup for an absolute or total bar, the factor (after / before) for a relative one."""
    out, total = [], 0.0
    for v, m in zip(y, measure):
        if m == "relative":
            out.append(f"×{(total + v) / total:.2f}" if total else f"{v:+.2f}")
            total += v
        else:
            total = v if m == "absolute" else total
            out.append(f"{total:.2f}×")
    return out


def _running_totals(y: list[float], measure: list[str]) -> list[float]:
    """The speedup where each bar ends: the running total after it."""
    out, total = [], 0.0
    for v, m in zip(y, measure):
        total = v if m == "absolute" else total + (v if m == "relative" else 0.0)
        out.append(total)
    return out
