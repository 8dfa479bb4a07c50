"""Live notebook views: ipywidgets controls driving plotly figures (:class:`~.panel.FigurePanel`) built from
:mod:`.figures`.

* :func:`dashboard` – a step slider (and Play button) over a finished run: every view of
  :data:`~.figures.STEP_VIEWS` (token strip, routing, cache, timeline) at the chosen step.
* :func:`live` – generation in a background thread while the kernel stays free: a light view (status, progress
  bar, HTML token strip) redrawn at most once a second, a Stop button that ends generation after the current
  step, and the finished run's dashboard when it ends.
* :class:`QuantTuner` – pick the draft's bits / group size / method and K, rerun a short generation, and compare
  specter with ``lru`` and ``specmoeoff`` at the same expert budget.

A view never rebuilds its widgets: a step change hands each existing panel its new figure (:func:`sync_figure`,
one message per figure; the page redraws it with ``Plotly.react``), and a view created later (a reload, a second
display) draws what Python holds. Build live figures with :func:`figure_widget` (hover-only modebar, width of
the cell).
Each view returns plain ``go.Figure`` copies from ``.static()`` (for saving, or for a report).

This module needs ipywidgets and anywidget (the ``notebook`` extra); ``import specter_lab.viz`` alone does not
load it.
"""

from __future__ import annotations

import html
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go
from tqdm.auto import tqdm

from ..atomic import atomic_open, write_atomic
from ..decode import StopGeneration
from ..run.quant import QuantSpec
from ..studies.runs import DoesNotFit, run_prompts, try_engine
from ..run.strategies import get_strategy
from ..records.trace import COLUMNS
from . import figures as F
from .download import file_link
from .panel import FIGURE_CONFIG, FigurePanel, plain_figure
from .step_sync import StepSync
from .live_file import save_live
from .strip import tokens_html

__all__ = ["Dashboard", "LiveRun", "QuantTuner", "dashboard", "figure_widget", "live", "sync_figure"]


def figure_widget(fig: go.Figure) -> FigurePanel:
    """A :class:`~.panel.FigurePanel` showing ``fig``, with :data:`FIGURE_CONFIG`. Build every live figure
    with this."""
    return FigurePanel(fig, config=FIGURE_CONFIG)


def sync_figure(widget: FigurePanel, fig: "go.Figure | dict") -> bool:
    """Make ``widget`` show ``fig`` (a figure, or one already made plain by :func:`~.panel.plain_figure`): one
    message to the page, which redraws it with ``Plotly.react``; the widget and its place in the notebook stay
    the same, and every later view (a reload, a second display) draws the same. Returns False, sending
    nothing, when the widget already shows ``fig``."""
    return widget.show(fig)


_TAG = re.compile(r"<[^>]+>")


def plain_text(markup: str) -> str:
    """The text of an HTML status line, without tags (``<b>done</b>: …`` → ``done: …``)."""
    return html.unescape(_TAG.sub("", markup.replace("<br>", "\n")))


def _static(widget: FigurePanel) -> go.Figure:
    return widget.to_figure()


# ----------------------------------------------------------------------------------------- dashboard
# The dashboard's figures; its token strip is HTML (Dashboard.tokens), one plotly redraw fewer per slider step.
_PANELS = tuple(name for name in F.STEP_VIEWS if name != "tokens")

_PLAY_CSS = "<style>.sl-play button:has(.fa-stop){display:none}</style>"

