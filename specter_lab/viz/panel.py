"""A light plotly widget: one figure, drawn in the page by ``Plotly.react`` from its synced plain data.

Why not plotly's own ``FigureWidget`` (issue 37):

* each ``FigureWidget`` ships plotly.js (~5 MB) inside its model, and a page reload restores every one of them;
  here plotly.js travels once per kernel, in one :class:`PlotlyJS` model that every panel refers to;
* it answers each update with layout and trace deltas that the kernel validates, and a step's update is a
  ``Plotly.update`` plus that round trip; here an update is one message with the figure, and the page redraws
  it with ``Plotly.react``, which diffs against what it drew (a slider step of the dashboard: one message and
  one redraw per view, nothing back);
* it turns on ipywidgets' view counting (``_view_count = 0``), so each view removed after the kernel shut
  down (File > Close and Shut Down Notebook) sent a count to a dead kernel and logged "Could not send widget
  sync message"; a panel counts no views;
* its synced state is only assigned at construction and display, so a later view (a reload, a second display)
  could draw a stale figure; a panel's ``figure`` trait *is* the figure, so every view draws what Python holds.

A view can also draw figures ahead of time, out of sight (the dashboard's neighbouring steps, asked for by
:class:`~.step_sync.StepSync`), and swaps one in when its model takes that very figure.

A panel keeps taking the kernel's figures when its module loaded late on a busy page, and then asks for its state
again (:mod:`.listening`).

plotly.js is evaluated once per page, in one main-thread task that nothing can split (issue 55: 1.1-2.6 s at
each notebook's first figure on a 2-core box with plotly.py's 4.6 MB bundle). So a panel whose traces are all
scatter, bar and heatmap (:data:`LIGHT_TRACES`, every figure of this package) gets a plotly.js cut to those
(``assets/plotly``, 1.2 MB), loaded as a script (compiled off the main thread while it streams in, every
function at once: V8's compile hint): under 0.1 s, where plotly.js's own cartesian bundle took 0.3-0.7 s. Each
view draws in a task of its own. The package's static figures are panels too
(:mod:`.shown`), so JupyterLab's plotly renderer, which would evaluate the full bundle again, never runs for them.

The figure is synced as plain JSON (lists, no numpy arrays), without its template; the template (the same for
every figure of the views) is synced once per panel in ``template``.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import plotly.graph_objects as go
import traitlets
from ipywidgets import widget_serialization
from plotly.basedatatypes import BaseFigure
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from .listening import KEEP_LISTENING_JS, Listening

__all__ = ["FIGURE_CONFIG", "FigurePanel", "LIGHT_TRACES", "PlotlyJS", "plain_figure"]


class PlotlyJS(anywidget.AnyWidget):
    """A plotly.js bundle's source (``bundle``: 'light' or 'full'), synced once per kernel
    (:func:`plotly_js`); every :class:`FigurePanel` refers to one. It has no view of its own."""

    _esm = "export default {};"
    source = traitlets.Unicode("").tag(sync=True)
    bundle = traitlets.Unicode("full").tag(sync=True)


# Trace types of the light plotly.js (assets/plotly/README.md).
LIGHT_TRACES = frozenset({"bar", "heatmap", "scatter"})
_LIGHT_FILE = Path(__file__).resolve().parents[1] / "assets" / "plotly" / "plotly-specter.min.js"
_LIGHT_VERSION = "4.1.1"

_LOADERS: "dict[str, PlotlyJS]" = {}


def plotly_js(bundle: str = "full") -> PlotlyJS:
    """The kernel's :class:`PlotlyJS` of ``bundle`` (made on first use, and again if it was closed). 'light' is
    the bundled build where it is plotly.py's own plotly.js version, else the full one."""
    if bundle == "light" and not light_bundle_usable():
        bundle = "full"
    loader = _LOADERS.get(bundle)
    if loader is None or loader.comm is None:
        source = _LIGHT_FILE.read_text(encoding="utf-8") if bundle == "light" else get_plotlyjs()
        loader = _LOADERS[bundle] = PlotlyJS(source=source, bundle=bundle)
    return loader


def light_bundle_usable() -> bool:
    """Whether the bundled light plotly.js is the version plotly.py writes figures for."""
    return _LIGHT_FILE.is_file() and get_plotlyjs_version() == _LIGHT_VERSION


