"""Notebook views: figures built from real (tiny) runs checked against sets computed here from the frames, the
widgets driven headless (no kernel), the live view stopped mid-run, and the HTML report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

import specter_lab as sl
from specter_lab import viz
from specter_lab.viz import figures as F
from specter_lab.viz.panel import FigurePanel, plain_figure
from specter_lab.viz.widgets import plain_text

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def spec_run(model):
    # A 2-bit draft disagrees with the target now and then, so the run has rejected and corrected tokens.
    eng = sl.Engine(model, None, "specter", cache_slots=3, hardware="rtx4090-pcie4", draft=sl.QuantSpec(2, 64))
    return eng.generate(PROMPT, max_new_tokens=16)


@pytest.fixture(scope="module")
def lru_run(model):
    return sl.Engine(model, None, "lru", cache_slots=3, hardware="rtx4090-pcie4").generate(PROMPT, max_new_tokens=16)


def _xs(trace) -> list:
    return [] if trace.x is None else list(trace.x)


def _by_name(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_import_needs_no_ipywidgets():
    code = ("import sys, specter_lab.viz as v; assert 'ipywidgets' not in sys.modules; v.timeline_figure; "
            "assert 'ipywidgets' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# ----------------------------------------------------------------------------------------- routing
def test_routing_cells_match_forecast_and_target_sets(spec_run):
    f = spec_run.frames()
    tgt = f["routing"][f["routing"].source == "target"]
    widest = tgt[tgt.step >= 1].groupby("step").size()
    assert F.default_routing_step(f) == int(widest.idxmax())
    for step in sorted(set(f["forecast"].step)):
        pred = set(map(tuple, f["forecast"].loc[f["forecast"].step == step, ["layer", "expert"]].to_numpy()))
        used = set(map(tuple, tgt.loc[tgt.step == step, ["layer", "expert"]].to_numpy()))
        fig = viz.routing_figure(spec_run, step=step)
        z = fig.data[0].z
        meta = spec_run.trace.meta
        assert len(z) == meta["num_layers"] and len(z[0]) == meta["num_experts"]
        got = {cat: set() for cat in F.ROUTING_CATEGORIES}
        for layer, row in enumerate(z):
            for expert, code in enumerate(row):
                got[F.ROUTING_CATEGORIES[int(code)]].add((layer, expert))
        assert got["predicted & used"] == pred & used
        assert got["predicted, not used"] == pred - used
        assert got["used, not predicted"] == used - pred
        assert len(got["neither"]) == meta["num_layers"] * meta["num_experts"] - len(pred | used)
        assert f"step {step}" in fig.layout.title.text
    # One legend entry per category, in its colour.
    legend = {t.name: t.marker.color for t in fig.data[1:]}
    assert legend == F.ROUTING_COLORS
    # Hover names the token positions that chose an expert.
    layer, expert, pos = tgt[tgt.step == step].iloc[0][["layer", "expert", "position"]]
    assert f"{pos}" in fig.data[0].hovertext[layer][expert].split("positions:")[1]


def test_routing_without_forecast_marks_used_experts_as_unpredicted(lru_run):
    fig = viz.routing_figure(lru_run, step=3)
    f = lru_run.frames()
    used = f["routing"].query("source == 'target' and step == 3")[["layer", "expert"]]
    codes = [fig.data[0].z[l][e] for l, e in used.to_numpy()]
    assert codes and set(codes) == {F.ROUTING_CATEGORIES.index("used, not predicted")}
    assert "makes none" in fig.layout.title.text


# ----------------------------------------------------------------------------------------- cache
def _slot_occupants(frames, step):
    """Independent residency: the last copy into each (layer, slot) up to ``step`` (lru/specter only evict to
    make room for a copy, so the slot's last copy is what it holds)."""
    tr = frames["transfers"]
    last = tr[tr.step <= step].groupby(["layer", "slot"]).tail(1)
    return set(map(tuple, last[["layer", "expert"]].to_numpy()))


@pytest.mark.parametrize("which", ["spec_run", "lru_run"])
def test_cache_figure_hit_rates_and_residency(which, request):
    run = request.getfixturevalue(which)
    f = run.frames()
    for step in (0, 1, int(f["steps"].step.max())):
        fig = viz.cache_figure(run, step=step)
        bars = fig.data[0]
        ce = f["cache"]
        for s, y in zip(bars.x, bars.y):
            hits = int(((ce.step == s) & (ce.event == "hit")).sum())
            misses = int(((ce.step == s) & (ce.event == "miss")).sum())
            assert y == pytest.approx(hits / (hits + misses))
        heat = next(t for t in fig.data if t.type == "heatmap")
        resident = {(l, e) for l, row in enumerate(heat.z) for e, c in enumerate(row) if c > 0}
        assert resident == _slot_occupants(f, step)
        assert f"after step {step}" in fig.layout.title.text
    # The coverage line ends at the run's decode hit rate.
    assert _by_name(fig, "coverage (running decode hit rate)").y[-1] == pytest.approx(run.metrics["hit_rate"])


# ----------------------------------------------------------------------------------------- timeline
def test_timeline_one_step_draws_every_copy_span_and_stall(spec_run):
    f = spec_run.frames()
    step = 1
    fig = viz.timeline_figure(spec_run, step=step)
    tr = f["transfers"][f["transfers"].step == step]
    co = f["compute"][f["compute"].step == step]
    copies = [t for t in fig.data if t.name.startswith("copy:")]
    assert sum(len(_xs(t)) for t in copies) == len(tr) > 0
    for reason in ("prefetch", "demand"):
        t = _by_name(fig, f"copy: {reason}")
        assert len(_xs(t)) == int((tr.reason == reason).sum())
        assert t.marker.color == F.COPY_COLORS[reason]
        assert all(y == F.COPY_LANE for y in t.y)
    compute = [t for t in fig.data if t.name.startswith("compute:")]
    assert sum(len(_xs(t)) for t in compute) == len(co)
    assert {t.name for t in compute} == {f"compute: {p}" for p in f["compute"].phase.unique()}
    stalls = _by_name(fig, "stall (waiting on a copy)")
    assert len(_xs(stalls)) == int((co.stall > 0).sum())
    title = fig.layout.xaxis.title.text
    assert "ms" in title and "simulated" in title and "rtx4090-pcie4" in title


def test_timeline_whole_run_is_capped_and_says_so(lru_run):
    f = lru_run.frames()
    full = viz.timeline_figure(lru_run)
    assert sum(len(_xs(t)) for t in full.data if t.name.startswith("copy:")) == len(f["transfers"])
    capped = viz.timeline_figure(lru_run, max_steps=3)
    shown = f["transfers"][f["transfers"].step < 3]
    assert sum(len(_xs(t)) for t in capped.data if t.name.startswith("copy:")) == len(shown)
    assert f"first 3 of {len(f['steps'])} steps" in capped.layout.title.text


def test_clock_label_measured_and_projected():
    assert F.clock_label({"clock": "cuda", "simulated": False}) == "measured (CUDA)"
    assert F.clock_label({"clock": "cuda:NVIDIA H200", "simulated": False}) == "measured (CUDA, NVIDIA H200)"
    label = F.clock_label({"simulated": True, "profile": "t4-pcie3", "projected": True, "cost_shape": "mixtral-8x7b"})
    assert label == "simulated (profile t4-pcie3), projected as mixtral-8x7b"


# ----------------------------------------------------------------------------------------- tokens
def test_token_strip_colours_match_statuses(spec_run):
    tok = spec_run.frames()["tokens"]
    assert {"accepted", "rejected"} <= set(tok.status)  # the 2-bit draft gets some wrong
    fig = viz.tokens_figure(spec_run, highlight_step=1)
    for t in fig.data:
        assert t.marker.color == F.STATUS_COLORS[t.name]
        ids = tok.loc[tok.status == t.name, "token_id"]
        assert Counter(t.text or ()) == Counter(str(i) for i in ids)
    assert sum(len(_xs(t)) for t in fig.data) == len(tok)
    assert len(fig.layout.shapes) == 1  # the highlighted window's row
    # With a tokenizer the cells show decoded text.

    class Tok:
        def decode(self, ids):
            return f"<t{ids[0]}>"

    fig = viz.tokens_figure(spec_run, Tok())
    assert "&lt;t" in _by_name(fig, "accepted").text[0]


def test_steps_figure_counts(spec_run):
    st = spec_run.frames()["steps"]
    fig = viz.steps_figure(spec_run)
    assert list(fig.data[0].y) == list(st.accepted)
    assert sum(fig.data[0].y) + sum(fig.data[1].y) == len(spec_run.token_ids)


# ----------------------------------------------------------------------------------------- tables
def _compare_df(projected=True):
    rows = []
    for b in (0.25, 0.5):
        for hw in ("rtx4090-pcie4", "t4-pcie3"):
            for s in ("lru", "specmoeoff", "specter"):
                for p in range(2):
                    rows.append(dict(strategy=s, hardware=hw, prompt=p, expert_budget=b, tpot_ms=1.0 + p,
                                     acceptance_rate=0.8, recall=0.7, hit_rate=0.6, h2d_bytes_per_token=1e6,
                                     stall_ms_per_token=0.1, clock=f"simulated:{hw}", projected=projected,
                                     cost_shape="deepseek-v2-lite" if projected else None))
    return pd.DataFrame(rows)


def test_compare_figure():
    fig = viz.compare_figure(_compare_df())
    assert len(fig.data) == 4  # 2 hardware × 2 budget panels
    assert {t.name for t in fig.data} == {"rtx4090-pcie4", "t4-pcie3"}
    assert list(fig.data[0].x) == ["lru", "specmoeoff", "specter"]  # strategies in sl.STRATEGIES order
    assert fig.data[0].y[0] == pytest.approx(1.5)  # mean over prompts
    assert "simulated" in fig.layout.title.text and "projected as deepseek-v2-lite" in fig.layout.title.text
    assert {a.text for a in fig.layout.annotations} >= {"expert budget 0.25", "expert budget 0.5"}
    one = _compare_df(projected=False)
    fig = viz.compare_figure(one[one.expert_budget == 0.5])
    assert len(fig.data) == 2 and "projected" not in fig.layout.title.text


def test_fidelity_figure():
    df = pd.DataFrame([dict(bits=b, group_size=g, method=m, routing_recall=0.5 + b / 20, token_agreement=0.4 + b / 20,
                            acceptance_rate=0.3 + b / 20, draft_bytes=b * 1000, rel_error=0.1 / b)
                       for m in ("rtn", "hqq") for b in (2, 3, 4, 8) for g in (32, 64, 128)])
    fig = viz.fidelity_figure(df)
    assert len(fig.data) == 3 * 6  # 3 metrics × (2 methods × 3 group sizes)
    assert list(fig.data[0].x) == [2, 3, 4, 8]
    assert {a.text for a in fig.layout.annotations} == {"routing recall", "token agreement", "acceptance rate"}
    assert sum(bool(t.showlegend) for t in fig.data) == 6
    assert len(viz.fidelity_figure(df.drop(columns="acceptance_rate")).data) == 2 * 6


# ----------------------------------------------------------------------------------------- HTML
def test_to_html_writes_a_standalone_report(spec_run, tmp_path):
    path = spec_run.to_html(tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert str(path).endswith("r.html")
    assert "plotly" in text and "specter" in text
    assert text.count("Plotly.newPlot(") == 5  # tokens, steps, routing, cache, timeline
    assert text.count("plotly.js v") == 1  # the library inlined once
    assert "simulated (profile rtx4090-pcie4)" in text


def test_bench_html_has_the_figure_and_tables():
    from specter_lab.studies.bench import summarize

    df = _compare_df()
    page = viz.bench_html(df, summarize(df), {"note": "simulated clock", "model": "tiny",
                                              "k_sweep": [{"k": "4", "tpot_ms": 1.0}]})
    # TPOT by strategy, speedup of specter over each strategy, stalls and transfers; library inlined once
    assert page.count("plotly.js v") == 1 and page.count("Plotly.newPlot(") == 3
    assert "TPOT by strategy" in page and "K sweep" in page and "speedup_specter" in page
    assert "Speedup of specter" in page and "Stalls and transfers" in page


def test_speedup_and_regime_figures():
    df = _compare_df()
    fig = viz.speedup_figure(df)
    # one bar trace per other strategy; specter vs lru where lru's TPOT equals specter's: exactly 1x
    assert [t.name for t in fig.data] == ["lru", "specmoeoff"]
    assert all(abs(v - 1.0) < 1e-12 for v in fig.data[0].y)
    regimes = pd.DataFrame([dict(cost_shape="deepseek-v2-lite", hardware=h, expert_budget=b, speedup_specter=s,
                                 speedup_auto=1.0, auto_choice="lru")
                            for h in ("rtx4090-pcie4", "t4-pcie3") for b, s in ((0.35, 0.5), (0.5, 2.0))])
    rf = viz.regime_figure(regimes)
    assert len(rf.data) == 2  # specter row and auto row for the one cost shape
    z = rf.data[0].z  # log2 speedups: 0.5x -> -1, 2x -> +1
    assert z[0][0] == -1.0 and z[0][1] == 1.0


def _strip_cells(page: str) -> dict:
    """The token cells of an HTML strip (not its legend): each one's step, and how many are outlined (the shown
    step) or dimmed (later steps)."""
    cells = re.findall(r'<span class="t [a-z]+( now| later)?" title="[^"]*· step (\d+)"', page)
    return {"steps": [int(step) for _, step in cells], "now": sum(w == " now" for w, _ in cells),
            "later": sum(w == " later" for w, _ in cells)}


# ----------------------------------------------------------------------------------------- widgets
def test_dashboard_slider_updates_views_in_place(spec_run):
    d = viz.dashboard(spec_run)
    f = spec_run.frames()
    widgets = (d.routing, d.cache, d.timeline, d.tokens)
    assert all(isinstance(w, FigurePanel) for w in widgets[:3]) and set(d.views) == {"routing", "cache", "timeline"}
    assert _strip_cells(d.tokens.value)["now"] == _strip_cells(d.tokens.value)["steps"].count(d.step) > 0
    first = d.slider.value
    other = 2 if first != 2 else 1
    before = str(d.routing.to_figure().data[0].hovertext)  # names the token positions, which differ per step
    d.slider.value = other
    assert d.step == other and f"step {other}" in d.routing.to_figure().layout.title.text
    assert str(d.routing.to_figure().data[0].hovertext) != before
    tr = f["transfers"][f["transfers"].step == other]
    assert sum(len(_xs(t)) for t in d.timeline.to_figure().data if t.name.startswith("copy:")) == len(tr)
    assert f"after step {other}" in d.cache.to_figure().layout.title.text
    assert f"<b>step {other}</b>" in d.info.value
    # the strip outlines the shown step's cells and dims the later ones
    cells = _strip_cells(d.tokens.value)
    assert cells["now"] == cells["steps"].count(other) > 0 and cells["later"] == sum(s > other for s in cells["steps"])
    # Same widget objects, updated in place.
    assert (d.routing, d.cache, d.timeline, d.tokens) == widgets
    static = d.static()
    assert set(static) == {"tokens", "routing", "cache", "timeline"}
    assert all(isinstance(v, go.Figure) for v in static.values())  # plain figures, not widgets
    assert "application/vnd.jupyter.widget-view+json" in d._repr_mimebundle_()


def test_live_stop_ends_generation_after_the_step(model):
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    reached, release = threading.Event(), threading.Event()

    def hold_first_step(info):
        if info.step == 0:
            reached.set()
            release.wait(30)

    run = viz.live(engine, PROMPT, max_new_tokens=16, callback=hold_first_step)
    assert reached.wait(60)
    run.stop()
    release.set()
    result = run.join(60)
    assert run.done and result is not None
    assert result.metrics["stopped"] is True
    assert len(result.token_ids) < 16
    assert run.stop_button.disabled and "stopped" in run.status.value
    assert run.dashboard is not None and run.dashboard.routing in run.widget.children[-1].children[0].children
    assert run.tokens not in run.widget.children  # the dashboard's strip replaces the live one
    # the dashboard's HTML strip holds the cells the strip figure draws, one per token
    drawn = sum(len(_xs(t)) for t in run.dashboard.static()["tokens"].data)
    assert len(_strip_cells(run.dashboard.tokens.value)["steps"]) == drawn == len(result.token_ids)
    assert set(run.static()) >= {"steps", "dashboard_routing"}
    assert run.progress.value == len(result.token_ids) and run.progress.bar_style == "warning"


def test_live_cell_returns_and_on_done_reports_without_blocking(model):
    """The notebook pattern: the live cell and the on_done cell return at once (the kernel stays free for the
    Stop button); the on_done widget says it waits, then shows what fn returned once the run ended."""
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    release = threading.Event()
    run = viz.live(engine, PROMPT, max_new_tokens=8, callback=lambda info: release.wait(30))
    out = run.on_done(lambda r: f"{len(r.token_ids)} tokens, stopped={r.metrics['stopped']}")
    assert not run.done and "waiting" in out.outputs[0]["text"]
    run.stop()
    release.set()
    run.join(60)
    assert run.done and out.outputs[0]["text"].startswith("1 tokens, stopped=True")
    late = run.on_done(lambda r: 1 / 0)  # after the end: called at once; an error is shown, not raised
    assert late.outputs[0]["name"] == "stderr" and "ZeroDivisionError" in late.outputs[0]["text"]


def test_live_details_names_are_checked(model):
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    with pytest.raises(ValueError, match=r"details=\['routes'\].*'routing'"):
        viz.LiveRun(engine, PROMPT, details=["routes"], start=False)
    assert viz.LiveRun(engine, PROMPT, details="cache", start=False).details == ("cache",)
    assert viz.LiveRun(engine, PROMPT, details=True, start=False).details == ("routing", "cache", "timeline")


def test_live_finish_opens_the_dashboard_where_the_view_was(model):
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    statuses = []
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=10, min_interval=0.0, start=False)
    run.status.observe(lambda ch: statuses.append(plain_text(ch["new"])), names="value")
    run.start()
    result = run.join(60)
    assert run.live_step is not None and run.dashboard.step == run.live_step
    assert f"dashboard at step {run.live_step}" in run.status_text
    # the reader sees "finishing" before the dashboard, never a stale step line after the run ended
    assert any(s.startswith("finishing") for s in statuses), statuses
    assert statuses.index(next(s for s in statuses if s.startswith("finishing"))) == len(statuses) - 2
    assert len(result.token_ids) == 10


def _data_json(fig) -> str:
    """A figure's or a panel's traces as comparable JSON (arrays as lists)."""
    return json.dumps(plain_figure(fig.to_figure() if isinstance(fig, FigurePanel) else fig)["data"], sort_keys=True)


def test_live_details_show_each_step_while_it_runs(model):
    """With min_interval=0 the view redraws after every step, so when step s's callback runs, the routing, cache
    and timeline widgets show step s-1, drawn from the trace so far, exactly as the finished run draws it."""
    engine = sl.Engine(model, None, "specter", cache_slots=3, hardware="rtx4090-pcie4", draft=sl.QuantSpec(2, 64))
    seen: dict[int, dict] = {}
    live_widgets = {}

    def capture(info):
        live_widgets.update(run.views)
        if info.step >= 1 and run.routing is not None:
            seen[info.step] = dict(live_step=run.live_step, routing=_data_json(run.routing),
                                   timeline=_data_json(run.timeline), finished=run.done)

    run = viz.LiveRun(engine, PROMPT, max_new_tokens=12, callback=capture, min_interval=0.0, start=False,
                      details=True)
    assert run.routing is None and run.live_step is None
    run.start()
    result = run.join(120)
    assert seen, "the detail views were never drawn during the run"
    last = max(seen)
    for step, got in seen.items():
        assert got["live_step"] == step - 1 and not got["finished"]
    got = seen[last]
    assert got["routing"] == _data_json(F.routing_figure(result, last - 1))
    assert got["timeline"] == _data_json(F.timeline_figure(result, last - 1))
    assert run.dashboard is not None and run._details_box.children == ()
    # the dashboard redraws the live panels instead of making new ones
    assert all(run.dashboard.views[name] is w for name, w in live_widgets.items()) and len(live_widgets) == 3


def test_snapshot_leaves_the_trace_recording(model):
    from specter_lab.records.trace import Trace

    engine = sl.Engine(model, None, "lru", cache_slots=3)
    sizes = []

    def snap(info):
        frames = info.snapshot()
        sizes.append((len(frames["steps"]), len(frames["routing"])))

    result = engine.generate(PROMPT, max_new_tokens=6, callback=snap)
    assert [n for n, _ in sizes] == list(range(1, len(sizes) + 1))  # one more step each time
    assert all(b[1] > a[1] for a, b in zip(sizes, sizes[1:]))
    assert isinstance(result.trace, Trace) and len(result.trace.frames()["steps"]) == len(sizes)


def test_live_strip_shows_rejected_drafts_as_their_tokens(model):
    """The live token strip draws the trace's own token records: a rejected draft shows the token it was (the
    same text the finished run's strip gives it), never a placeholder; the strip keeps its last rows."""
    engine = sl.Engine(model, None, "specter", cache_slots=3, hardware="rtx4090-pcie4", draft=sl.QuantSpec(2, 64))
    import re

    seen = []
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=40, min_interval=0.0, start=False, live_rows=3,
                      callback=lambda info: seen.append(run.tokens.value))
    run.start()
    result = run.join(120)
    tok = result.frames()["tokens"]
    rejected_ids = {str(t) for t in tok[tok.status == "rejected"].token_id}
    shown = {t for strip in seen for t in re.findall(r'class="t rejected"[^>]*><s>([^<]*)</s>', strip)}
    assert shown and "?" not in shown and shown <= rejected_ids
    assert max(s.count("<span class='l'>") for s in seen) == 3  # live_rows: the last rows only