class Dashboard:
    """Step-by-step views of one finished run.

    Attributes: ``widget`` (the VBox to display), ``slider`` (IntSlider over the steps), ``play`` (Play button
    linked to the slider), ``info`` (HTML line about the step), ``tokens`` (the token strip, HTML as the live view
    draws it: :func:`~.strip.tokens_html`) and ``views``: one :class:`~.panel.FigurePanel` per figure of
    :data:`~.figures.STEP_VIEWS` (routing, cache, timeline), also readable as attributes (``dash.routing``).
    Setting ``slider.value`` (or calling :meth:`show`) updates all of them.

    A step's figures are built once and kept (``cache_steps`` of them), and the steps next to the shown one are
    built in the background while the kernel is idle and sent to the page, which shows such a step the moment the
    slider moves, without waiting for the kernel (:class:`~.step_sync.StepSync`); another step takes the kernel's
    path, which sends the panels prepared figures where it can (building them costs several times that). The
    token strip shows at most ``token_rows`` rows ending at the shown step. ``save_button`` writes the views of
    the shown step to an HTML file beside the notebook (:meth:`export`) and links it."""

    def __init__(self, result, tokenizer: Any = None, step: int | None = None, play_interval_ms: int = 900,
                 reuse: "Mapping[str, FigurePanel] | None" = None, token_rows: int = 12,
                 cache_steps: int = 64, prefetch: bool = True) -> None:
        self.result = result
        self.tokenizer = tokenizer if tokenizer is not None else getattr(result, "tokenizer", None)
        self.token_rows = int(token_rows)
        frames = result.trace.frames()
        self._steps = frames["steps"].set_index("step")
        steps = [int(s) for s in self._steps.index]
        first = F.default_routing_step(frames) if step is None else int(step)
        if first not in steps:
            raise ValueError(f"step={step!r}: the run has steps {steps[0]}..{steps[-1]}")
        lo, hi = steps[0], steps[-1]
        self._cache: "OrderedDict[int, dict[str, Any]]" = OrderedDict()  # step → what it shows (_views_at)
        self._cache_steps = max(2, int(cache_steps))
        self._cache_lock = threading.Lock()
        self._warm_delay = 0.3  # s after a step is shown before its neighbours are built
        self._sent: set[int] = set()  # steps sent to the page (StepSync.prepare)
        self._sync_lock = threading.RLock()  # one step's updates at a time (the slider, a background thread)
        self.slider = W.IntSlider(value=first, min=lo, max=hi, description="step", continuous_update=False,
                                  layout=W.Layout(width="360px"))
        self.play = W.Play(value=first, min=lo, max=hi, interval=play_interval_ms, description="play")
        # Play's own stop button (■) also sets its value to the first step, which the link passes on to the
        # slider (E18): it is hidden, and its play/pause button pauses on the step shown.
        self.play.add_class("sl-play")
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.info = W.HTML(layout=W.Layout(width="100%"))
        self.save_button = W.Button(description="Save views", icon="download", tooltip=(
            "write the shown step's views to an HTML file beside the notebook (opens offline)"),
            layout=W.Layout(width="120px"))
        self.saved = W.Box()  # a link that delivers the file written (download.py)
        self.save_button.on_click(lambda _: self._save_clicked())
        # ``reuse``: panels already in the page (a live run's detail views) are redrawn, not recreated.
        reuse = dict(reuse or {})
        figs = self._build(first)  # figures, not plain: a new panel takes its template from one
        shown = self._views_at(first, figs)
        self.views: dict[str, FigurePanel] = {}
        for name, fig in figs.items():
            if name in reuse:
                sync_figure(reuse[name], fig)
                self.views[name] = reuse[name]
            else:
                self.views[name] = figure_widget(fig)
        self._shown = first
        self.info.value = shown["info"]
        self.tokens = W.HTML(shown["tokens"])
        self.slider.observe(self._on_step, names="value")
        # The steps built ahead are also sent to the page, which shows them without the kernel (step_sync.py).
        targets = {**{name: (view, "figure") for name, view in self.views.items()},
                   "info": (self.info, "value"), "tokens": (self.tokens, "value")}
        self._sync = StepSync(self.slider, targets, on_ready=self._resend)
        # The step's one-line summary gets its own line, so it never wraps beside the controls.
        self.widget = W.VBox([W.HBox([self.play, self.slider, self.save_button, self.saved, W.HTML(_PLAY_CSS)]),
                              self.info, self.tokens, *self.views.values()])
        self._prefetch = prefetch
        if prefetch:
            self._warm(first)

    def __getattr__(self, name: str) -> FigurePanel:
        views = self.__dict__.get("views", {})
        if name in views:
            return views[name]
        raise AttributeError(f"'Dashboard' has no attribute {name!r} (views: {', '.join(views)})")

    # views -----------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The step the views show."""
        return self._shown

    def _build(self, step: int) -> dict[str, go.Figure]:
        return {name: F.STEP_VIEWS[name](self.result, step, self.tokenizer) for name in _PANELS}

    def _views_at(self, step: int, built: "dict[str, go.Figure] | None" = None) -> dict[str, Any]:
        """What every view shows at ``step``: each panel's plain figure by view name, ``info`` and ``tokens``
        (HTML). What :meth:`show` sets and what is sent ahead to the page are this one dict (built once, the
        figures from ``built`` if given, kept for the last ``cache_steps`` steps asked for)."""
        with self._cache_lock:
            figs = self._cache.get(step)
            if figs is not None:
                self._cache.move_to_end(step)
                return figs
        # Built outside the lock: a slider step whose figures are ready never waits for a background build
        # (one takes ~120 ms here; it made some steps take 70 ms longer, issue 37). Two threads may build the
        # same step at once; the first kept is the one every later call gets.
        built = self._build(step) if built is None else built
        figs = {**{name: plain_figure(fig) for name, fig in built.items()}, "info": self._info_html(step),
                "tokens": self._strip_html(step)}
        with self._cache_lock:
            figs = self._cache.setdefault(step, figs)
            self._cache.move_to_end(step)
            while len(self._cache) > self._cache_steps:
                self._cache.popitem(last=False)
        return figs

    def _resend(self) -> None:
        """A page loaded the step sync (on display, after a reload): send it the built steps nearest the shown
        one, in the background."""
        shown = self._shown
        with self._cache_lock:
            built = sorted(self._cache, key=lambda s: abs(s - shown))[:12]
        self._sent = set(built)

        def send() -> None:
            for s in built:
                self._sync.prepare(s, self._views_at(s))

        threading.Thread(target=send, name="specter-dashboard-resend", daemon=True).start()

    def _warm(self, step: int) -> "threading.Thread | None":
        """Build the views of the steps around ``step`` in a background thread (one step at a time, nearest
        first), so the next slider step finds them ready. It starts once the page has had time to draw the
        shown step: on a small machine a build competes with the browser for the CPU."""
        lo, hi = int(self.slider.min), int(self.slider.max)
        near = [step] + [s for d in (1, 2, 3) for s in (step - d, step + d)]
        if hi - lo < 24:  # a short run: every step (Home / End and Play find them ready too)
            near += sorted(range(lo, hi + 1), key=lambda s: abs(s - step))
        wanted = [s for s in dict.fromkeys(near) if lo <= s <= hi and s not in self._sent]

        def build() -> None:
            time.sleep(self._warm_delay)
            for s in wanted:
                if self._shown != step:  # the reader moved on: warm around the new step instead
                    return
                self._sync.prepare(s, self._views_at(s))
                self._sent.add(s)
                time.sleep(0.01)  # let the kernel answer a message between two builds

        if not wanted:
            return None
        thread = threading.Thread(target=build, name="specter-dashboard-warm", daemon=True)
        thread.start()
        return thread

    def _strip_html(self, step: int) -> str:
        """The token strip at ``step``: HTML, not a figure (a slider step redraws one plotly figure fewer)."""
        f = self.result.trace.frames()
        kinds = dict(zip(f["steps"].step, f["steps"].kind))
        return tokens_html(f["tokens"], kinds, self.tokenizer, last_rows=self.token_rows, highlight_step=step)

    def _info_html(self, step: int) -> str:
        r = self._steps.loc[step]
        f = self.result.trace.frames()
        tr = f["transfers"][f["transfers"].step == step]
        stall = float(f["compute"].loc[f["compute"].step == step, "stall"].sum())
        what = f"drafted {r.drafted}, accepted {r.accepted}, " if r.kind == "window" else ""
        what += f"committed {r.committed}"
        return (f"<span style='font-size:13px'><b>step {step}</b> · {html.escape(str(r.kind))} · {what} · "
                f"{r.end - r.start:.3f} ms · {len(tr)} copies · stall {stall:.3f} ms</span>")

    def show(self, step: int) -> None:
        """Show ``step`` in every view (what the slider calls)."""
        step = int(step)
        shown = self._views_at(step)
        with self._sync_lock:
            # One message per view that changed, each figure prepared as plain data ahead of time: a step costs
            # a few milliseconds here, and the page redraws each with Plotly.react.
            for name, view in self.views.items():
                view.show(shown[name])
        self.info.value = shown["info"]
        self.tokens.value = shown["tokens"]
        self._shown = step
        if self.slider.value != step:
            self.slider.value = step
        if self._prefetch:
            self._warm(step)

    def _on_step(self, change: dict) -> None:
        if change["new"] != self._shown:
            self.show(change["new"])

    def static(self) -> dict[str, go.Figure]:
        """The current views as plain figures, by view name (the token strip as :func:`~.figures.tokens_figure`
        draws it)."""
        strip = F.STEP_VIEWS["tokens"](self.result, self._shown, self.tokenizer, max_rows=self.token_rows)
        return {"tokens": strip, **{name: _static(widget) for name, widget in self.views.items()}}

    def export(self, path: "str | None" = None) -> str:
        """Write the shown step's views (and its one-line summary) to a standalone HTML file (plotly.js inlined
        once, opens offline); returns the path. Default: ``specter_step<N>.html`` in the working directory,
        which is the notebook's folder, so JupyterLab's file browser shows it."""
        from .report import figures_page

        path = path or f"specter_step{self._shown}.html"
        summary = plain_text(self.info.value)
        write_atomic(path, figures_page(f"specter_lab · step {self._shown}", summary, self.static().items()))
        return path

    def _save_clicked(self) -> None:
        path = self.export()
        self.saved.children = (file_link(path),)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def dashboard(result, tokenizer: Any = None, step: int | None = None, token_rows: int = 12) -> Dashboard:
    """Interactive views of a finished run: step slider + Play over token strip, routing, cache and timeline."""
    return Dashboard(result, tokenizer, step, token_rows=token_rows)