def bundle_for(fig: dict) -> str:
    """'light' when every trace of ``fig`` (plain JSON) is in :data:`LIGHT_TRACES`, else 'full'."""
    types = {str(t.get("type") or "scatter") for t in fig.get("data", [])}
    return "light" if types <= LIGHT_TRACES else "full"


# The view. plotly.js is a UMD bundle: run with ``define``, ``module`` and ``exports`` out of sight it installs
# itself as ``globalThis.Plotly``. It runs from a <script> of a blob URL, whose source Chromium compiles off the main
# thread as it streams in (every function at once, by the compile-hint comment V8 reads on the first line); where
# such a script is refused (a page's content policy), from ``new Function``. The first panel of a page loads it,
# the others wait on the same promise (a failed load is forgotten, so the next view tries again). A Plotly already
# in the page (JupyterLab's plotly renderer drew a figure of the user's: the full bundle) serves every panel.
# A figure is drawn once the view is in the page (drawn earlier, plotly.js cannot measure the cell and falls back
# to 700 px), in a task of its own (the views of one cell do not add up to one long task), and redrawn when its
# width changes.
_ESM = KEEP_LISTENING_JS + r"""
const KEY = "__specter_lab_plotly";
const HINT = "//# allFunctionsCalledOnLoad\n";
function runScript(source) {
  const body = HINT + "(function(define, module, exports) {\n" + source + "\n}).call(globalThis);";
  const url = URL.createObjectURL(new Blob([body], { type: "text/javascript" }));
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = url;
    s.onload = () => { URL.revokeObjectURL(url); s.remove(); resolve(); };
    s.onerror = () => { URL.revokeObjectURL(url); s.remove(); reject(new Error("script refused")); };
    document.head.appendChild(s);
  });
}
function loadPlotly(model) {
  const loaded = (globalThis[KEY] = globalThis[KEY] || {});
  const own = globalThis.__specter_lab_plotly_bundle;  // the bundle we put in globalThis.Plotly, if we did
  if (globalThis.Plotly && globalThis.Plotly.react && !own) return Promise.resolve(globalThis.Plotly);
  return (async () => {
    const ref = String(model.get("plotly_js") || "").replace(/^IPY_MODEL_/, "");
    const loader = await model.widget_manager.get_model(ref);
    const bundle = loader.get("bundle") || "full";
    if (loaded.full) return loaded.full;  // a superset of any other
    if (!loaded[bundle]) {
      loaded[bundle] = (async () => {
        const before = globalThis.Plotly;
        delete globalThis.Plotly;
        try { await runScript(loader.get("source")); } catch (err) { /* below */ }
        if (!globalThis.Plotly) new Function("define", "module", "exports", loader.get("source")).call(globalThis);
        const Plotly = globalThis.Plotly;
        if (!Plotly) throw new Error("specter_lab: plotly.js did not load");
        if (before && bundle !== "full") globalThis.Plotly = before;  // keep the fuller one global
        else globalThis.__specter_lab_plotly_bundle = bundle;
        await warmUp(Plotly);
        return Plotly;
      })();
      loaded[bundle].catch(() => { delete loaded[bundle]; });
    }
    return loaded[bundle];
  })();
}
const nextTask = () => new Promise(resolve => setTimeout(resolve, 0));
// plotly.js's first draw in a page also adds its style rules to the document, which restyles the whole notebook,
// and builds what it keeps for later draws: done here on a tiny figure out of sight, in a task of its own, so
// that the cell's first figure draws in a task no longer than the next ones.
async function warmUp(Plotly) {
  await nextTask();
  const div = document.createElement("div");
  div.style.cssText = "position:absolute;left:-10000px;top:0;width:300px;height:150px;visibility:hidden";
  document.body.appendChild(div);
  try {
    await Plotly.newPlot(div, [{ type: "bar", y: [1] }, { type: "scatter", y: [1, 2], mode: "lines+markers" },
                               { type: "heatmap", z: [[1]], text: [["s"]], texttemplate: "%{text}", xgap: 1 }],
                         { title: { text: " " }, xaxis: { title: { text: " " } }, showlegend: true },
                         { displayModeBar: "hover" });
    Plotly.purge(div);
  } catch (err) { /* a warm-up only */ }
  div.remove();
  await nextTask();
}

function whenInPage(el, signal) {
  return new Promise(resolve => {
    const tick = () => { if (signal.aborted) return; if (el.isConnected) resolve(); else requestAnimationFrame(tick); };
    tick();
  });
}

// Figures drawn ahead (step_sync.py): a view draws a figure it is asked to in a div out of sight, and when its
// model later takes that very figure object it swaps the div in instead of redrawing (a slider step of the
// dashboard: ~100 ms of plotly.js on a small machine, moved to idle time). Views register here by their panel's
// model id (_own_id, listening.py).
const PANELS = "__specter_lab_panels";
const panels = () => (globalThis[PANELS] = globalThis[PANELS] || new Map());
// Figures a view keeps drawn ahead (the oldest go first): the dashboard draws up to two steps either side.
const KEEP_DRAWN = 6;

export default {
  // A model that dropped the kernel's messages while its module loaded (listening.py) asks for its state again.
  initialize({ model }) {
    keepListening(model)
      .then(real => { if (real) real.comm.send({ method: "request_state" }, {}); })
      .catch(err => console.warn("specter_lab: figure panel", err));
  },
  async render({ model, el }) {
    const gone = new AbortController();
    const newDiv = () => { const d = document.createElement("div"); d.className = "specter-figure"; return d; };
    let gd = newDiv(), shown = null;  // the div in the page, and the figure object it draws
    el.appendChild(gd);
    const ahead = new Map();  // figure object → a div that draws it, out of sight in `holder`
    let holder = null;
    let Plotly = null, width = 0;
    const layoutOf = fig => Object.assign({}, fig.layout || {}, { template: model.get("template") || undefined });
    // A copy: plotly.js writes into what it draws (trace uids, axis ranges), and the model's figure must stay
    // what the kernel sent, or the same figure sent again (step_sync.py) would look new and be drawn twice.
    // The div takes the figure's height before plotly.js draws, and is size-contained (_CSS): what plotly.js
    // changes and measures inside it then never lays out the rest of the notebook again (a figure's first draw
    // took 0.3-0.8 s in a long notebook, most of it forced layouts of the page, against 0.1 s on a blank page).
    const react = (div, figure) => {
      const fig = structuredClone(figure || {});
      const height = (fig.layout || {}).height;
      div.style.height = height ? height + "px" : "";
      div.classList.toggle("sl-sized", !!height);
      return Plotly.react(div, fig.data || [], layoutOf(fig), model.get("config") || {});
    };
    const drop = div => { Plotly.purge(div); div.remove(); };
    const forget = () => {
      for (const div of ahead.values()) drop(div);
      ahead.clear();
    };
    const draw = () => {
      if (!Plotly || gone.signal.aborted) return;
      const figure = model.get("figure");
      const ready = ahead.get(figure);
      if (ready && ready !== gd) {  // drawn ahead: swap it in, and keep the one it replaces drawn ahead
        ahead.delete(figure);
        ready.dataset.swappedIn = "";  // a mark for the browser test: this view was swapped in, not redrawn
        el.insertBefore(ready, gd);
        if (shown) { holder.appendChild(gd); ahead.set(shown, gd); } else drop(gd);
        gd = ready;
        shown = figure;
        trim();
        return;
      }
      shown = figure;
      delete gd.dataset.swappedIn;
      react(gd, figure);
    };
    const trim = () => {
      while (ahead.size > KEEP_DRAWN) {
        const [key, div] = ahead.entries().next().value;
        ahead.delete(key);
        drop(div);
      }
    };
    // Draw `figure` out of sight, to be swapped in when the model takes it; true if that took a draw.
    const drawAhead = figure => {
      if (!Plotly || gone.signal.aborted || !width || !figure || figure === shown || ahead.has(figure)) return false;
      if (!holder) {
        holder = document.createElement("div");
        holder.style.cssText = "position:absolute;left:-100000px;top:0;visibility:hidden;pointer-events:none;";
        document.body.appendChild(holder);
      }
      holder.style.width = width + "px";
      const div = newDiv();
      holder.appendChild(div);
      react(div, figure);
      ahead.set(figure, div);
      trim();
      return true;
    };
    const onChange = () => draw();
    const onConfig = () => { if (Plotly) forget(); draw(); };
    model.on("change:figure", onChange);
    model.on("change:config", onConfig);
    const resize = new ResizeObserver(entries => {
      const w = Math.round(entries[0].contentRect.width);
      if (Plotly && w > 0 && w !== width && gd.data) { width = w; forget(); Plotly.Plots.resize(gd); }
    });
    const id = model.get("_own_id");
    const mine = panels().get(id) || new Set();
    panels().set(id, mine);
    mine.add(drawAhead);
    const onLoader = async () => {
      Plotly = await loadPlotly(model);
      await nextTask();
      if (gone.signal.aborted) return;
      forget();
      draw();
    };
    model.on("change:plotly_js", onLoader);
    (async () => {
      const [P] = await Promise.all([loadPlotly(model), whenInPage(el, gone.signal)]);
      await nextTask();  // each view draws in a task of its own, not in the one that evaluated plotly.js
      if (gone.signal.aborted) return;
      Plotly = P;
      width = Math.round(el.getBoundingClientRect().width);
      draw();
      resize.observe(el);
    })().catch(err => { gd.textContent = String(err); console.warn(err); });
    return () => {
      gone.abort();
      resize.disconnect();
      mine.delete(drawAhead);
      if (!mine.size) panels().delete(id);
      model.off("change:figure", onChange);
      model.off("change:config", onConfig);
      model.off("change:plotly_js", onLoader);
      if (Plotly) { forget(); Plotly.purge(gd); }
      if (holder) holder.remove();
    };
  }
};
"""