def test_live_redraw_sends_updates_only(model, monkeypatch):
    """A live redraw sends each figure once, in one message holding only the figure (plotly's FigureWidget sent
    an update, then its whole synced state twice more when the run ended)."""
    import ipywidgets

    sent = []
    orig = ipywidgets.Widget._send
    monkeypatch.setattr(ipywidgets.Widget, "_send",
                        lambda self, msg, buffers=None: (sent.append((self, set(msg.get("state", {})))),
                                                         orig(self, msg, buffers))[1])
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=12, min_interval=0.0, start=False, details=["cache"])
    run.start()
    run.join(60)
    cache = [keys for w, keys in sent if w is run.dashboard.cache]
    figures = [keys for keys in cache if "figure" in keys]
    assert run.redraws >= 5 and len(figures) >= run.redraws - 1
    assert all(keys == {"figure"} for keys in figures), cache


def test_quant_tuner_reruns_on_control_change(model):
    tuner = viz.QuantTuner(model, None, PROMPT, expert_budget=0.5, max_new_tokens=8, baselines=("lru",))
    t4 = tuner.table
    assert list(t4.strategy) == ["specter", "lru"]
    assert t4.loc[0, "draft"] == "int4-g64-rtn" and t4.tpot_ms.notna().all()
    assert "quantized in" in tuner.status.value and "simulated" in tuner.status.value
    y4 = list(tuner.figure.to_figure().data[0].y)
    tuner.bits.value = 2  # observe → run()
    t2 = tuner.table
    assert t2.loc[0, "draft"] == "int2-g64-rtn"
    assert t2.loc[0, "draft_bytes"] < t4.loc[0, "draft_bytes"]
    assert t2.loc[1, "tpot_ms"] == t4.loc[1, "tpot_ms"]  # lru does not depend on the draft (cached)
    assert list(tuner.figure.to_figure().data[0].y) != y4 or t2.loc[0, "recall"] != t4.loc[0, "recall"]
    assert "int2-g64-rtn" in tuner.table_html.value
    tuner.bits.value = 8  # an 8-bit draft leaves no slot at half the budget: reported, not raised
    assert pd.isna(tuner.table.loc[0, "tpot_ms"]) and "too small" in tuner.status.value
    assert type(tuner.static()) is go.Figure
    assert all(hasattr(tuner, w) for w in ("bits", "group_size", "method", "k", "table", "figure"))