# ----------------------------------------------------------------------------------------- live
# Steps and tokens only: what the progress bars and the token strip draw, copied from the trace's own records.
_LIVE_KINDS = ("steps", "tokens")
_ETA_AFTER_STEPS = 4  # the live status line estimates the time left from this step on


class LiveRun:
    """A generation running in a background thread, with views refreshed as steps complete.

    The notebook cell that creates it returns at once and the kernel stays free, so the Stop and Pause buttons
    are handled while the run goes on, even under Run All. Nothing should block on the run in a later cell: use
    :meth:`on_done` for what needs the result (``join()`` is for scripts, or a cell run on its own).

    While it runs, the view is light: ``status`` (an HTML line: step, tokens, acceptance, elapsed time and an
    ETA), ``progress`` (a progress bar of the tokens) and ``tokens`` (an HTML strip of the last ``live_rows``
    rows of tokens, :func:`~.strip.tokens_html`). All of them are redrawn together from **one** snapshot of the
    trace, taken between two steps, at most once per ``min_interval`` seconds, so the status line and the strip
    always show the same step. ``pace`` (seconds) makes each step last at least that long on the wall clock (a
    demo a person can follow and stop; it changes no simulated time). ``details`` names
    :data:`~.figures.STEP_VIEWS` to draw live for the latest step (none by default): each is a
    :class:`~.panel.FigurePanel` and costs a full trace snapshot per redraw; ``views`` holds them (also readable
    as attributes, ``run.routing``; None when not shown).

    Stop ends generation after the step in progress; Pause holds it between two steps until Resume. As soon as
    generation has ended both are disabled and the status line says "finishing …" (a late Stop click changes
    nothing). Then, with ``dashboard=True``, the :class:`Dashboard` of the finished run (``dashboard``) replaces
    the strip, opened at the step the live view showed last; with ``dashboard=False`` the strip stays and the
    "Open the step dashboard" button (:meth:`open_dashboard`) builds it on request (drawing its figures takes the
    page a moment, so it waits for a click).
    ``result`` is the GenerationResult once done, ``error`` an exception raised by generate, ``widget`` the box
    to display. ``out=path`` keeps the steps done so far on disk, whole, every ``save_every`` steps and when the
    run ends (:mod:`.live_file`: ``load_live(path)`` reads them back), so a kernel that dies loses no more."""

    def __init__(self, engine, prompt, max_new_tokens: int = 64, *, tokenizer: Any = None, min_interval: float = 0.5,
                 start: bool = True, details: "bool | Sequence[str]" = (), live_rows: int = 6, pace: float = 0.0,
                 dashboard: bool = True, out: "str | None" = None, save_every: int = 8,
                 **generate_kwargs: Any) -> None:
        self.engine = engine
        self.out, self.save_every, self._steps_done = out, max(1, int(save_every)), 0
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        self.min_interval = float(min_interval)
        self.live_rows = int(live_rows)
        self.pace = float(pace)
        self.auto_dashboard = bool(dashboard)
        self.details = _detail_names(details)
        self._user_callback: Callable | None = generate_kwargs.pop("callback", None)
        self._generate_kwargs = generate_kwargs
        self.result = None
        self.error: BaseException | None = None
        self._dashboard: Dashboard | None = None
        self._shown = False  # the view was displayed (its finished run's dashboard is drawn for it)
        self._dashboard_pending = False  # dashboard=True, run finished, never shown: built when first asked
        self.views: dict[str, FigurePanel] = {}
        self.live_step: int | None = None  # the step the live views last drew
        self.live_tokens = 0  # the tokens the live views last drew
        self.held_step: int | None = None  # while paused: the step after which the generating thread waits
        self.redraws = 0
        self.phase = "starting"  # running, paused, stopping, finishing, done, stopped, failed
        self._latest: dict | None = None  # the last snapshot: frames of steps and tokens (and of details)
        self._on_done: list[Callable] = []
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._status_lock = threading.RLock()  # the phase and the status line change together
        self._draw_lock = threading.RLock()  # one redraw at a time (generating thread, notebook)
        self._last_refresh = 0.0
        self._last_step = 0.0
        self._paused_s = 0.0
        self._t0 = time.perf_counter()
        self.progress = W.IntProgress(value=0, min=0, max=max_new_tokens, bar_style="info",
                                      layout=W.Layout(width="100%"))
        self.tokens = W.HTML(self._strip({name: pd.DataFrame(columns=COLUMNS[name]) for name in _LIVE_KINDS}))
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="end generation after the current step", layout=W.Layout(width="90px"))
        self.stop_button.on_click(lambda _: self.stop())
        self.pause_button = W.Button(description="Pause", icon="pause", tooltip="hold generation between two steps",
                                     layout=W.Layout(width="100px"))
        self.pause_button.on_click(lambda _: self.resume() if self.phase == "paused" else self.pause())
        self.dashboard_button = W.Button(description="Open the step dashboard", icon="sliders",
                                         tooltip="step through the finished run (routing, cache, timeline)",
                                         layout=W.Layout(width="250px", min_width="250px", display="none"))
        self.dashboard_button.on_click(lambda _: self.open_dashboard())
        self.status = W.HTML("starting …")
        self._result_box = W.VBox([])
        self._details_box = W.VBox([])
        self.widget = _ShownBox([W.HBox([self.stop_button, self.pause_button, self.dashboard_button, self.status]),
                                 self.progress, self.tokens, self._details_box, self._result_box])
        self.widget.on_show = self._on_show
        self.thread = threading.Thread(target=self._run, name="specter-live", daemon=True)
        if start:
            self.start()

    def __getattr__(self, name: str) -> Any:
        if name in F.STEP_VIEWS:
            return self.__dict__.get("views", {}).get(name)
        raise AttributeError(f"'LiveRun' has no attribute {name!r}")

    @property
    def dashboard(self) -> "Dashboard | None":
        """The finished run's step dashboard. With ``dashboard=True`` it is drawn when the run ends if the view was
        shown, else here on first ask (or when the view is shown): drawing it is about a tenth of a 300-token
        run's time, for a page nobody may look at (a script, a cell that does not show the run)."""
        if self._dashboard is None and self._dashboard_pending:
            with self._draw_lock:
                if self._dashboard is None and self._dashboard_pending:
                    self._dashboard_pending = False
                    self._build_dashboard()
        return self._dashboard

    @dashboard.setter
    def dashboard(self, value: "Dashboard | None") -> None:
        self._dashboard = value

    def _on_show(self) -> None:
        self._shown = True
        self.dashboard  # a finished run shown for the first time: its dashboard now

    # control ---------------------------------------------------------------------------------
    def start(self) -> "LiveRun":
        self._t0 = time.perf_counter()
        self.thread.start()
        return self

    def stop(self) -> None:
        """Ask generation to end after the step in progress (the step callback raises StopGeneration). Once
        generation has ended there is nothing to stop, and the status line is left as it is ("finishing …")."""
        with self._status_lock:
            if self.phase not in ("starting", "running", "paused"):
                return
            self._stop.set()
            self._resume.set()
            self.phase = "stopping"
            self.pause_button.disabled = True
            at = f" {self.live_step}" if self.live_step is not None else ""
            self.status.value = f"stopping after step{at} …"

    def pause(self) -> None:
        """Hold generation after the step in progress, until :meth:`resume` (or Stop)."""
        with self._status_lock:
            if self.phase not in ("starting", "running"):
                return
            self._resume.clear()
            self.phase = "paused"
            self.pause_button.description, self.pause_button.icon = "Resume", "play"
            # the step in progress finishes first: the line names the step once the thread holds (_hold)
            self.status.value = "pausing after the step in progress …"

    def _hold(self, step: int, tokens: int) -> None:
        """The generating thread now waits after ``step``: the status line says "paused" and names that step.
        Pause was clicked while a step was in progress, which finished first, so the click itself only says
        "pausing"."""
        with self._status_lock:
            if self.phase != "paused":
                return
            self.held_step = step
            self.status.value = (f"<b>paused</b> after step {step} · {tokens}/{self.max_new_tokens} tokens · "
                                 "Resume to go on")

    def resume(self) -> None:
        """Go on after :meth:`pause`."""
        with self._status_lock:
            if self.phase != "paused":
                return
            self.phase = "running"
            self.pause_button.description, self.pause_button.icon = "Pause", "pause"
            self.status.value = f"resuming after step {self.live_step} …"
            self._resume.set()

    def join(self, timeout: float | None = None):
        """Wait for the run to end; returns the GenerationResult (None if still running). Re-raises an error
        that generate raised in the thread. It blocks the kernel: in a notebook, a Stop click waits until it
        returns, so prefer :meth:`on_done` in the cell after the live view."""
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result

    def on_done(self, fn: Callable[[Any], Any]) -> Any:
        """Call ``fn(result)`` when the run has ended (at once if it has) and show the text it returns in the
        returned widget (display it: it says it is waiting until then). The cell returns at once, so the
        kernel stays free for the Stop button. ``fn`` runs in the run's thread; an exception it raises is shown
        in red."""
        out = W.Output()
        out.append_stdout("waiting for the run to end …\n")

        def show(result: Any) -> None:
            try:
                text = str(fn(result))
                out.outputs = ({"output_type": "stream", "name": "stdout", "text": text + "\n"},)
            except Exception as exc:  # shown where the reader looks for the answer
                out.outputs = ({"output_type": "stream", "name": "stderr",
                                "text": f"{type(exc).__name__}: {exc}\n"},)

        with self._lock:
            if not self._done.is_set():
                self._on_done.append(show)
                return out
        show(self.result)
        return out

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def status_text(self) -> str:
        """The status line as plain text (``status.value`` is HTML), e.g. for ``print``."""
        return plain_text(self.status.value)

    # thread ----------------------------------------------------------------------------------
    def _callback(self, info) -> None:
        if self._user_callback is not None:
            self._user_callback(info)
        with self._status_lock:
            if self.phase == "starting":
                self.phase = "running"
        self._steps_done += 1
        if self.out is not None and info.snapshot is not None and self._steps_done % self.save_every == 0:
            save_live(self.out, self.prompt, info.tokens, info.snapshot(kinds=_LIVE_KINDS), "running")
        now = time.perf_counter()
        if now - self._last_refresh >= self.min_interval and info.snapshot is not None:
            # Taken here, in the generating thread between two steps, where the trace is consistent; the
            # status line, the strip and the figures are all drawn from this one snapshot.
            frames = info.snapshot(kinds=None if self.details else _LIVE_KINDS)
            with self._lock:
                self._latest = frames
            self.refresh()
        if self.pace > 0:
            wait = self.pace - (time.perf_counter() - self._last_step)
            if wait > 0:
                self._stop.wait(wait)  # a Stop click ends the wait
        if not self._resume.is_set():
            held = time.perf_counter()
            self._hold(info.step, len(info.tokens))
            self._resume.wait()
            self._paused_s += time.perf_counter() - held
            self.held_step = None
        self._last_step = time.perf_counter()
        if self._stop.is_set():
            raise StopGeneration()

    def _run(self) -> None:
        try:
            self.result = self.engine.generate(self.prompt, max_new_tokens=self.max_new_tokens,
                                               callback=self._callback, **self._generate_kwargs)
        except BaseException as exc:  # shown in the widget, re-raised by join()
            self.error = exc
        if self.out is not None and self.result is not None:  # the whole run; a failed one keeps its last save
            how = "stopped" if self.result.metrics.get("stopped") else "done"
            try:
                save_live(self.out, self.prompt, self.result.token_ids, self.result.trace.frames(), how)
            except OSError as exc:  # a full disk: reported by join() and the status line, the run itself is kept
                self.error = exc
        with self._status_lock:
            # Generation is over: nothing is left to stop or pause, whatever the page showed a moment ago.
            self.phase = "finishing"
            self.stop_button.disabled = True
            self.pause_button.disabled = True
            if self.result is not None:
                how = "stopped" if self.result.metrics.get("stopped") else "done"
                self.status.value = (f"finishing ({how} after {len(self.result.token_ids)} tokens): "
                                     + ("drawing the run's dashboard …" if self.auto_dashboard else "…"))
        try:
            self._finish()
        except Exception as exc:  # a view that fails to draw the finished run is still reported by join()
            self.error = self.error or exc
        finally:
            with self._lock:
                self._done.set()
                waiting, self._on_done = self._on_done, []
            for show in waiting:
                show(self.result)

    # views -----------------------------------------------------------------------------------
    def _strip(self, frames: dict) -> str:
        kinds = dict(zip(frames["steps"].step, frames["steps"].kind))
        return tokens_html(frames["tokens"], kinds, self.tokenizer, last_rows=self.live_rows)

    def _running_status(self, step: int, n: int, acc: str) -> str:
        elapsed = time.perf_counter() - self._t0
        active = max(elapsed - self._paused_s, 1e-9)
        eta = ""
        # Not before a few steps: the first ones carry the prefill and the draft's start, and an ETA from them
        # was 260 s for a 24 s run (E13).
        if step >= _ETA_AFTER_STEPS and 0 < n < self.max_new_tokens:
            eta = f" · about {(self.max_new_tokens - n) * active / n:.0f} s left"
        return f"step {step} · {n}/{self.max_new_tokens} tokens{acc} · {elapsed:.1f} s{eta}"

    def refresh(self) -> None:
        """Redraw the status line, the progress, the token strip and the detail views from the latest snapshot.
        The live run calls it at most once per ``min_interval``."""
        with self._draw_lock:
            self._refresh()

    def _refresh(self) -> None:
        with self._lock:
            frames = self._latest
        if frames is None or self._done.is_set() or self._dashboard is not None:
            return
        st = frames["steps"]
        step = int(st.step.iloc[-1]) if len(st) else 0
        n = int(st.committed.sum()) if len(st) else 0
        drafted = int(st.drafted.sum()) if len(st) else 0
        acc = f" · acceptance {st.accepted.sum() / drafted:.0%}" if drafted else ""
        self.tokens.value = self._strip(frames)
        self.progress.value = n
        with self._status_lock:
            if self.phase == "running":
                self.status.value = self._running_status(step, n, acc)
            self.live_step, self.live_tokens = step, n
        self._refresh_details(frames, step)
        self.redraws += 1
        self._last_refresh = time.perf_counter()

    def _refresh_details(self, frames: dict, step: int) -> None:
        """The detail views of the latest step, as the finished run's dashboard draws them."""
        if not self.details:
            return
        figs = {name: F.STEP_VIEWS[name](frames, step, self.tokenizer) for name in self.details}
        if not self.views:
            self.views = {name: figure_widget(fig) for name, fig in figs.items()}
            self._details_box.children = tuple(self.views.values())
        else:
            for name, fig in figs.items():
                sync_figure(self.views[name], fig)

    def _finish(self) -> None:
        with self._draw_lock:
            self._draw_finished()

    def _watched_step(self) -> int:
        steps = [int(s) for s in self.result.trace.frame("steps").step]
        return self.live_step if self.live_step in steps else steps[-1]

    def _draw_finished(self) -> None:
        if self.result is None:
            msg = html.escape(f"{type(self.error).__name__}: {self.error}") if self.error else "no result"
            self.phase = "failed"
            self.status.value = f"<span style='color:#d62728'>failed: {msg}</span>"
            self.progress.bar_style = "danger"
            return
        r = self.result
        how = "stopped" if r.metrics.get("stopped") else "done"
        # The final strip and progress, from the finished trace (the last live redraw may be a step behind).
        self.tokens.value = self._strip({name: r.trace.frame(name) for name in _LIVE_KINDS})
        self.progress.value = len(r.token_ids)
        self.progress.bar_style = "warning" if how == "stopped" else "success"
        self.live_tokens = len(r.token_ids)
        m = r.metrics
        clock = html.escape(F.clock_label(r.trace.meta))
        self._done_text = (f"<b>{how}</b>: {len(r.token_ids)} tokens in {time.perf_counter() - self._t0:.1f} s · "
                           f"TPOT {m.get('tpot_ms', float('nan')):.3f} ms ({clock})")
        if self.auto_dashboard and self._shown:
            self._build_dashboard()
        elif self.auto_dashboard:  # drawn at that step when the view is shown or the dashboard asked for
            self._dashboard_pending = True
            self.status.value = f"{self._done_text} · dashboard at step {self._watched_step()}"
        else:
            self.dashboard_button.layout.display = None
            self.status.value = self._done_text
        self.phase = how

    def _build_dashboard(self) -> None:
        # The finished run has the full trace; its dashboard shows the same views (token strip included) with a
        # step slider, opened where the live view was.
        watched = self._watched_step()
        self.dashboard = Dashboard(self.result, self.tokenizer, step=watched, reuse=self.views)
        self._details_box.children = ()
        self.widget.children = tuple(w for w in self.widget.children if w is not self.tokens)
        self._result_box.children = (self.dashboard.widget,)
        self.dashboard_button.layout.display = "none"
        self.status.value = f"{self._done_text} · dashboard at step {watched}"

    def open_dashboard(self) -> "Dashboard | None":
        """Build the finished run's step dashboard in the view (what the "Open the step dashboard" button does);
        returns it (None while the run goes on)."""
        if not self._done.is_set() or self.result is None:
            return None
        with self._draw_lock:
            if self.dashboard is None:
                self.dashboard_button.disabled = True
                self.status.value = f"{self._done_text} · drawing the dashboard …"
                self._build_dashboard()
        return self.dashboard

    def static(self) -> dict[str, go.Figure]:
        """The live detail views as plain figures; once the run is done, its tokens per step (``steps``) and the
        dashboard's views (``dashboard_<view>``)."""
        if self.result is not None and (self.dashboard is not None or not self.views):
            dash = self.dashboard.static() if self.dashboard is not None else {}
            return {"steps": F.steps_figure(self.result), **{f"dashboard_{k}": v for k, v in dash.items()}}
        return {f"live_{name}": _static(w) for name, w in self.views.items()}

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


