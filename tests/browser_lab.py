"""A JupyterLab server and a headless Chromium page driving it, for the browser tests (``tests/test_browser.py``).

The server is started here, on 127.0.0.1 with a random token, its settings and workspaces in a temporary folder
(so nothing of the user's JupyterLab leaks in, and it never asks to fetch news). Its kernels import specter_lab
from this checkout (``PYTHONPATH``). The browser is the system Chromium (Debian's ``chromium``) driven by
Playwright's Python package; Playwright's own browser downloads are never used.

Page helpers read what the page actually drew: plotly's graph divs (``.js-plotly-plot``), their size, trace count
and title text, rather than any kernel-side state.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# Debian's chromium, or one named by SPECTER_LAB_CHROMIUM.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")

# Headless, and quiet on a machine without network: without the background-networking flags Chromium keeps
# retrying its update, sync and component services.
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]

# JupyterLab settings for a test session: no news/update checks (they would hit the network), and the document
# is saved only when the test asks.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    # Every cell attached and laid out: with the default 'contentVisibility' an off-screen output is not laid
    # out, and a figure there would read as 0 px without being broken.
    # recordTiming: each cell's kernel start and end in its metadata, to find the cells that ran long (E7).
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none", "recordTiming": True},
}

# JupyterLab's own extensions the test's Lab runs without. The debugger asks a new kernel for its state; when a
# notebook is closed and its kernel shut down before the answer (a few seconds after a page reload), it logs
# "Could not restore the debugger state: Canceled future for debug_request ..." (JupyterLab's race, 1 run in 2
# of the full browser test): noise in the closing check (D9), which is about the notebooks' widgets.
DISABLED_EXTENSIONS = {"@jupyterlab/debugger-extension": True}


def find_chromium() -> str | None:
    """Path of a system Chromium, or None."""
    named = os.environ.get("SPECTER_LAB_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    for path in CHROMIUM_CANDIDATES:
        if Path(path).is_file():
            return path
    return shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    """``jupyter lab`` serving ``root`` (a folder of notebooks), started by :meth:`start`, stopped by :meth:`stop`."""

    root: Path
    workdir: Path
    port: int = 0
    token: str = ""
    proc: subprocess.Popen | None = None
    log_path: Path = field(default=Path())

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        """The notebook in a workspace of its own: a new tab restores only this notebook, not the tabs of earlier
        tests (whose kernels are gone, so their widgets would log 'widget model not found')."""
        workspace = "".join(ch if ch.isalnum() else "-" for ch in Path(notebook).stem)
        return f"{self.base}/lab/workspaces/{workspace}/tree/{notebook}?token={self.token}"

    def start(self, timeout: float = 120) -> "Lab":
        self.port = _free_port()
        self.token = os.urandom(12).hex()
        settings = self.workdir / "lab-settings"
        for rel, values in LAB_SETTINGS.items():
            path = settings / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        config = self.workdir / "jupyter-config"
        (config / "labconfig").mkdir(parents=True, exist_ok=True)
        page_config = {"disabledExtensions": DISABLED_EXTENSIONS}
        (config / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
        env = dict(os.environ)
        # The kernels must import this checkout's specter_lab, whatever the environment's install points to.
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
        env.update(JUPYTER_CONFIG_DIR=str(config), JUPYTERLAB_SETTINGS_DIR=str(settings),
                   JUPYTERLAB_WORKSPACES_DIR=str(self.workdir / "lab-ws"),
                   JUPYTER_RUNTIME_DIR=str(self.workdir / "runtime"), PYTHONUNBUFFERED="1")
        self.log_path = self.workdir / "jupyterlab.log"
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip", "127.0.0.1", "--port", str(self.port),
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               "--ServerApp.port_retries=0", "--LabApp.expose_app_in_browser=True",
               # the extension manager would query PyPI; terminals are not needed
               "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
            cmd.append("--allow-root")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def shutdown_kernels(self) -> None:
        """Shut down every kernel of the server (REST API), so the next notebook has the CPUs to itself."""
        try:
            with urllib.request.urlopen(f"{self.base}/api/kernels?token={self.token}", timeout=10) as r:
                kernels = json.load(r)
            for k in kernels:
                req = urllib.request.Request(f"{self.base}/api/kernels/{k['id']}?token={self.token}", method="DELETE")
                urllib.request.urlopen(req, timeout=30).close()
        except OSError as exc:  # a server that is gone has no kernels left either
            print(f"shutting down kernels: {exc}")

    def stop(self) -> None:
        """Stop the server (and with it its kernels): SIGTERM to its own process group, then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