# ----------------------------------------------------------------------------------------- widget state
def _plain_of(fig) -> dict:
    return plain_figure(fig)


def test_a_panel_syncs_the_figure_python_holds(spec_run):
    """A new view (a first display inside a box, a second display, a page reload) draws the panel's synced
    ``figure``: after every update it is the figure Python holds, at once (no delayed publish), and an update
    that changes nothing sends nothing."""
    from specter_lab.viz.widgets import sync_figure

    tuner_like = viz.widgets.figure_widget(F.tuner_figure(None))
    table = pd.DataFrame({"strategy": ["specter", "lru"], "tpot_ms": [0.8, 0.6], "recall": [0.9, float("nan")],
                          "acceptance_rate": [0.8, float("nan")]})
    assert sync_figure(tuner_like, F.tuner_figure(table, "simulated (profile x)")) is True
    assert tuner_like.figure == _plain_of(F.tuner_figure(table, "simulated (profile x)"))
    # JSON has no NaN: a missing value is sent as null (plotly.js draws a gap), and the state is valid JSON
    gap = viz.widgets.figure_widget(go.Figure(go.Scatter(y=np.array([1.0, np.nan, np.inf]))))
    assert gap.figure["data"][0]["y"] == [1.0, None, None]
    state = gap.get_state()
    json.dumps({k: state[k] for k in ("figure", "template", "config")}, allow_nan=False)

    d = viz.dashboard(spec_run)
    other = 2 if d.step != 2 else 1
    d.slider.value = other
    for name, build in (("routing", F.routing_figure), ("cache", F.cache_figure), ("timeline", F.timeline_figure)):
        assert getattr(d, name).figure == _plain_of(build(spec_run, other)), name
    assert sync_figure(d.routing, F.routing_figure(spec_run, other)) is False  # nothing new: nothing sent
    sent = []
    d.routing.observe(lambda change: sent.append(change), names="figure")
    d.slider.value = d.step  # the same step again: no message
    assert sent == []
    d.slider.value = 2 if other != 2 else 1
    assert len(sent) == 1  # one message per view for a step