# Plotly config of every figure panel here. The modebar sits on the right end of the title line, where the
# titles put their numbers: it shows only while the pointer is over the figure (plotly.js keeps it always on for
# a device without hover, such as a touch screen), and it keeps only download, zoom, pan and reset, so it is
# short enough to clear a title at a cell's width. No plotly logo; ``responsive`` so a figure follows the width
# of its cell.
FIGURE_CONFIG: dict[str, Any] = {
    "displayModeBar": "hover", "displaylogo": False, "responsive": True,
    "modeBarButtonsToRemove": ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"],
}

_CSS = ".specter-figure { width: 100%; } .specter-figure.sl-sized { contain: size layout style; }"


class FigurePanel(Listening):
    """One plotly figure in the page, redrawn whenever :meth:`show` gives it another.

    ``figure`` is the figure as plain JSON (:func:`plain_figure`, template apart), ``template`` its plotly
    template, ``config`` plotly.js's config. :meth:`show` accepts a ``go.Figure`` or a dict already made plain
    (what a view prepares ahead of time); :meth:`to_figure` gives the shown figure back as a ``go.Figure``."""

    _esm = _ESM
    _css = _CSS
    figure = traitlets.Dict().tag(sync=True)
    template = traitlets.Dict().tag(sync=True)
    config = traitlets.Dict().tag(sync=True)
    plotly_js = traitlets.Instance(PlotlyJS).tag(sync=True, **widget_serialization)

    def __init__(self, fig: "go.Figure | dict", config: "dict | None" = None, **kwargs: Any) -> None:
        template = fig.layout.template.to_plotly_json() if isinstance(fig, go.Figure) else {}
        plain = _as_plain(fig)
        super().__init__(figure=plain, template=_plain(template), config=dict(config or {}),
                         plotly_js=plotly_js(bundle_for(plain)), **kwargs)

    def show(self, fig: "go.Figure | dict") -> bool:
        """Show ``fig``; returns False, sending nothing, when the panel already shows it."""
        plain = _as_plain(fig)
        if plain == self.figure:
            return False
        if bundle_for(plain) == "full" and self.plotly_js.bundle != "full":  # a trace type the light one lacks
            self.plotly_js = plotly_js("full")
        self.figure = plain
        return True

    def to_figure(self) -> go.Figure:
        """The shown figure as a ``go.Figure`` (template included), e.g. to save or export."""
        layout = {**self.figure.get("layout", {}), "template": self.template or None}
        return go.Figure({"data": self.figure.get("data", []), "layout": layout})


def _as_plain(fig: "go.Figure | dict") -> dict:
    return plain_figure(fig) if isinstance(fig, BaseFigure) else {"data": fig["data"], "layout": fig["layout"]}


def plain_figure(fig: BaseFigure) -> dict:
    """``fig`` as plain JSON-like data (lists, not numpy arrays; no template): what a :class:`FigurePanel`
    syncs. A view that switches between prepared figures builds these once per step, ahead of time."""
    d = _plain(fig.to_plotly_json())
    d["layout"].pop("template", None)
    return {"data": d["data"], "layout": d["layout"]}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:  # plotly's base64 form of a numpy array
            arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
            shape = value.get("shape")
            if isinstance(shape, str):
                shape = [int(n) for n in shape.split(",")]
            return _plain((arr.reshape(shape) if shape else arr).tolist())
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; plotly.js draws null as a gap, as it draws NaN
    return value