# ----------------------------------------------------------------------------------------- page helpers
# JavaScript run in the page. `jupyterapp` is exposed by --LabApp.expose_app_in_browser.
_JS_NOTEBOOK_STATE = """() => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  if (!w || !w.content || !w.sessionContext) return {ready: false};
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  const cells = w.content.widgets.filter(c => c.model.type === 'code');
  const errors = [];
  cells.forEach((c, i) => {
    const outs = c.model.outputs.toJSON();
    outs.filter(o => o.output_type === 'error').forEach(o => errors.push({cell: i, ename: o.ename, evalue: o.evalue}));
  });
  return {ready: w.context.isReady && !!kernel, status: kernel ? kernel.status : 'none',
          executed: cells.filter(c => c.model.executionCount !== null).length, cells: cells.length, errors,
          running: cells.some(c => c.model.executionState === 'running' ||
                                   (c.promptNode && c.promptNode.textContent.includes('*')))};
}"""

# Every plotly graph in the notebook (or in the code cell whose source contains `needle`): size, what plotly.js
# was given (`gd.data`: trace count, per-trace x/y/text), what it drew (trace groups in the SVG), title and
# subplot-title text. The cell index is the position among the notebook's cells (markdown included).
_JS_PLOTS = """(needle) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const cells = nb.widgets;
  const scopes = needle === null ? cells : cells.filter(c => c.model.type === 'code' &&
                                                          c.model.sharedModel.getSource().includes(needle));
  const short = v => (v === undefined || v === null) ? null : Array.from(v).slice(0, 64).map(String);
  const out = [];
  // JupyterLab's plotly renderer puts js-plotly-plot on the output node itself (a static figure); a
  // FigureWidget's graph sits inside its output: both selectors are needed.
  const sel = '.jp-OutputArea-output.js-plotly-plot, .jp-OutputArea-output .js-plotly-plot';
  scopes.forEach(c => c.node.querySelectorAll(sel).forEach(gd => {
    // the drawn figure (plotly's svg-container), not the graph div: the div always spans the cell
    const r = (gd.querySelector('.svg-container') || gd).getBoundingClientRect();
    const area = gd.closest('.jp-OutputArea-output');
    const title = gd.querySelector('.gtitle');
    const groups = Array.from(gd.querySelectorAll('.modebar .modebar-group'));
    const mb = gd.querySelector('.modebar');
    const tr = title ? title.getBoundingClientRect() : null, mr = mb ? mb.getBoundingClientRect() : null;
    // the title's text and the modebar's box overlap (whether or not the modebar is showing right now)
    const covered = !!(tr && mr && mr.width > 0 && tr.width > 0 && tr.left < mr.right && mr.left < tr.right &&
                       tr.top < mr.bottom && mr.top < tr.bottom);
    out.push({
      cell: cells.indexOf(c), width: Math.round(r.width), height: Math.round(r.height),
      area_width: area ? Math.round(area.getBoundingClientRect().width) : null, title_covered: covered,
      traces: Array.isArray(gd.data) ? gd.data.length : -1,
      drawn: gd.querySelectorAll('.trace, .hm, .heatmaplayer image').length,
      title: title ? title.textContent : '',
      annotations: Array.from(gd.querySelectorAll('.annotation-text')).map(t => t.textContent),
      texts: Array.from(gd.querySelectorAll('.barlayer .trace text, .heatmaplayer text, .texttemplate text'))
        .map(t => t.textContent),
      data: Array.isArray(gd.data)
        ? gd.data.map(t => ({type: t.type, x: short(t.x), y: short(t.y), text: short(t.text)})) : [],
      // plotly.js hides a hover-only modebar by its groups' opacity, not the bar's
      modebar_visible: groups.some(g => parseFloat(getComputedStyle(g).opacity) > 0.01 &&
                                        getComputedStyle(g).display !== 'none'),
      widget: !!gd.closest('.jupyter-widgets, .widget-box'),  // an ipywidgets view, not a static figure output
    });
  }));
  return out;
}"""