def test_panels_share_one_plotly_js_and_count_no_views(spec_run):
    """Issue 37 (D9, the page's load): plotly.js goes to the page once per kernel, in one model every panel
    refers to (plotly's FigureWidget carried it in each one), and a panel does not turn on ipywidgets' view
    counting (plotly's FigureWidget set ``_view_count = 0``, and each view removed after the kernel shut down
    then logged 'Could not send widget sync message')."""
    from specter_lab.viz.panel import PlotlyJS

    d = viz.dashboard(spec_run)
    loaders = {id(w.plotly_js) for w in d.views.values()}
    assert len(loaders) == 1 and isinstance(d.routing.plotly_js, PlotlyJS)
    assert len(d.routing.plotly_js.source) > 1_000_000 and "Plotly" in d.routing.plotly_js.source[:5000]
    state = d.routing.get_state()
    assert state["plotly_js"] == "IPY_MODEL_" + d.routing.plotly_js.model_id  # a reference, not the source
    assert all(w._view_count is None for w in d.views.values())
    assert d.routing.template["layout"]["plot_bgcolor"] == "white"  # plotly_white, sent once per panel
    assert "template" not in d.routing.figure["layout"]
    assert d.routing.to_figure().layout.template.layout.plot_bgcolor == "white"


def test_dashboard_models_name_their_own_id(spec_run):
    """viz/listening.py: a panel's and the step sync's module find their model in the page by ``_own_id``, which
    must be the model's id (the comm id the page knows it by), different for each widget; both modules keep the
    model listening from their ``initialize``, and a panel asks for its state again there."""
    from specter_lab.viz.panel import _ESM as PANEL_ESM
    from specter_lab.viz.step_sync import _ESM as SYNC_ESM

    d = viz.dashboard(spec_run)
    widgets = [*d.views.values(), d._sync]
    assert all(w._own_id == w.model_id == w.comm.comm_id for w in widgets)
    assert len({w._own_id for w in widgets}) == len(widgets)
    assert "initialize({ model })" in PANEL_ESM and "request_state" in PANEL_ESM
    assert all(esm.count("keepListening(model)") == 2 for esm in (PANEL_ESM, SYNC_ESM))  # defined, then called


