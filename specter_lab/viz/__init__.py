"""Notebook views of a run: plotly figures of a run (:mod:`.figures`) and of bench tables (:mod:`.bench_figures`),
the pure frame analysis they draw (:mod:`.frames`, no plotly), the shared palette (:mod:`.style`) and layout
(:mod:`.layout`), standalone HTML reports (:mod:`.report`), wide tables that fit a cell (:mod:`.tables`), live
ipywidgets views (:mod:`.widgets`) and the HTML token strip they redraw while a run goes on (:mod:`.strip`).

    from specter_lab import viz
    viz.dashboard(result)                 # step slider over routing, cache, timeline and tokens
    run = viz.live(engine, prompt)        # generate in the background, Stop button, views refreshed per step
    viz.QuantTuner(model, tok, prompts)   # draft bits / group size / method / K against lru and specmoeoff
    viz.timeline_figure(result).show()    # any *_figure is a go.Figure (a notebook shows it in a figure panel)
    result.to_html("run.html")            # standalone report (report_html)
    viz.file_link("run.html", "open")     # a link that opens it in a new tab (or downloads it), from any front end
    viz.table(df, ["strategy", "tpot_ms"])  # a wide frame that fits its cell, the rest on demand

Everything is imported on first use: ``import specter_lab.viz`` loads neither plotly nor ipywidgets.
"""

from __future__ import annotations

import importlib
from typing import Any

_FIGURES = ("routing_figure", "cache_figure", "timeline_figure", "tokens_figure", "steps_figure", "fidelity_figure",
            "compare_figure", "speedup_figure", "cost_figure", "regime_figure", "tuner_figure", "report_html",
            "bench_html", "clock_label", "STEP_VIEWS")
_WIDGETS = ("dashboard", "live", "QuantTuner", "Dashboard", "LiveRun", "sync_figure")
_TABLES = ("table", "Table")
_DOWNLOADS = ("file_link", "FileLink")

_MODULES = ("figures", "bench_figures", "frames", "style", "layout", "report", "strip", "tables", "widgets",
            "estimate_view", "live_file", "download", "shown", "panel")

__all__ = [*_FIGURES, *_WIDGETS, *_TABLES, *_DOWNLOADS, *_MODULES]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in ("report_html", "bench_html"):
        return getattr(importlib.import_module(".report", __name__), name)
    if name in _FIGURES:
        return getattr(importlib.import_module(".figures", __name__), name)
    if name in _TABLES:
        return getattr(importlib.import_module(".tables", __name__), name)
    if name in _WIDGETS:
        return getattr(importlib.import_module(".widgets", __name__), name)
    if name in _DOWNLOADS:
        return getattr(importlib.import_module(".download", __name__), name)
    raise AttributeError(f"module 'specter_lab.viz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