# Text labels of one plotly graph (bar and scatter texts) against its error bars, and the smallest label font:
# a label a whisker crosses, or one plotly shrank below a readable size, is a figure nobody can read.
_JS_LABELS_CLEAR = """(needle) => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets;
  const c = cells.find(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(needle));
  if (!c) return null;
  const out = [];
  c.node.querySelectorAll('.js-plotly-plot').forEach(gd => {
    const labels = Array.from(gd.querySelectorAll('.barlayer .trace text, .scatterlayer .textpoint text'))
      .filter(t => t.textContent.trim() && t.getBoundingClientRect().width > 0);
    const bars = Array.from(gd.querySelectorAll('.errorbar path')).map(e => e.getBoundingClientRect())
      .filter(r => r.height > 0);
    const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
    const struck = labels.filter(t => bars.some(b => hit(t.getBoundingClientRect(), b))).map(t => t.textContent);
    const sizes = labels.map(t => parseFloat(getComputedStyle(t).fontSize) || parseFloat(t.style.fontSize));
    out.push({labels: labels.length, errorbars: bars.length, struck,
              min_font: sizes.length ? Math.min(...sizes) : null});
  });
  return out;
}"""

# Axis titles against legend items in one graph: [axis title, legend text] pairs whose boxes overlap.
_JS_AXIS_LEGEND = """(needle) => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets;
  const scopes = cells.filter(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(needle));
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const out = [];
  scopes.forEach(c => c.node.querySelectorAll('.js-plotly-plot').forEach(gd => {
    const titles = Array.from(gd.querySelectorAll('.xtitle, .ytitle')).filter(t => t.textContent.trim());
    const items = Array.from(gd.querySelectorAll('.legend .traces'));
    titles.forEach(t => items.forEach(i => {
      if (hit(t.getBoundingClientRect(), i.getBoundingClientRect()))
        out.push([(gd.querySelector('.gtitle') || {}).textContent || '', t.textContent, i.textContent]);
    }));
  }));
  return out;
}"""

# stderr outputs (JupyterLab draws them red) of the notebook: [cell index, text].
_JS_STDERR = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets;
  const out = [];
  const sel = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
  cells.forEach((c, i) => c.node.querySelectorAll(sel).forEach(o => out.push([i, o.innerText.slice(0, 300)])));
  return out;
}"""

# Installed in every page before its own scripts (launch): the main thread's long tasks (> 50 ms) from the page's
# start, and for each long animation frame over 300 ms the scripts it ran (Chromium's LoAF attribution), so that a
# freeze can be named, not only measured.
_JS_INIT = """(() => {
  window.__slLongTasks = [];
  window.__slLongFrom = 0;
  window.__slFrames = [];
  try {
    new PerformanceObserver(list => list.getEntries().forEach(e =>
      window.__slLongTasks.push([Math.round(e.startTime), Math.round(e.duration)]))).observe({type: 'longtask', buffered: true});
  } catch (e) {}
  try {
    new PerformanceObserver(list => list.getEntries().forEach(e => {
      if (e.duration < 300) return;
      window.__slFrames.push({t: Math.round(e.startTime), ms: Math.round(e.duration), scripts: (e.scripts || [])
        .filter(s => s.duration >= 20).map(s => ({ms: Math.round(s.duration), invoker: String(s.invoker).slice(0, 80),
          layout_ms: Math.round(s.forcedStyleAndLayoutDuration || 0),
          src: String(s.sourceURL || '').split('/').pop().slice(0, 60), fn: s.sourceFunctionName || ''}))});
    })).observe({type: 'long-animation-frame', buffered: true});
  } catch (e) {}
})();"""

# From now on (the tasks before stay recorded, but long_tasks() leaves them out).
_JS_OBSERVE_LONG_TASKS = """() => { window.__slLongFrom = performance.now(); }"""

# Every 100 ms while cells run: per code cell (by model id) when the page first showed it running, when it last
# did, and when its output first showed progress: an ipywidgets progress bar (tqdm's, a live view's), a <progress>
# element or tqdm's text bar. What a person sees while waiting on a cell (E7).
_JS_WATCH_CELLS = """() => {
  if (window.__slCells) return;
  window.__slCells = {};
  const nb = window.jupyterapp.shell.currentWidget.content;
  const shows = c => !!c.node.querySelector('.jp-Cell-outputArea .widget-hprogress, .jp-Cell-outputArea progress') ||
                     /\\d+%\\|/.test(c.node.querySelector('.jp-Cell-outputArea').textContent);
  window.__slCellsTimer = setInterval(() => {
    const t = performance.now();
    nb.widgets.forEach((c, i) => {
      if (c.model.type !== 'code') return;
      const running = c.model.executionState === 'running' ||
                      (c.promptNode && c.promptNode.textContent.includes('*'));
      if (!running) return;
      const r = window.__slCells[c.model.id] = window.__slCells[c.model.id] || {index: i, first: t, progress: null};
      r.last = t;
      if (r.progress === null && shows(c)) r.progress = t;
    });
  }, 100);
}"""

# Per code cell: index, its first source line, kernel seconds (recordTiming: execute_input to execute_reply), and
# what the watcher saw (seconds from when it showed running to its first progress; null: none).
_JS_CELL_REPORT = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const seen = window.__slCells || {};
  return nb.widgets.map((c, i) => {
    if (c.model.type !== 'code') return null;
    const ex = c.model.getMetadata('execution') || {};
    const t0 = Date.parse(ex['iopub.execute_input']), t1 = Date.parse(ex['shell.execute_reply']);
    const w = seen[c.model.id];
    return {index: i, source: c.model.sharedModel.getSource().split('\\n').find(l => l.trim() && !l.startsWith('#')) || '',
            seconds: isFinite(t1 - t0) ? (t1 - t0) / 1000 : null,
            progress_after: w && w.progress !== null ? (w.progress - w.first) / 1000 : null};
  }).filter(Boolean);
}"""