def test_widgets_config_and_status_text(model):
    from specter_lab.viz.widgets import FIGURE_CONFIG, plain_text

    w = viz.widgets.figure_widget(F.tuner_figure(None))
    assert w.config["displayModeBar"] == "hover" and w.config["responsive"] is True
    assert FIGURE_CONFIG["displaylogo"] is False
    assert plain_text("<b>done</b>: 3 tokens &amp; more<br>x") == "done: 3 tokens & more\nx"
    run = viz.live(sl.Engine(model, None, "lru", cache_slots=3), PROMPT, max_new_tokens=4)
    run.join(60)
    assert run.status_text.startswith("done: ") and "<" not in run.status_text
    assert run.tokens in run.widget.children  # never shown: no dashboard drawn yet
    assert run.dashboard is not None  # drawn on first ask
    assert run.tokens not in run.widget.children  # the finished dashboard has the one token strip


def test_live_dashboard_is_drawn_when_the_view_is_shown(model):
    """dashboard=True draws the finished run's dashboard for a view that was shown; one never shown draws it when
    it is shown, or asked for, later (a script watching a run pays nothing for it)."""
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    shown = viz.LiveRun(engine, PROMPT, max_new_tokens=4, start=False)
    shown.widget._repr_mimebundle_()  # displayed while it runs (display(run.widget), as notebook 03 does)
    shown.start()
    shown.join(60)
    assert shown._dashboard is not None
    hidden = viz.live(engine, PROMPT, max_new_tokens=4)
    hidden.join(60)
    assert hidden._dashboard is None and "dashboard at step" in hidden.status_text
    hidden._repr_mimebundle_()
    assert hidden._dashboard is not None and hidden.tokens not in hidden.widget.children