class _ShownBox(W.VBox):
    """The live view's box: tells its run when a page is given it to show (``on_show``), however it is displayed
    (the run itself, or ``run.widget``)."""

    on_show: Callable[[], None] | None = None

    def _repr_mimebundle_(self, **kwargs):
        if self.on_show is not None:
            self.on_show()
        return super()._repr_mimebundle_(**kwargs)


def _detail_names(details: "bool | Sequence[str]") -> tuple[str, ...]:
    """The live detail views: True → every per-step view but the token strip (the live run has its own)."""
    others = tuple(name for name in F.STEP_VIEWS if name != "tokens")
    if details is True:
        return others
    if details is False or details is None:
        return ()
    names = (details,) if isinstance(details, str) else tuple(details)
    bad = [n for n in names if n not in others]
    if bad:
        raise ValueError(f"details={details!r}: {bad} are not live views; use True, False or names from {others}.")
    return names


def live(engine, prompt, max_new_tokens: int = 64, **generate_kwargs: Any) -> LiveRun:
    """Start ``engine.generate(prompt, ...)`` in a background thread and return its live view (display it in a
    notebook cell; the cell returns at once). ``.stop()`` or the Stop button ends it after the current step
    (``result.metrics['stopped']`` is then True); ``.on_done(fn)`` runs ``fn(result)`` when it ends without
    blocking the kernel; ``.join()`` waits and returns the GenerationResult (it blocks the kernel, and with it
    the Stop button). Extra keyword arguments go to ``generate`` (a ``callback`` there is called before the
    view's own); ``tokenizer=``, ``min_interval=`` (seconds between redraws, default 0.5), ``pace=`` (least
    wall-clock seconds per step, for a demo a person can follow), ``details=`` (live routing / cache / timeline
    views of the latest step: True, or their names; on a CUDA clock each of those redraws synchronises the
    device), ``live_rows=`` (rows of the live token strip), ``dashboard=`` (False: the finished run's dashboard
    waits for a click), ``out=`` (a file keeping the steps done so far, rewritten whole every ``save_every``
    steps) and ``start=`` configure the view. See :class:`LiveRun`."""
    return LiveRun(engine, prompt, max_new_tokens, **generate_kwargs)