# Every progress bar in the notebook's outputs: [cell index, its bar style ('success', 'danger', 'info', 'warning'
# or '' for none), value, max] (ipywidgets' IntProgress / FloatProgress, tqdm's included).
_JS_PROGRESS_BARS = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const out = [];
  nb.widgets.forEach((c, i) => c.node.querySelectorAll('.jp-Cell-outputArea .widget-hprogress').forEach(w => {
    const bar = w.querySelector('.progress-bar');
    const style = bar ? (Array.from(bar.classList).find(k => k.startsWith('progress-bar-')) || '') : '';
    const pct = bar ? parseFloat(bar.style.width || bar.style.height || '0') : 0;
    out.push([i, style.replace('progress-bar-', ''), Math.round(pct)]);
  }));
  return out;
}"""

# Every HTML table in the notebook's outputs wider than its output area: [cell index, table px, area px, header].
# A table inside a closed <details> has no box and is not counted (it is shown on request, scrolling sideways).
_JS_WIDE_TABLES = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets;
  const out = [];
  cells.forEach((c, i) => c.node.querySelectorAll('.jp-OutputArea-output table').forEach(t => {
    if (t.closest('details:not([open])')) return;  // not shown (Chromium still lays it out)
    const r = t.getBoundingClientRect();
    const area = t.closest('.jp-OutputArea-output').getBoundingClientRect();
    if (r.width > 0 && r.width > area.width + 1)
      out.push([i, Math.round(r.width), Math.round(area.width), (t.querySelector('th') || {}).textContent || '']);
  }));
  return out;
}"""

# Watch a live view's status line: every change of its text, with the token strip's title and the Stop button's
# state at that moment, and the page time (ms): what a person saw, in order, however fast it changed.
_JS_WATCH_STATUS = """(tag) => {
  const cell = document.querySelector(`[data-sl-cell="${tag}"]`);
  const status = cell.querySelector('.widget-html-content');
  window.__slStatus = [];
  const record = () => {
    const strips = Array.from(cell.querySelectorAll('.sl-strip > div:first-child')).map(d => d.textContent);
    const stop = Array.from(cell.querySelectorAll('button')).find(b => b.textContent.trim() === 'Stop');
    window.__slStatus.push({t: performance.now(), text: status.textContent.trim(), strip: strips[0] || '',
                            stop_disabled: stop ? stop.disabled : null});
  };
  record();
  new MutationObserver(record).observe(status, {childList: true, subtree: true, characterData: true});
}"""