def test_live_redraws_are_throttled(model):
    """At most one figure redraw per min_interval (the status line, a few hundred bytes, may move between them);
    the end is drawn in full."""
    import time

    engine = sl.Engine(model, None, "lru", cache_slots=3)
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=12, callback=lambda info: time.sleep(0.05), min_interval=0.2,
                      start=False)
    times: list[float] = []
    inner = run._refresh
    run._refresh = lambda: (times.append(time.perf_counter()), inner())[1]
    run.start()
    run.join(60)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps and min(gaps) >= 0.2 * 0.9, gaps
    assert len(times) < len(run.result.frames()["steps"])
    assert run.progress.value == len(run.result.token_ids)  # the end is drawn in full


def test_frame_analysis_needs_no_plotly(tmp_path):
    """What the views show is computed in viz.frames from pandas alone: usable (and testable) without plotly."""
    import subprocess
    import sys

    code = ("import sys, specter_lab as sl\n"
            "from specter_lab.viz import frames\n"
            "m = sl.tiny_random_model('qwen2_moe', seed=1)\n"
            "r = sl.Engine(m, None, 'specter', expert_budget=0.5).generate([3, 4, 5, 6], max_new_tokens=6)\n"
            "cells = frames.routing_cells(r, frames.default_routing_step(r.frames()))\n"
            "assert len(cells) and 'category' in cells and len(frames.residency(r, 1))\n"
            "assert 'plotly' not in sys.modules, 'viz.frames imported plotly'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


# ----------------------------------------------------------------------------------------- issue 37
def test_live_status_and_strip_come_from_one_snapshot(model):
    """D1: every redraw writes the status line and the token strip from the same snapshot: the token count of
    the status equals the strip's 'N generated' in every frame the page could see (the old view moved the status
    on between redraws, 15 steps ahead of the strip)."""
    import re

    engine = sl.Engine(model, None, "lru", cache_slots=3)
    # Steps faster than the redraws: the old view moved the status line on between two redraws.
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=30, min_interval=0.5, start=False,
                      callback=lambda info: time.sleep(0.05))
    frames: list[tuple[str, str]] = []
    # A redraw sets the strip, then the status line: whenever the status moves, the strip beside it must agree.
    run.status.observe(lambda ch: frames.append((plain_text(ch["new"]), run.tokens.value)), names="value")
    run.start()
    run.join(60)
    running = [(s, t) for s, t in frames if re.match(r"step \d+ · \d+/", s)]
    assert len(running) >= 3, frames[:3]
    for status, strip in running:
        n = int(re.match(r"step \d+ · (\d+)/", status).group(1))
        shown = int(re.search(r"Tokens</b> · (\d+) generated", strip).group(1))
        assert n == shown, (status, shown)


def test_live_stop_after_generation_ended_reads_finishing(model):
    """D2: a Stop click once generation has ended (while the dashboard is drawn) changes nothing: the buttons are
    disabled, the status says 'finishing …' and then 'done' (the old view showed 'stopping after this step …'
    for seconds, then 'done')."""
    engine = sl.Engine(model, None, "specter", cache_slots=3)
    ended = threading.Event()
    go_on = threading.Event()
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=8, min_interval=0.0, start=False)
    statuses: list[str] = []
    run.status.observe(lambda ch: statuses.append(plain_text(ch["new"])), names="value")
    finish = run._finish
    run._finish = lambda: (ended.set(), go_on.wait(30), finish())  # hold the run between generate and dashboard
    run.start()
    assert ended.wait(60)
    assert run.stop_button.disabled and run.pause_button.disabled
    assert run.status_text.startswith("finishing (done after 8 tokens)")
    run.stop()  # the late click
    assert run.status_text.startswith("finishing") and not any("stopping" in s for s in statuses)
    go_on.set()
    run.join(60)
    assert run.status_text.startswith("done: 8 tokens") and run.result.metrics["stopped"] is False