# ----------------------------------------------------------------------------------------- quant tuner
_TABLE_COLUMNS = ["strategy", "draft", "k", "tpot_ms", "speedup_vs_lru", "acceptance_rate", "recall", "hit_rate",
                  "draft_bytes", "slots_per_layer"]


class QuantTuner:
    """Tune the draft's quantization and K, and see what it does to specter against baselines at the same
    expert budget (same device bytes: a bigger draft leaves fewer full-precision slots).

    Controls: ``bits`` (2, 3, 4, 8), ``group_size`` (32, 64, 128), ``method`` (rtn, hqq), ``k`` (draft length),
    ``auto`` (rerun on every change) and ``run_button``. :meth:`run` does one evaluation; ``table`` is the last
    result (a DataFrame), shown in ``table_html``; ``figure`` is a :class:`~.panel.FigurePanel` of TPOT, recall and
    acceptance; ``status`` says how long quantizing took. Results are cached per setting, so going back is
    instant."""

    def __init__(self, model, tokenizer, prompts, expert_budget: "float | int | str" = 0.5,
                 hardware: str = "rtx4090-pcie4", max_new_tokens: int = 24,
                 baselines: Sequence[str] = ("lru", "specmoeoff"), bits: int = 4, group_size: int = 64,
                 method: str = "rtn", k: int = 8, auto: bool = True, run_now: bool = True,
                 cost_shape: str | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]  # one prompt (text or ids), not a list of prompts
        self.prompts = list(prompts)
        if not self.prompts:
            raise ValueError("prompts is empty: give at least one prompt.")
        for b in baselines:
            get_strategy(b)
        self.strategies = ["specter"] + [b for b in baselines if b != "specter"]
        self.expert_budget, self.hardware, self.max_new_tokens = expert_budget, hardware, max_new_tokens
        self.cost_shape = cost_shape  # price as a real model (projected), like the other notebook tables
        self.bits = W.Dropdown(options=[2, 3, 4, 8], value=bits, description="bits", layout=W.Layout(width="150px"))
        self.group_size = W.Dropdown(options=[32, 64, 128], value=group_size, description="group",
                                     layout=W.Layout(width="160px"))
        # The label is a widget of its own beside the buttons: as the buttons' description it sat above them.
        self.method = W.ToggleButtons(options=["rtn", "hqq"], value=method, style={"button_width": "60px"},
                                      tooltips=["round to nearest", "half-quadratic quantization"])
        method_label = W.Label("method", layout=W.Layout(width="56px", margin="0 0 0 16px"))
        self.k = W.IntSlider(value=k, min=1, max=16, description="K", continuous_update=False,
                             layout=W.Layout(width="260px"))
        self.auto = W.Checkbox(value=auto, description="run on change", indent=False, layout=W.Layout(width="130px"))
        self.run_button = W.Button(description="Run", icon="play", button_style="primary")
        self.status = W.HTML()
        self.stale = W.HTML()  # "stale — press Run" while the controls differ from what the table shows
        self.table_html = W.HTML()
        self.save_button = W.Button(description="Save table", icon="download", layout=W.Layout(width="120px"),
                                    tooltip="write the table to a CSV file beside the notebook")
        self.saved = W.Box()  # a link that delivers the file written (download.py)
        self.save_button.on_click(lambda _: self._save_clicked())
        self.table: pd.DataFrame | None = None
        self._shown_setting: tuple | None = None
        self.quantize_seconds: dict = {}
        self._cache: dict = {}
        self.clock = "simulated"
        self.figure = figure_widget(F.tuner_figure(None))
        self.run_button.on_click(lambda _: self.run())
        for w in (self.bits, self.group_size, self.method, self.k):
            w.observe(self._on_change, names="value")
        self.auto.observe(lambda _: self._mark_stale(), names="value")
        self.widget = W.VBox([W.HBox([self.bits, self.group_size, method_label, self.method],
                                     layout=W.Layout(align_items="center")),
                              W.HBox([self.k, self.auto, self.run_button, self.stale]), self.status,
                              self.table_html, W.HBox([self.save_button, self.saved]), self.figure])
        if run_now:  # in the cell that makes it: a bar while the strategies run (E7)
            self.run(progress=True)

    @property
    def spec(self) -> QuantSpec:
        return QuantSpec(int(self.bits.value), int(self.group_size.value), str(self.method.value))

    def _setting(self) -> tuple:
        return (int(self.bits.value), int(self.group_size.value), str(self.method.value), int(self.k.value))

    def _on_change(self, change: dict) -> None:
        if self.auto.value:
            self.run()
        else:
            self._mark_stale()

    def _mark_stale(self) -> None:
        """Say when the table and chart no longer show the controls' setting (and dim them until Run)."""
        shown = self._shown_setting
        if shown is None or shown == self._setting():
            self.stale.value = ""
            self.table_html.layout.opacity = None
            return
        b, g, m, k = shown
        self.stale.value = (f"<span style='color:#b35900;font-size:13px'>&#9888; <b>stale</b> — press Run: the table "
                            f"shows int{b}-g{g}-{m}, K={k}</span>")
        self.table_html.layout.opacity = "0.55"

    def save(self, path: str = "quant_tuner.csv") -> str:
        """Write the last table to a CSV file (default: beside the notebook); returns the path."""
        if self.table is None:
            raise ValueError("QuantTuner.save: no table yet; press Run (or call run()) first.")
        with atomic_open(path, "w", newline="") as f:  # a kernel lost mid-save leaves the last table, whole
            self.table.to_csv(f, index=False)
        return path

    def _save_clicked(self) -> None:
        try:
            self.saved.children = (file_link(self.save()),)
        except ValueError as exc:
            self.saved.children = (W.HTML(html.escape(str(exc))),)

    def _evaluate(self, name: str, spec, k: int) -> tuple[dict, str | None]:
        """Mean metrics of one strategy over the prompts (cached per setting); the error text if the setting
        does not fit the budget."""
        speculative = get_strategy(name).speculative
        key = (name, spec if speculative else None, k if name == "specter" else None)
        if key in self._cache:
            return self._cache[key], None
        row: dict[str, Any] = {"strategy": name, "draft": spec.label if speculative else "—",
                               "k": (k if name == "specter" else get_strategy(name).k) if speculative else None}
        eng = try_engine(self.model, self.tokenizer, name, expert_budget=self.expert_budget, hardware=self.hardware,
                         cost_shape=self.cost_shape, draft=spec if speculative else None,
                         k=k if name == "specter" else None)
        if isinstance(eng, DoesNotFit):  # e.g. an 8-bit draft leaves no room for one slot per layer
            return row, f"{name}: {eng.reason}"
        if speculative and spec not in self.quantize_seconds:
            t0 = time.perf_counter()
            eng.draft  # quantizes (or reuses a draft another engine on this model already built)
            self.quantize_seconds[spec] = time.perf_counter() - t0
        runs = run_prompts(eng, self.prompts, self.max_new_tokens)
        row.update(runs.means(("tpot_ms", "acceptance_rate", "recall", "hit_rate")))  # NaN-aware means
        row["draft_bytes"] = int(runs.first("draft_bytes") or 0)
        row["slots_per_layer"] = int(runs.first("slots_per_layer") or 0)
        self.clock = F.clock_label({key: runs.first(key) for key in ("clock", "profile", "projected", "cost_shape")})
        self._cache[key] = row
        return row, None

    def run(self, progress: bool = False) -> pd.DataFrame:
        """Evaluate the current setting for specter and the baselines; update table, figure and status.
        ``progress``: a bar over the strategies in the output of the cell that calls it (not for a click: a
        button's call has no cell to show it in, and the status line says it runs)."""
        spec, k = self.spec, int(self.k.value)
        self.status.value = f"running {spec.label}, K={k} …"
        rows, errors = [], []
        # (kept when done: a bar closed with leave=False left a closed widget in the output, which the page
        # reported as 'widget model not found' after a reload)
        for name in tqdm(self.strategies, desc=f"QuantTuner: {spec.label}, K={k}", disable=not progress):
            row, err = self._evaluate(name, spec, k)
            rows.append(row)
            if err:
                errors.append(err)
        table = pd.DataFrame(rows).reindex(columns=_TABLE_COLUMNS)
        if "lru" in set(table.strategy):
            base = float(table.loc[table.strategy == "lru", "tpot_ms"].iloc[0])
            table["speedup_vs_lru"] = base / table.tpot_ms
        self.table = table
        self._shown_setting = (spec.bits, spec.group_size, spec.method, k)
        self._mark_stale()
        self.table_html.value = self._table_to_html(table)
        sync_figure(self.figure, F.tuner_figure(table, self.clock))
        q = self.quantize_seconds.get(spec)
        qtxt = (f"draft {spec.label} quantized in {q:.2f} s" if q is not None else f"draft {spec.label} not built")
        err = "".join(f"<br><span style='color:#d62728'>{html.escape(e)}</span>" for e in errors)
        self.status.value = (f"<span style='font-size:13px'>{qtxt} · budget {html.escape(str(self.expert_budget))} · "
                             f"{len(self.prompts)} prompt(s) × {self.max_new_tokens} tokens · "
                             f"{html.escape(self.clock)}{err}</span>")
        return table

    @staticmethod
    def _table_to_html(table: pd.DataFrame) -> str:
        # Rates as fractions and "—" where a value does not apply, as sl.viz.table shows them below the tuner (E11).
        fmt = {"k": "{:.0f}", "tpot_ms": "{:.4f}", "speedup_vs_lru": "{:.2f}×", "acceptance_rate": "{:.3f}",
               "recall": "{:.3f}", "hit_rate": "{:.3f}", "draft_bytes": "{:,.0f}"}
        shown = table.copy().astype(object)
        for col, f in fmt.items():
            shown[col] = [f.format(v) if isinstance(v, (int, float)) and not pd.isna(v) else "—" for v in table[col]]
        shown = shown.fillna("—")
        # Compact, and headers may break after an underscore, so all ten columns fit a notebook cell.
        page = shown.to_html(index=False, classes="sl-tuner", border=0, escape=True)
        for col in shown.columns:
            page = page.replace(f"<th>{col}</th>", f"<th>{html.escape(col).replace('_', '_<wbr>')}</th>")
        return ("<style>.sl-tuner{font-size:12px;border-collapse:collapse}.sl-tuner td{padding:2px 6px;"
                "text-align:right;white-space:nowrap}.sl-tuner th{padding:2px 6px;text-align:right;"
                "vertical-align:bottom}</style>" + page)

    def static(self) -> go.Figure:
        """The chart as a plain figure."""
        return _static(self.figure)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