# The text of a code cell's outputs (the first cell whose source contains `needle`).
_JS_CELL_TEXT = """(needle) => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets;
  const c = cells.find(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(needle));
  return c ? c.node.querySelector('.jp-Cell-outputArea').innerText : null;
}"""

# Append a code cell with `source` at the end of the notebook and run it.
_JS_APPEND_AND_RUN = """async (source) => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  await app.commands.execute('notebook:insert-cell-below');
  nb.activeCell.model.sharedModel.setSource(source);
  await app.commands.execute('notebook:run-cell');
  return nb.widgets.length - 1;
}"""


class Page:
    """One browser page on the lab, collecting console errors and page errors as they happen."""

    def __init__(self, page: Any, lab: Lab, shots: Path | None = None) -> None:
        self.page = page
        self.lab = lab
        self.shots = shots  # where screenshot_element() writes; None: it does nothing
        self.console: list[dict] = []
        self.retried: list[dict] = []  # console lines of a reload that was retried (reload_until)
        page.on("console", lambda m: self.console.append({"type": m.type, "text": m.text,
                                                          "url": (m.location or {}).get("url", "")}))
        page.on("pageerror", lambda e: self.console.append({"type": "pageerror", "url": "",
                                                             "text": f"{e}\n{getattr(e, 'stack', '') or ''}"}))

    # notebook --------------------------------------------------------------------------------
    def open(self, notebook: str, timeout: float = 120) -> None:
        self.page.goto(self.lab.url(notebook), wait_until="domcontentloaded")
        self.wait_for_kernel(timeout)

    def state(self) -> dict:
        return self.page.evaluate(_JS_NOTEBOOK_STATE)

    def wait_for_kernel(self, timeout: float = 120) -> dict:
        """Until the notebook is open and its kernel is idle."""
        deadline = time.monotonic() + timeout
        st: dict = {}
        while time.monotonic() < deadline:
            try:
                st = self.state()
            except Exception:  # the page is still navigating
                st = {}
            if st.get("ready") and st.get("status") == "idle":
                return st
            time.sleep(0.5)
        raise TimeoutError(f"the notebook's kernel was not idle within {timeout:.0f} s: {st}")

    def command(self, name: str, args: dict | None = None) -> None:
        """A JupyterLab command, as the menus and the command palette run it."""
        self.page.evaluate("([name, args]) => window.jupyterapp.commands.execute(name, args)", [name, args or {}])

    def run_all(self, timeout: float = 600) -> dict:
        """Run > Run All Cells, then wait until every code cell ran and the kernel is idle again; raises on the
        first cell that failed."""
        self.command("notebook:run-all-cells")
        return self.wait_run_all(timeout)

    def wait_run_all(self, timeout: float = 600) -> dict:
        """Until every code cell ran and the kernel is idle again (after ``notebook:run-all-cells``)."""
        deadline = time.monotonic() + timeout
        st: dict = {}
        while time.monotonic() < deadline:
            st = self.state()
            if st.get("errors"):
                raise AssertionError(f"a cell failed under Run All: {st['errors']}")
            if st.get("status") == "idle" and st.get("executed") == st.get("cells") and not st.get("running"):
                return st
            time.sleep(1.0)
        raise TimeoutError(f"Run All did not finish within {timeout:.0f} s: {st}")

    def save(self) -> None:
        self.command("docmanager:save")
        self.page.wait_for_timeout(1500)

    def reload(self, timeout: float = 120) -> None:
        self.page.reload(wait_until="domcontentloaded")
        self.wait_for_kernel(timeout)

    # reading what was drawn ------------------------------------------------------------------
    def plots(self, needle: str | None = None) -> list[dict]:
        """The plotly graphs drawn in the notebook, or in the code cell whose source contains ``needle``."""
        return self.page.evaluate(_JS_PLOTS, needle)

    def pointer_away(self) -> None:
        """Move the mouse to the page's top-left corner (menu bar), off every figure: a hover-only modebar hides."""
        self.page.mouse.move(2, 2)
        self.page.wait_for_timeout(600)  # plotly's modebar fades out in 0.3 s

    def labels_clear(self, needle: str) -> list[dict] | None:
        """Per graph in the cell with ``needle``: its text labels, error bars, the labels a bar's whisker strikes
        and the smallest label font (px)."""
        return self.page.evaluate(_JS_LABELS_CLEAR, needle)

    def axis_titles_on_legend(self, needle: str) -> list[list[str]]:
        """[figure title, axis title, legend item] for every axis title that overlaps a legend item."""
        return self.page.evaluate(_JS_AXIS_LEGEND, needle)

    def stderr_outputs(self) -> list[list]:
        """[cell index, text] of every stderr output (the red boxes) in the notebook."""
        return self.page.evaluate(_JS_STDERR)

    def observe_long_tasks(self) -> None:
        """Count the page's main-thread long tasks from now on (see :meth:`long_tasks`; the page records them
        from its start, _JS_INIT)."""
        self.page.evaluate(_JS_OBSERVE_LONG_TASKS)

    def long_tasks(self, since: float | None = None) -> list[list[int]]:
        """[start ms, duration ms] of each main-thread long task since :meth:`observe_long_tasks` (or since the
        page time ``since``, ms)."""
        return self.page.evaluate("(since) => (window.__slLongTasks || []).filter(([t]) => t >= "
                                  "(since === null ? window.__slLongFrom : since))", since)

    def long_frames(self, since: float = 0) -> list[dict]:
        """Long animation frames (over 300 ms) since the page time ``since``: {t, ms, scripts: [{ms, invoker,
        src, fn}]}, what each freeze ran."""
        return self.page.evaluate("(since) => (window.__slFrames || []).filter(f => f.t >= since)", since)

    def watch_cells(self) -> None:
        """Start recording, every 100 ms, which cells run and when their output first shows progress
        (:meth:`cell_report`)."""
        self.page.evaluate(_JS_WATCH_CELLS)

    def cell_report(self) -> list[dict]:
        """Per code cell: {index, source (first code line), seconds (kernel time, recordTiming), progress_after
        (seconds from the page showing it running to its first progress bar; None: never)}."""
        return self.page.evaluate(_JS_CELL_REPORT)

    def progress_bars(self) -> list[list]:
        """[cell index, bar style ('success', 'danger', 'info', 'warning', '' = none), percent drawn] of every
        progress bar in the notebook's outputs."""
        return self.page.evaluate(_JS_PROGRESS_BARS)

    def wide_tables(self) -> list[list]:
        """[cell index, table width, output width, first header] of every output table wider than its cell."""
        return self.page.evaluate(_JS_WIDE_TABLES)

    def watch_status(self, needle: str) -> None:
        """Start recording every change of the status line of the live view in the cell with ``needle``
        (:meth:`status_log`)."""
        self.cell(needle)  # tags the cell's node
        tag = self.page.evaluate("""(needle) => window.jupyterapp.shell.currentWidget.content.widgets
            .find(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(needle)).model.id""",
                                 needle)
        self.page.evaluate(_JS_WATCH_STATUS, tag)

    def status_log(self) -> list[dict]:
        """{t (page ms), text, strip (the token strip's title), stop_disabled} per status change so far."""
        return self.page.evaluate("() => window.__slStatus || []")

    def now_ms(self) -> float:
        return self.page.evaluate("() => performance.now()")

    def close_and_shutdown(self, settle_ms: int = 3000) -> None:
        """File > Close and Shut Down Notebook, as a user does it (accepting the dialog), then a few seconds for
        whatever the page still sends."""
        self.page.evaluate("() => { window.jupyterapp.commands.execute('notebook:close-and-shutdown'); }")
        try:
            self.page.locator(".jp-Dialog .jp-mod-accept").first.click(timeout=10_000)
        except Exception:  # no dialog (an older JupyterLab closes at once)
            pass
        self.page.wait_for_timeout(settle_ms)

    def markdown_cell(self, needle: str) -> Any:
        """A locator of the current notebook's markdown cell whose source contains ``needle``."""
        return self._tagged_cell("markdown", needle)

    def cell_text(self, needle: str) -> str | None:
        """The output text of the code cell whose source contains ``needle``."""
        return self.page.evaluate(_JS_CELL_TEXT, needle)

    def cell(self, needle: str) -> Any:
        """A locator of the current notebook's code cell whose source contains ``needle`` (for clicks and key
        presses)."""
        return self._tagged_cell("code", needle)

    def _tagged_cell(self, kind: str, needle: str) -> Any:
        """The current notebook's first ``kind`` cell whose source contains ``needle``, as a locator. The cell's
        node is tagged from the notebook model: other notebooks' tabs stay in the DOM."""
        tag = self.page.evaluate("""([kind, needle]) => {
            const c = window.jupyterapp.shell.currentWidget.content.widgets
              .find(c => c.model.type === kind && c.model.sharedModel.getSource().includes(needle));
            if (!c) return null;
            c.node.dataset.slCell = c.model.id;
            return c.model.id; }""", [kind, needle])
        if tag is None:
            raise LookupError(f"no {kind} cell contains {needle!r}")
        return self.page.locator(f'[data-sl-cell="{tag}"]')

    def append_and_run(self, source: str, timeout: float = 120) -> None:
        """Add a code cell with ``source`` at the end and run it, as a user typing a new cell would."""
        self.page.evaluate(_JS_APPEND_AND_RUN, source)
        self.page.wait_for_timeout(500)
        self.wait_for_kernel(timeout)

    def wait_for(self, predicate, timeout: float = 60, interval: float = 0.5, what: str = "condition"):
        """Poll ``predicate()`` until it returns something truthy; returns it."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(f"{what} not met within {timeout:.0f} s")

    def reload_until(self, predicate, what: str, timeout: float = 90):
        """Reload and wait for ``predicate``. Once, if the widgets did not come back and the widget manager logged
        'widget model not found' (its known race after a reload: it renders a saved view before the kernel's
        comm infos arrive, seen on a loaded machine), reload again: a user would. The retry is printed and its
        console lines are kept apart (``self.retried``), not hidden from the artifacts."""
        mark = len(self.console)
        self.reload()
        try:
            return self.wait_for(predicate, timeout=timeout, what=what)
        except TimeoutError:
            lost = [m for m in self.console[mark:] if "widget model not found" in m["text"]]
            if not lost:
                raise
        print(f"{what}: the widget manager lost {len(lost)} models after the reload; reloading once more")
        self.retried.extend(self.console[mark:])
        del self.console[mark:]
        self.reload()
        return self.wait_for(predicate, timeout=timeout, what=f"{what} (after a second reload)")

    def errors(self) -> list[dict]:
        """Console errors and uncaught page errors, plus the widget manager's 'Error setting state' warnings
        (ipywidgets logs a failed state update at that level, and it is what a broken FigureWidget leaves)."""
        return [m for m in self.console if m["type"] in ("error", "pageerror")
                or (m["type"] == "warning" and "Error setting state" in m["text"])]

    def screenshot_element(self, locator: Any, name: str, max_height: int | None = None) -> Path | None:
        """A PNG of one element (a cell with its outputs) in ``shots``, if set (for the docs, or a CI artifact);
        ``max_height`` keeps only its top (a small PNG of a tall cell)."""
        if self.shots is None:
            return None
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        # A cell taller than the notebook panel would be cut by the panel's own scrolling: make the window tall
        # enough for it, then put it back (the figures' width does not change).
        size = self.page.viewport_size
        box = locator.bounding_box()
        if size and box and box["height"] + 250 > size["height"]:
            self.page.set_viewport_size({"width": size["width"], "height": int(box["height"]) + 250})
        try:
            locator.scroll_into_view_if_needed()
            self.page.wait_for_timeout(500)
            box = locator.bounding_box()
            if max_height and box and box["height"] > max_height:
                self.page.screenshot(path=str(path), clip={**box, "height": max_height})
            else:
                locator.screenshot(path=str(path))
        finally:
            if size:
                self.page.set_viewport_size(size)
        return path

    def screenshot(self, path: Path) -> None:
        try:
            self.page.screenshot(path=str(path), full_page=True)
        except Exception as exc:  # a crashed page: the test reports the original failure
            print(f"screenshot {path} failed: {exc}")


def launch(playwright: Any, executable: str, profile: Path, viewport=(1400, 1000)) -> Any:
    """A headless Chromium context on a fresh profile folder."""
    context = playwright.chromium.launch_persistent_context(
        str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": viewport[0], "height": viewport[1]}, accept_downloads=True)
    context.add_init_script(_JS_INIT)
    return context


def temp_root(prefix: str = "specter-browser-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