def test_live_pause_holds_between_steps_and_reports_an_eta(model):
    """Pause holds generation between two steps until Resume; the status line carries an ETA while it runs."""
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=20, min_interval=0.0, start=False, pace=0.02)
    seen: list[str] = []
    run.status.observe(lambda ch: seen.append(plain_text(ch["new"])), names="value")
    steps: list[int] = []
    run._user_callback = lambda info: steps.append(info.step)
    run.start()
    while len(steps) < 3:
        time.sleep(0.01)
    run.pause()
    deadline = time.perf_counter() + 30  # the step in progress finishes first, however slow the machine
    while run.held_step is None and time.perf_counter() < deadline:
        time.sleep(0.01)
    held = len(steps)
    time.sleep(0.3)
    assert len(steps) == held and run.phase == "paused" and steps[-1] == run.held_step
    assert run.status_text.startswith(f"paused after step {run.held_step} ")
    run.resume()
    run.join(60)
    assert len(run.result.token_ids) == 20 and not run.result.metrics["stopped"]
    assert any(s.endswith("s left") for s in seen), seen
    # E13: no ETA from the first steps, which carry the prefill (it said 260 s for a 24 s run)
    early = [s for s in seen if (m := re.match(r"step (\d+) ", s)) and int(m.group(1)) < 4]
    assert early and not any("left" in s for s in early), early


def test_live_dashboard_on_request_and_capped_strip(model):
    """dashboard=False: the finished run keeps its light view until the button builds the dashboard; the
    dashboard's token strip shows at most token_rows rows (D5), with the glyph legend."""
    engine = sl.Engine(model, None, "specter", cache_slots=3)
    run = viz.LiveRun(engine, PROMPT, max_new_tokens=60, min_interval=0.0, start=False, dashboard=False)
    run.start()
    run.join(60)
    assert run.dashboard is None and run.tokens in run.widget.children
    assert run.dashboard_button.layout.display is None and "· space" not in run.tokens.value  # ids: no glyphs
    dash = run.open_dashboard()
    assert dash is run.dashboard and run.tokens not in run.widget.children
    rows = dash.tokens.value.count("<div><span class='l'>")
    assert 0 < rows <= 12, rows


def test_dashboard_steps_reuse_built_figures(spec_run):
    """D4: a step the dashboard has built (or warmed in the background) is not built again: sliding over every
    step shows the very figures built before. (Identity, not a patched global view: other dashboards' warm
    threads may still be drawing with the shared view registry.)"""
    d = viz.dashboard(spec_run)
    lo, hi = int(d.slider.min), int(d.slider.max)
    built = {s: d._views_at(s) for s in range(lo, hi + 1)}
    for s in range(lo, hi + 1):
        d.slider.value = s
    assert all(d._views_at(s) is built[s] for s in built) and d.step == hi


def test_a_ready_step_never_waits_for_a_background_build(spec_run):
    """Issue 37: a slider step whose figures are built is shown at once, even while the warm thread builds
    another step (a build held the cache's lock for ~120 ms, and some keyboard steps took that much longer)."""
    d = viz.Dashboard(spec_run, prefetch=False)
    ready = d._views_at(d.step)
    started, release = threading.Event(), threading.Event()
    real = d._build

    def slow(step):
        started.set()
        release.wait(10)
        return real(step)

    d._build = slow
    other = next(s for s in range(int(d.slider.min), int(d.slider.max) + 1) if s not in d._cache)
    builder = threading.Thread(target=d._views_at, args=(other,))
    builder.start()
    try:
        assert started.wait(5)
        t0 = time.perf_counter()
        got = d._views_at(d.step)
        waited = time.perf_counter() - t0
    finally:
        release.set()
        builder.join()
    assert got is ready and waited < 1.0, f"a ready step waited {waited:.2f} s for another step's build"
    assert other in d._cache


def test_steps_sent_ahead_are_what_show_sets(spec_run):
    """Issue 37: the steps the dashboard sends ahead to the page (StepSync) hold exactly what the kernel's show()
    then sets on every view, so the page draws such a step once, at the key, and the kernel's answer changes
    nothing; a page that (re)loads the sync gets the built steps again."""
    d = viz.Dashboard(spec_run, prefetch=False)
    sent: list[dict] = []
    d._sync.send = lambda content, buffers=None: sent.append(json.loads(json.dumps(content)))
    d._prefetch, d._warm_delay = True, 0.0
    d._warm(d.step).join(60)
    d._prefetch = False
    steps = [m["step"] for m in sent]
    assert d.step in steps and len(set(steps)) == len(steps) >= 2, steps
    for m in sent:
        d.show(m["step"])
        shown = {**{name: view.figure for name, view in d.views.items()}, "info": d.info.value,
                 "tokens": d.tokens.value}
        assert json.loads(json.dumps(shown)) == m["values"], f"step {m['step']}"
    sent.clear()
    d._sync._handle(d._sync, {"ready": True}, [])  # what a reloaded page sends
    deadline = time.time() + 60
    while len(sent) < len(steps) and time.time() < deadline:
        time.sleep(0.05)
    assert sorted(m["step"] for m in sent) == sorted(steps)


def test_dashboard_export_writes_the_shown_step(spec_run, tmp_path):
    d = viz.dashboard(spec_run)
    path = d.export(str(tmp_path / "views.html"))
    text = open(path, encoding="utf-8").read()
    assert f"step {d.step}" in text and text.count("Plotly.newPlot") == len(d.views) + 1  # and the token strip


def test_tuner_marks_a_stale_table(model):
    """D8 / M3: with 'run on change' off, a changed control marks the table stale until Run."""
    tuner = viz.QuantTuner(model, None, [PROMPT], max_new_tokens=6, auto=False, run_now=False,
                           baselines=("lru",), expert_budget=0.9)
    tuner.run()
    assert tuner.stale.value == ""
    tuner.k.value = tuner.k.value - 1
    assert "stale" in tuner.stale.value and "press Run" in tuner.stale.value
    tuner.k.value = tuner.k.value + 1  # back to what the table shows
    assert tuner.stale.value == ""


def test_table_helper_formats_and_hides_columns():
    """D7 / D12: the compact table shows the chosen columns, k as an int or 'auto' or '—', ratios as ×, long
    text cut with a tooltip, and the rest in a closed section."""
    from specter_lab.viz.tables import format_value

    df = pd.DataFrame({"strategy": ["specter", "lru", "auto"], "k": [8.0, float("nan"), "auto"],
                       "tpot_ms": [56.21349, 0.123456, 1234.5], "speedup_vs_lru": [0.7612, 1.0, 1.2],
                       "routing": ["x" * 80, "y", "z"], "hit_rate": [0.77912, 0.8, 0.9]})
    t = viz.table(df, ["strategy", "k", "tpot_ms", "speedup_vs_lru", "routing"])
    page = t._repr_html_()
    assert ">8<" in page and ">—<" in page and ">auto<" in page and "8.0" not in page
    assert ">56.21<" in page and ">0.123<" in page and ">1,234<" in page or ">1,235<" in page
    assert ">0.76×<" in page and "x" * 80 not in page.split("<details")[0].split("title=")[0]
    # headers may break after an underscore
    assert "<details" in page and "hit_<wbr>rate" in page.split("<details")[1] and t.hidden == ["hit_rate"]
    assert "hit_<wbr>rate" in t.full()._repr_html_() and "<details" not in t.full()._repr_html_()
    assert format_value(float("nan"), "k") == "—" and format_value(16.0, "K") == "16"
    with pytest.raises(ValueError, match="not columns"):
        viz.table(df, ["nope"])


def test_waterfall_labels_are_the_tables_factors():
    """D11: a relative bar is labelled with the factor its step multiplies the speedup by (the table's
    ``factor`` column), not with an additive change beside a multiplicative table."""
    df = pd.DataFrame({"step": ["artifact protocol", "metric: unbiased TPOT", "write-back off",
                                "memory split: equal bytes", "prefetch + overlap off"],
                       "speedup": [1.845, 1.609, 1.415, 0.928, 0.911]})
    df["factor"] = df.speedup / df.speedup.shift()
    bars = F.waterfall_figure(df).data[0]
    labels = dict(zip(bars.x, bars.text))
    for r in df.iloc[1:].itertuples():
        assert labels[r.step] == f"×{r.factor:.2f}", (r.step, labels[r.step])
    assert labels["artifact protocol"] == "1.84×" or labels["artifact protocol"] == "1.85×"



def test_dashboard_strip_shows_the_rows_that_end_at_the_step(spec_run):
    """D5 with the HTML strip: a strip longer than token_rows shows the rows ending at the shown step (the step
    a slider shows is always in view), and its title says which rows of how many."""
    from specter_lab.viz.strip import tokens_html

    f = spec_run.frames()
    kinds = dict(zip(f["steps"].step, f["steps"].kind))
    steps = sorted(set(f["tokens"].step))
    page = tokens_html(f["tokens"], kinds, last_rows=2, highlight_step=steps[1])
    cells = _strip_cells(page)
    assert sorted(set(cells["steps"])) == steps[:2] and cells["later"] == 0
    assert f"rows 0–1 of {len(steps)}" in page
    live = tokens_html(f["tokens"], kinds, last_rows=2)  # the live view: the last rows, nothing outlined
    assert sorted(set(_strip_cells(live)["steps"])) == steps[-2:] and "last 2 rows" in live and " now" not in live


def test_every_figure_loads_the_light_plotly(spec_run):
    """Issue 55: the package's figures use only the traces of its light plotly.js (viz/panel.py), so a notebook
    page evaluates that one, not plotly.py's full bundle (a 1-2.6 s task on a small machine)."""
    from specter_lab.viz.panel import FigurePanel, LIGHT_TRACES, bundle_for, plain_figure

    figs = {name: view(spec_run, None, None) for name, view in F.STEP_VIEWS.items()}
    figs["steps"] = F.steps_figure(spec_run)
    figs["tuner"] = F.tuner_figure(None)
    df = pd.DataFrame({"step": ["artifact protocol", "metric: unbiased TPOT", "memory split: equal bytes",
                                "prefetch + overlap off"], "speedup": [1.8, 1.6, 0.93, 0.91]})
    figs["waterfall"] = F.waterfall_figure(df)
    heavy = {name: sorted({t.type for t in f.data} - LIGHT_TRACES) for name, f in figs.items()
             if bundle_for(plain_figure(f)) != "light"}
    assert not heavy, f"figures with traces the light plotly.js lacks: {heavy}"
    panel = FigurePanel(figs["routing"])
    assert panel.plotly_js.bundle == "light" and "plotly.js v4.1.1" in panel.plotly_js.source[:200]
    panel.show(go.Figure(go.Waterfall(y=[1, 2])))  # a trace it lacks: the full bundle from then on
    assert panel.plotly_js.bundle == "full"
