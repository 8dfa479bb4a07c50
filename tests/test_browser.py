"""The tutorial notebooks in a real browser: JupyterLab on 127.0.0.1, driven by headless Chromium.

Kernel-side tests (and nbval) only see what Python holds; these read what the page drew, from the page itself:
every figure widget has a size and traces, the dashboard's slider and the QuantTuner's controls change what is
drawn, a reload and a second display show the state Python holds, and the console has no error.

Run alone with ``SPECTER_LAB_REQUIRE_BROWSER=1 python -m pytest -m browser tests/test_browser.py``; without that
variable they skip (the README's test line stays kernel-only), and with it a missing Playwright package or
system Chromium is a failure, not a skip (``.ci/run`` sets it). On
failure a full-page screenshot and the console log go to ``SPECTER_LAB_BROWSER_ARTIFACTS`` (default: the test's
temporary folder, printed in the failure).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from browser_lab import REPO, Lab, Page, find_chromium, launch

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

# Every tutorial notebook (a new one is picked up by its name).
NOTEBOOKS = tuple(sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")))


REQUIRED = os.environ.get("SPECTER_LAB_REQUIRE_BROWSER") == "1"


def _require_or_skip(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"SPECTER_LAB_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    if not REQUIRED:  # minutes of CPU: only where asked for (.ci/run sets it), never in the README's test line
        pytest.skip("the browser test runs with SPECTER_LAB_REQUIRE_BROWSER=1 (see .ci/run)")
    path = find_chromium()
    if path is None:
        _require_or_skip("no system Chromium (apt-get install chromium, or set SPECTER_LAB_CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _require_or_skip("Playwright's Python package is not installed (pip install playwright; no browser "
                         "download is needed)")
    return path


@pytest.fixture(scope="module")
def lab(chromium, tmp_path_factory):
    """A JupyterLab serving copies of the tutorial notebooks (saving in the test never touches notebooks/)."""
    work = tmp_path_factory.mktemp("browser")
    root = work / "notebooks"
    root.mkdir()
    for name in NOTEBOOKS:
        shutil.copy(REPO / "notebooks" / name, root / name)
    server = Lab(root=root, workdir=work).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(lab, chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = launch(pw, chromium, lab.workdir / "chromium-profile")
        context.set_default_timeout(60_000)
        yield context
        context.close()


@pytest.fixture
def page(browser, lab, request):
    """A fresh tab; on failure its full-page screenshot and console log are kept. Element screenshots (for the
    docs) are written only where ``SPECTER_LAB_BROWSER_SHOTS`` names a folder. The tab's kernels are shut down
    afterwards, so the next notebook has the CPUs to itself."""
    shots = os.environ.get("SPECTER_LAB_BROWSER_SHOTS")
    p = Page(browser.new_page(), lab, Path(shots) if shots else None)
    failed_before = request.session.testsfailed
    yield p
    # The call phase's report is logged before teardown, so a failure of this test is already counted.
    if request.session.testsfailed > failed_before:
        out = Path(os.environ.get("SPECTER_LAB_BROWSER_ARTIFACTS", lab.workdir / "artifacts"))
        out.mkdir(parents=True, exist_ok=True)
        p.screenshot(out / f"{request.node.name}.png")
        (out / f"{request.node.name}.console.json").write_text(json.dumps(p.retried + p.console, indent=1))
        print(f"browser artifacts (screenshot, console log): {out}")
    lab.shutdown_kernels()
    p.page.close()


# ----------------------------------------------------------------------------------------- checks
def assert_drawn(plots: list[dict], where: str, expect: int | None = None) -> None:
    """Every graph has a size and drew its traces."""
    assert plots, f"{where}: no plotly graph in the page"
    if expect is not None:
        assert len(plots) == expect, f"{where}: {len(plots)} graphs, expected {expect}: {[p['title'] for p in plots]}"
    for p in plots:
        size = f"{p['width']}×{p['height']} px"
        assert p["width"] > 300 and p["height"] > 100, f"{where}: graph {p['title']!r} is {size}"
        assert p["traces"] > 0 and p["drawn"] > 0, f"{where}: graph {p['title']!r} drew no traces: {p}"
        assert p["title"], f"{where}: graph without a title: {p}"


def assert_readable(page: Page, plots: list[dict], where: str) -> None:
    """The live figures (widgets) fill the width of their cell, no title runs under its modebar, and with the
    pointer elsewhere no modebar shows."""
    widgets = [p for p in plots if p["widget"]]
    assert widgets, f"{where}: no figure widget"
    for p in widgets:
        assert p["area_width"] and p["width"] >= 0.9 * p["area_width"], \
            f"{where}: {p['title']!r} is {p['width']} px wide in a {p['area_width']} px cell"
    covered = [p["title"] for p in plots if p["title_covered"]]
    assert not covered, f"{where}: the modebar covers the title of {covered}"
    shown = [p["title"] for p in widgets if p["modebar_visible"]]
    assert not shown, f"{where}: the modebar shows without the pointer over {shown}"


def assert_hover_answers(page: Page, needle: str, title: str, where: str) -> None:
    """The pointer over the middle of the figure whose title starts with ``title`` (in the cell with ``needle``)
    shows a hover label in that figure."""
    plots = page.cell(needle).locator(".js-plotly-plot")
    titles = [plots.nth(i).locator(".gtitle").first.text_content() or "" for i in range(plots.count())]
    gd = plots.nth([i for i, t in enumerate(titles) if t.startswith(title)][0])
    box = gd.locator(".nsewdrag").first.bounding_box()
    page.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    try:
        page.wait_for(lambda: gd.locator(".hoverlayer .hovertext").count() > 0, timeout=10, interval=0.2,
                      what=f"{where}: a hover label on {title!r}")
    finally:
        page.pointer_away()


def wait_readable(page: Page, needle: str | None, where: str, timeout: float = 20) -> list[dict]:
    """Until the figures in the cell with ``needle`` pass :func:`assert_readable` (they fit their width a moment
    after they are attached); then returns them, or raises its assertion."""
    page.pointer_away()

    def ok():
        plots = page.plots(needle)
        try:
            assert_readable(page, plots, where)
        except AssertionError:
            return None
        return plots

    try:
        return page.wait_for(ok, timeout=timeout, what=where)
    except TimeoutError:
        plots = page.plots(needle)
        assert_readable(page, plots, where)
        return plots


def assert_tables_fit(page: Page, where: str) -> None:
    """D7: no output table is wider than its cell (the old 04 table was 2,010 px in a 968 px cell)."""
    wide = page.wide_tables()
    assert not wide, f"{where}: tables wider than their cell [cell, table px, cell px, first header]: {wide}"


def assert_download_delivers(page: Page, needle: str, button: str, where: str) -> None:
    """E1: the button in the cell with ``needle`` writes a file and shows a link to it; a click on the link
    downloads the file's own bytes (the old link, a relative href, downloaded JupyterLab's 4.5 KB app page
    under the file's name)."""
    cell = page.cell(needle)
    cell.locator(f"button:has-text('{button}')").click()
    link = cell.locator("a").filter(has_text=re.compile(r"\.(html|csv)$"))
    page.wait_for(lambda: link.count() > 0, timeout=60, what=f"{where}: a link to the file after {button}")
    name = link.first.inner_text().strip()
    with page.page.expect_download(timeout=60_000) as info:
        link.first.click()
    got = Path(info.value.path()).read_bytes()
    want = (page.lab.root / name).read_bytes()
    assert got == want, (f"{where}: {button}'s link downloaded {len(got):,} bytes beginning {got[:60]!r}; the file "
                         f"{name} has {len(want):,} bytes beginning {want[:60]!r}")


def assert_report_opens_drawn(page: Page, needle: str, where: str) -> None:
    """E2: the report link in the cell with ``needle`` opens the report in a tab where its figures draw, with no
    console error (it opened in JupyterLab's HTML viewer, sandboxed: figures blank, 9 console errors)."""
    link = page.cell(needle).locator("a").filter(has_text=re.compile(r"\.html$")).first
    errors: list[str] = []
    try:
        with page.page.context.expect_page(timeout=60_000) as info:
            link.click()
    except Exception:  # Playwright's timeout
        raise AssertionError(f"{where}: the report link opened no tab of its own within 60 s (JupyterLab's own "
                             "link handling opens a relative link inside the app, in its sandboxed HTML viewer)") from None
    tab = info.value
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    # [figures in the report, figures drawn]
    count = """() => { const g = Array.from(document.querySelectorAll('.plotly-graph-div'));
      return [g.length, g.filter(d => d.querySelector('.main-svg .trace, .main-svg .hm')).length]; }"""
    try:
        tab.wait_for_function(f"() => {{ const [n, d] = ({count})(); return n > 0 && d === n; }}", timeout=60_000)
    except Exception:
        pass  # the assertion below says what it found
    n, drawn = tab.evaluate(count)
    url = tab.url
    tab.close()
    assert n > 0 and drawn == n, f"{where}: the report opened at {url[:80]} drew {drawn} of its {n} figures"
    assert not errors, f"{where}: console errors in the report's tab: {errors[:3]}"


def assert_prose_rows_printed(page: Page, where: str) -> None:
    """E5: every strategy the notebook's prose names on its own (`name`) is printed by one of its cells: prose
    about a row the tables do not print (06 quoted a `specter_split` row its table did not have) fails."""
    from specter_lab.run.strategies import STRATEGIES

    prose, printed = page.page.evaluate("""() => {
      const cells = window.jupyterapp.shell.currentWidget.content.widgets;
      return [cells.filter(c => c.model.type === 'markdown').map(c => c.model.sharedModel.getSource()).join('\\n'),
              cells.map(c => (c.node.querySelector('.jp-Cell-outputArea') || {}).innerText || '').join('\\n')];
    }""")
    named = {m for m in re.findall(r"`([a-z_+]+)`", prose) if m in STRATEGIES}
    missing = sorted(n for n in named if not re.search(rf"(?<![\w+]){re.escape(n)}(?![\w+])", printed))
    assert not missing, f"{where}: the prose names {missing}, which no cell prints"


# Issue 37's goal for the 01 dashboard: milliseconds per keyboard step of its slider (filled by
# test_quickstart_dashboard, checked by test_slider_steps_redraw_under_200_ms).
SLIDER_STEPS_MS: list[int] = []

# D9, per notebook: the console errors that File > Close and Shut Down Notebook left (filled by close_clean,
# checked by the last test of this file, so that a notebook's own checks are reported apart from it).
CLOSING_ERRORS: dict[str, list[str]] = {}


# Issue 55, per notebook: what its Run All did (filled by start_run_all / end_run_all, checked by the tests at the end
# of this file, so that a notebook's own checks are reported apart): seconds from the menu command to idle, every
# main-thread long task meanwhile (E3), the cells' kernel times and whether each showed progress while it ran (E7),
# and the progress bars at the end (E4).
RUN_ALL: dict[str, dict] = {}

# E3's goal: no main-thread task longer than this while Run All runs and draws (the page froze 1.1-2.6 s at each
# notebook's first figure). E7's: a cell that runs longer than this shows progress while it runs.
LONG_TASK_MS = 500
SLOW_CELL_S = 5.0

# Cells over SLOW_CELL_S that are known to run silent, each with the reason (printed by the test). None now: 07's
# estimates show a bar over their rows' replays (sl.estimate(progress=True)).
SILENT_KNOWN: dict[tuple[str, str], str] = {}


def start_run_all(page: Page, notebook: str) -> None:
    """Run > Run All Cells, with the page recording its long tasks and the cells' progress from now on."""
    page.observe_long_tasks()
    page.watch_cells()
    RUN_ALL[notebook] = {"t0": time.monotonic(), "page_t0": page.now_ms()}
    page.command("notebook:run-all-cells")


def end_run_all(page: Page, notebook: str, timeout: float = 400) -> None:
    """Until Run All is done and its figures drawn (every plot on the page has its traces); then records what
    the page saw (RUN_ALL)."""
    rec = RUN_ALL[notebook]
    page.wait_run_all(timeout)
    rec["seconds"] = round(time.monotonic() - rec["t0"], 1)
    try:
        page.wait_for(lambda: all(p["drawn"] > 0 for p in page.plots(None)), timeout=30, what="figures drawn")
    except TimeoutError:
        pass  # assert_drawn says which
    page.page.wait_for_timeout(1500)  # a last figure's own draw, in the task after its load
    rec["tasks"] = page.long_tasks(rec["page_t0"])
    rec["frames"] = page.long_frames(rec["page_t0"])
    rec["cells"] = page.cell_report()
    rec["bars"] = page.progress_bars()
    rec["longest_ms"] = max((d for _, d in rec["tasks"]), default=0)
    print(f"{notebook}: Run All {rec['seconds']} s, longest main-thread task {rec['longest_ms']} ms")


def run_all_measured(page: Page, notebook: str, timeout: float = 400) -> None:
    start_run_all(page, notebook)
    end_run_all(page, notebook, timeout)


def close_clean(page: Page, where: str) -> None:
    """File > Close and Shut Down Notebook, as a user does it; records the console errors it leaves (D9)."""
    before = len(page.errors())
    page.close_and_shutdown()
    CLOSING_ERRORS[where] = [e["text"][:160] for e in page.errors()[before:]]


# anywidget's own message when a model's module loaded more than 2 s after the model was made (a busy page, e.g.
# after Run All on a loaded machine). Our widgets keep hearing the kernel then (viz/listening.py), and every test
# checks what they drew, so the message alone is not a failure; any other console error is.
ANYWIDGET_GAVE_UP = "[anywidget] Failed to initialize model"


def console_errors(page: Page) -> list[dict]:
    """The page's console errors, less anywidget's :data:`ANYWIDGET_GAVE_UP`."""
    return [e for e in page.errors() if ANYWIDGET_GAVE_UP not in e["text"]]


def assert_no_console_errors(page: Page) -> None:
    errors = console_errors(page)
    assert not errors, "console errors:\n" + "\n".join(f"  {e['type']}: {e['text'][:300]}" for e in errors)


def dashboard_steps(plots: list[dict]) -> dict[str, int]:
    """The step each dashboard figure says it shows, read from its drawn title."""
    found = {}
    for name, pattern in (("routing", r"^Routing at step (\d+)"), ("cache", r"^Expert cache .* after step (\d+)"),
                          ("timeline", r"^Timeline · step (\d+)")):
        for p in plots:
            m = re.search(pattern, p["title"])
            if m:
                found[name] = int(m.group(1))
    return found


def slider_value(page: Page, needle: str) -> int:
    return int(page.cell(needle).locator(".widget-slider .widget-readout").first.inner_text())


def wait_dashboard_at(page: Page, needle: str, step: int, what: str) -> list[dict]:
    """Until the dashboard in the cell with ``needle`` draws ``step`` in every figure (and its slider says so)."""
    def at_step():
        plots = page.plots(needle)
        ok = dashboard_steps(plots) == {"routing": step, "cache": step, "timeline": step}
        return plots if ok and slider_value(page, needle) == step else None

    try:
        return page.wait_for(at_step, timeout=30, what=what)
    except TimeoutError:
        plots = page.plots(needle)
        raise AssertionError(f"{what}: slider {slider_value(page, needle)}, figures {dashboard_steps(plots)}, "
                             f"expected step {step} everywhere") from None


# The state the dashboard in the cell with `needle` paints, read at any moment: the step in each figure's title and
# the token strip's outlined step, joined ("routing cache timeline strip"; "?" where one is missing).
_JS_PAINTED = """(needle) => {
  const c = window.jupyterapp.shell.currentWidget.content.widgets
    .find(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(needle));
  const pats = [/^Routing at step (\\d+)/, /^Expert cache .* after step (\\d+)/, /^Timeline · step (\\d+)/];
  return () => {
    const titles = Array.from(c.node.querySelectorAll('.js-plotly-plot .gtitle')).map(t => t.textContent);
    const steps = pats.map(p => { const t = titles.find(t => p.test(t)); return t ? t.match(p)[1] : '?'; });
    const now = c.node.querySelector('.sl-strip .t.now');
    const m = now && now.title.match(/step (\\d+)$/);
    return [...steps, m ? m[1] : '?'].join(' ');
  };
}"""


# Each figure in the cell with `needle` against a fresh draw of the same figure beside it, at its width: [title,
# swapped in (panel.py: drawn ahead, out of sight, and swapped in, not redrawn), the texts that differ (text, x, y
# relative to the figure)]. A figure drawn ahead was drawn outside the cell; it must look as one drawn in it.
_JS_AS_DRAWN_HERE = """async (needle) => {
  const c = window.jupyterapp.shell.currentWidget.content.widgets
    .find(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(needle));
  const texts = gd => {
    const box = gd.getBoundingClientRect();
    return Array.from(gd.querySelectorAll('.main-svg text')).filter(t => t.textContent)
      .map(t => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0)  // hidden: no box
      .map(([text, r]) => `${text}@${Math.round(r.left - box.left)},${Math.round(r.top - box.top)}`);
  };
  const out = [];
  for (const gd of c.node.querySelectorAll('.js-plotly-plot')) {
    const probe = document.createElement('div');
    probe.style.width = gd.getBoundingClientRect().width + 'px';
    gd.parentNode.appendChild(probe);
    await Plotly.newPlot(probe, structuredClone(gd.data), structuredClone(gd.layout), {displayModeBar: 'hover'});
    const here = new Set(texts(probe)), there = new Set(texts(gd));
    const differ = [...there].filter(t => !here.has(t)).concat([...here].filter(t => !there.has(t)));
    Plotly.purge(probe);
    probe.remove();
    out.push([(gd.querySelector('.gtitle') || {}).textContent || '', 'swappedIn' in gd.dataset, differ.slice(0, 8)]);
  }
  return out;
}"""


# Installed *before* the key is pressed: window.__slT0 := the time of the next keydown event (captured before any
# handler of the page sees it), and a check in every animation frame from then on. window.__slDone := milliseconds
# from the keydown to the first frame in which every dashboard title in the cell with `needle` names `step` and its
# token strip outlines that step's cells (_JS_PAINTED; -1 after 10 s). A check started after the key
# (page.evaluate once the press returned) ran only when the page had finished the tasks queued meanwhile, the
# kernel's messages included, and so could not see a step that the page drew before them (issue 37).
_JS_WATCH_STEP = """([needle, step]) => {
  window.__slT0 = Infinity;
  window.__slDone = null;
  document.addEventListener('keydown', e => { window.__slT0 = e.timeStamp; }, {capture: true, once: true});
  const state = (""" + _JS_PAINTED + """)(needle);
  const want = Array(4).fill(String(step)).join(' ');
  const start = performance.now();
  const tick = () => {
    const t = performance.now();
    if (window.__slT0 <= t && state() === want) { window.__slDone = Math.round(t - window.__slT0); return; }
    if (t - Math.min(window.__slT0, start) > 10000) { window.__slDone = -1; return; }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


# Installed before keys are pressed: window.__slSeen := every distinct state the dashboard painted (_JS_PAINTED),
# one entry per change, checked at every animation frame for `ms` milliseconds.
_JS_RECORD_STEPS = """([needle, ms]) => {
  window.__slSeen = [];
  window.__slSeenDone = false;
  const state = (""" + _JS_PAINTED + """)(needle);
  const start = performance.now();
  const tick = () => {
    const s = state();
    if (window.__slSeen[window.__slSeen.length - 1] !== s) window.__slSeen.push(s);
    if (performance.now() - start < ms) requestAnimationFrame(tick); else window.__slSeenDone = true;
  };
  requestAnimationFrame(tick);
}"""


def timed_key(page: Page, handle: Any, key: str, needle: str, step: int) -> int:
    """Press ``key`` on ``handle`` and return the milliseconds until the dashboard in the cell with ``needle``
    shows ``step`` (see _JS_WATCH_STEP; -1: not within 10 s)."""
    page.page.evaluate(_JS_WATCH_STEP, [needle, step])
    handle.press(key)
    page.page.wait_for_function("() => window.__slDone !== null", timeout=15_000)
    return page.page.evaluate("() => window.__slDone")


def tuner_table(page: Page) -> dict[str, str]:
    """strategy → TPOT text of the tuner's HTML table (what Python last computed)."""
    rows = page.page.evaluate("""() => Array.from(document.querySelectorAll('table.sl-tuner tbody tr'))
        .map(tr => Array.from(tr.children).map(td => td.textContent.trim()))""")
    heads = page.page.evaluate("""() => Array.from(document.querySelectorAll('table.sl-tuner thead th'))
        .map(th => th.textContent.trim())""")
    i, j = heads.index("strategy"), heads.index("tpot_ms")
    return {r[i]: r[j] for r in rows}


def tuner_chart(page: Page) -> dict[str, str]:
    """strategy → TPOT text of the bars the tuner's chart drew."""
    (chart,) = [p for p in page.plots("sl.viz.QuantTuner(") if p["title"].startswith("Quantized draft")]
    tpot = chart["data"][0]
    return dict(zip(tpot["x"] or [], tpot["text"] or []))


def assert_chart_matches_table(page: Page, what: str) -> None:
    """The chart's TPOT bars carry the table's numbers (3 decimals in the chart, 4 in the table)."""
    def same():
        table, chart = tuner_table(page), tuner_chart(page)
        want = {k: f"{float(v):.3f}" for k, v in table.items() if v != "—"}
        return chart if chart and {k: chart.get(k) for k in want} == want else None

    try:
        page.wait_for(same, timeout=30, what=what)
    except TimeoutError:
        raise AssertionError(f"{what}: chart {tuner_chart(page)} vs table {tuner_table(page)}") from None


# ----------------------------------------------------------------------------------------- tests
def test_quickstart_dashboard(page: Page) -> None:
    """01: every figure drew; the slider redraws them; a reload and a second display show the current step."""
    needle = "sl.viz.dashboard("
    page.open("01_quickstart.ipynb")
    run_all_measured(page, "01_quickstart.ipynb", timeout=300)
    plots = page.wait_for(lambda: len(page.plots(needle)) == 3 and page.plots(needle), what="dashboard drawn")
    assert_drawn(plots, "dashboard", expect=3)  # routing, cache, timeline (the token strip is HTML)
    wait_readable(page, needle, "dashboard")
    last = slider_value(page, needle)
    wait_dashboard_at(page, needle, last, "dashboard after Run All")

    page.screenshot_element(page.markdown_cell("# 01 · Quickstart"), "01_first_page")
    assert_tables_fit(page, "01")
    assert_report_opens_drawn(page, "spec_result.to_html(", "01")
    assert_download_delivers(page, needle, "Save views", "01")

    # Move the slider with the keyboard, as a user would: two steps back, one at a time, timing each (D4: each
    # took about 1.6 s, the page frozen meanwhile). Measured in the page, from the key's keydown event to the
    # first animation frame in which all three step titles name the new step (each title is redrawn by the same
    # plotly update as its traces, so a new title is a redrawn figure): the kernel's round trip included. Each step
    # is timed twice (left onto it, right off it untimed, left onto it again) and its time is the faster, as timeit
    # takes the minimum: on this shared 2-core box a redraw of ~140 ms now and then takes 200-340 ms (a page task
    # stretched to 218-313 ms with the machine otherwise idle), in CI too (2026-12-05), and noise only adds time.
    handle = page.cell(needle).locator(".widget-slider .noUi-handle").first
    handle.focus()
    page.observe_long_tasks()
    took, tries = [], []
    for moved in range(last - 1, max(last - 3, -1), -1):
        pair = []
        for again in (False, True):
            if again:  # off the step and back onto it
                handle.press("ArrowRight")
                wait_dashboard_at(page, needle, moved + 1, "dashboard back one step")
            page.page.wait_for_timeout(2000)  # the dashboard warms the neighbouring steps while the kernel is idle
            pair.append(timed_key(page, handle, "ArrowLeft", needle, moved))
            plots = wait_dashboard_at(page, needle, moved, "dashboard after moving the slider")
        tries.append(pair)
        took.append(min(pair) if min(pair) >= 0 else -1)
    tasks = [d for _, d in page.long_tasks()]
    print(f"01: slider steps redrawn in {took} ms (keydown to every title at the new step; the faster of {tries}); "
          f"page long tasks meanwhile {tasks} ms; load average {os.getloadavg()[0]:.1f}")
    assert_drawn(plots, "dashboard after moving the slider", expect=3)
    assert max(tasks, default=0) < 500, f"01: the page froze {max(tasks)} ms on a slider step"
    assert all(0 <= t < 1000 for t in took), \
        f"01: slider steps took {took} ms to redraw (was about 1,600; -1: over 10 s)"
    SLIDER_STEPS_MS.extend(took)  # the 200 ms goal is checked apart: test_slider_steps_redraw_under_200_ms

    # Once the page has drawn the steps around the shown one ahead, out of sight (step_sync.py), a step swaps them
    # in (panel.py). Each must look as drawn in its cell, fill its width and answer the pointer.
    page.wait_for(lambda: page.page.evaluate("() => globalThis.__specter_lab_drawing_ahead === 0"), timeout=60,
                  what="the steps around the shown one drawn ahead")
    handle.press("ArrowRight")
    wait_dashboard_at(page, needle, moved + 1, "dashboard one step right")
    compared = page.page.evaluate(_JS_AS_DRAWN_HERE, needle)
    assert sum(swapped for _, swapped, _ in compared) == 3, f"01: a step not swapped in: {compared}"
    assert all(not differ for *_, differ in compared), f"01: figures drawn ahead differ from a draw here: {compared}"
    wait_readable(page, needle, "dashboard swapped in")
    assert_hover_answers(page, needle, "Routing at step", "dashboard swapped in")
    handle.focus()
    handle.press("ArrowLeft")
    wait_dashboard_at(page, needle, moved, "dashboard back one step")

    # Keys faster than the kernel answers: the page draws prepared steps at once while the kernel's answers for
    # the steps in between still arrive (viz/step_sync.py). Every view must settle on the slider's step, and stay.
    # The kernel answers each step 0.4 s late here, so that the last two keys outrun it: every state the page paints
    # must be on the keys' path, in order. Before step_sync.py held a passed step back, the kernel's late answer
    # to the second key painted that step again after the third key, for a moment.
    page.append_and_run("_show = dash.show\n"
                        "def _late(step):\n    import time; time.sleep(0.4); _show(step)\n"
                        "dash.show = _late")
    page.page.evaluate(_JS_RECORD_STEPS, [needle, 4000])  # 4 s from before the keys
    handle.press("ArrowRight")
    # once the kernel has answered it: the next key's value reaches the kernel alone, and the third key's waits in
    # the page (ipywidgets sends one message at a time) while the kernel answers the second
    page.page.wait_for_timeout(1000)
    handle.press("ArrowRight")
    handle.press("ArrowLeft")
    path = [" ".join([str(s)] * 4) for s in (moved, moved + 1, moved + 2, moved + 1)]
    moved += 1
    wait_dashboard_at(page, needle, moved, "dashboard after three quick keys")
    page.page.wait_for_function("() => window.__slSeenDone", timeout=15_000)
    seen = page.page.evaluate("() => window.__slSeen")
    page.append_and_run("del dash.show")  # the kernel's own pace again
    print(f"01: states painted after three quick keys (routing cache timeline strip): {seen}")
    on_path = iter(path)
    assert all(state in on_path for state in seen), f"three quick keys along {path} painted {seen}"
    strip = page.cell(needle).locator(".sl-strip .t.now").first.get_attribute("title") or ""
    settled = (dashboard_steps(page.plots(needle)), slider_value(page, needle), strip)
    assert settled[:2] == ({"routing": moved, "cache": moved, "timeline": moved}, moved) and \
        strip.endswith(f"· step {moved}"), f"after three quick keys (step {moved}): {settled}"

    # A reload with the kernel alive restores the widgets from the kernel: they must show the moved step.
    page.save()
    plots = page.reload_until(lambda: len(page.plots(needle)) == 3 and page.plots(needle), what="dashboard restored")
    assert_drawn(plots, "dashboard after a reload", expect=3)
    wait_dashboard_at(page, needle, moved, "dashboard after a reload")
    page.screenshot_element(page.cell(needle), "dashboard_after_reload")

    # The same dashboard shown again in a new cell: both views show the current step.
    page.append_and_run("dash")
    again = page.wait_for(lambda: len(page.plots(None)) >= 3 + 3 and page.plots(None), what="second display drawn")
    second = [p for p in again if p["cell"] == max(q["cell"] for q in again)]
    assert_drawn(second, "dashboard shown again", expect=3)
    assert dashboard_steps(second) == {"routing": moved, "cache": moved, "timeline": moved}, dashboard_steps(second)
    wait_readable(page, None, "dashboard shown twice")
    assert_no_console_errors(page)
    close_clean(page, "01")


def test_quantization_tuner(page: Page) -> None:
    """02: the tuner's chart drew the table's numbers; a control + Run redraws it; a reload keeps it."""
    page.open("02_quantization.ipynb")
    run_all_measured(page, "02_quantization.ipynb")
    plots = page.wait_for(lambda: page.plots("sl.viz.QuantTuner("), what="tuner chart in the page")
    assert_drawn(plots, "tuner", expect=1)
    assert_drawn(page.plots(None), "02")
    assert_chart_matches_table(page, "tuner after Run All")
    wait_readable(page, "sl.viz.QuantTuner(", "tuner")
    before = tuner_chart(page)

    # A control: 2-bit draft, then Run (the notebook turned 'run on change' off).
    cell = page.cell("sl.viz.QuantTuner(")
    cell.locator(".widget-dropdown:has(label:text-is('bits')) select").select_option(label="2")
    # D8: the table no longer shows the controls' setting, and says so until Run
    page.wait_for(lambda: "press Run" in cell.inner_text(), timeout=30, what="the tuner marked stale")
    cell.locator("button:text-is('Run')").click()
    page.wait_for(lambda: tuner_chart(page) != before, timeout=120, what="tuner chart redrawn after bits=2 + Run")
    assert_chart_matches_table(page, "tuner after bits=2 + Run")
    page.wait_for(lambda: "press Run" not in cell.inner_text(), timeout=30, what="the stale mark gone after Run")
    assert_tables_fit(page, "02")
    page.screenshot_element(cell, "quanttuner")
    assert_download_delivers(page, "sl.viz.QuantTuner(", "Save table", "02")

    page.save()
    page.reload_until(lambda: page.plots("sl.viz.QuantTuner("), what="tuner chart restored")
    assert_drawn(page.plots("sl.viz.QuantTuner("), "tuner after a reload", expect=1)
    assert_chart_matches_table(page, "tuner after a reload")
    assert_no_console_errors(page)
    close_clean(page, "02")


def figure_cells(notebook: str) -> set[int]:
    """The cells (positions among all of ``notebook``'s cells, as ``Page.plots`` numbers them) whose code ends in an
    expression that draws a figure (``figures.*_figure(...)``, ``sl.viz.*_figure(...)``,
    ``sl.viz.bench_figures.*_figure(...)``): what the page must show as one figure each. Since issue 55 they are
    figure panels (viz/shown.py), widgets like the views'."""
    cells = json.loads((REPO / "notebooks" / notebook).read_text())["cells"]
    last = {i: "".join(c["source"]).rstrip().splitlines()[-1] for i, c in enumerate(cells)
            if c["cell_type"] == "code" and c["source"]}
    return {i for i, line in last.items() if re.match(r"^(figures|sl\.viz|viz)(\.\w+)*\.\w+_figure\(", line)}


def figure_cell_plots(plots: list[dict], notebook: str) -> list[dict]:
    """The plots drawn by ``notebook``'s figure cells (:func:`figure_cells`)."""
    wanted = figure_cells(notebook)
    return [p for p in plots if p["cell"] in wanted]


LIVE = "sl.viz.live("
_RUNNING = re.compile(r"^step (\d+) · (\d+)/(\d+) tokens")


def live_status(page: Page) -> str:
    """The live view's status line, as the page shows it."""
    try:
        return page.cell(LIVE).locator(".widget-html-content").first.inner_text(timeout=2000).strip()
    except Exception:  # not drawn yet
        return ""


def running_status(page: Page):
    """The live status while it shows a step under way; an assertion once the run ended without the page ever
    showing one (the view did not update while the run went on)."""
    status = live_status(page)
    if status.startswith(("done", "stopped", "finishing")):
        raise AssertionError(f"the live run ended before the page showed any of its steps: {status!r}")
    m = _RUNNING.match(status)
    return m if m and int(m.group(2)) >= 1 else None


def _tokens_of(status: str) -> int | None:
    m = _RUNNING.match(status)
    return int(m.group(2)) if m else None


def _strip_tokens(strip: str) -> int | None:
    m = re.search(r"Tokens · (\d+) generated", strip)
    return int(m.group(1)) if m else None


def test_timelines_live(page: Page) -> None:
    """03 under Run All, as a reader runs it, with every change of the live status line recorded in the page:

    * D3: the live run shows its first steps early, and lasts long enough to reach and use;
    * D1: the status line and the token strip agree within one step, and the status moves at a steady cadence;
    * Pause holds the run; D2: Stop clicked near the end ends it: the page shows 'finishing …' with Stop
      disabled, never 'stopping …' after that, then 'stopped' (or 'done' if generation ended first);
    * D4: no main-thread task over 500 ms while the run ends; D5: the dashboard, opened on request, keeps its
      token strip short; every static figure drew; closing leaves no console error."""
    notebook = "03_timelines.ipynb"
    page.open(notebook)
    start_run_all(page, notebook)
    page.wait_for(lambda: page.state().get("executed", 0) >= 2, timeout=150, what="Run All under way")
    page.wait_for(lambda: live_status(page), timeout=150, what="the live view drawn under Run All")
    page.watch_status(LIVE)
    page.wait_for(lambda: running_status(page), timeout=150, what="the live run showing its steps under Run All")
    total = int(running_status(page).group(3))
    page.page.wait_for_timeout(4000)
    page.screenshot_element(page.cell(LIVE), "live_midrun")

    # Pause: the tokens stop moving until Resume.
    cell = page.cell(LIVE)
    cell.locator("button:text-is('Pause')").click()
    page.wait_for(lambda: live_status(page).startswith("paused"), timeout=30, what="the run paused")
    held = live_status(page)
    page.page.wait_for_timeout(1500)
    assert live_status(page) == held, f"the run went on while paused: {held!r} -> {live_status(page)!r}"
    cell.locator("button:text-is('Resume')").click()

    # Stop near the end (D2).
    page.wait_for(lambda: (_tokens_of(live_status(page)) or 0) >= 0.9 * total, timeout=240, interval=0.2,
                  what="the live run near its end")
    seen = live_status(page)
    cell.locator("button:text-is('Stop')").click()
    final = page.wait_for(lambda: (s := live_status(page)).startswith(("stopped", "done", "failed")) and s,
                          timeout=180, interval=0.2, what="the live run ending after Stop")
    page.page.wait_for_timeout(3000)
    log = page.status_log()
    ended_at = page.now_ms()
    texts = [e["text"] for e in log]
    print(f"03: Stop clicked at '{seen}'; statuses after it: {[t[:48] for t in texts if _tokens_of(t) is None][-6:]}")
    assert final.startswith(("stopped", "done")), final
    finishing = [i for i, e in enumerate(log) if e["text"].startswith("finishing")]
    assert finishing, f"'finishing …' never showed: {texts[-8:]}"
    assert log[finishing[0]]["stop_disabled"], "Stop was still enabled while the run was finishing"
    late = [e["text"] for e in log[finishing[0]:] if e["text"].startswith("stopping")]
    assert not late, f"'stopping …' after generation had ended: {late}"
    assert cell.locator("button:text-is('Stop')").is_disabled()

    # D1 and D3, from the recorded statuses while it ran.
    running = [(e["t"], _tokens_of(e["text"]), _strip_tokens(e["strip"])) for e in log if _tokens_of(e["text"])]
    assert running, texts[:5]
    apart = [abs(n - m) for _, n, m in running if m is not None]
    gaps = sorted(b[0] - a[0] for a, b in zip(running, running[1:]))
    print(f"03: {len(running)} running statuses; |status − strip| tokens max {max(apart)}, "
          f"equal in {apart.count(0)}; gaps ms median {gaps[len(gaps) // 2]:.0f}, max {gaps[-1]:.0f}; "
          f"first at {running[0][1]}/{total} tokens")
    assert max(apart) <= 9, f"status and strip disagree by {max(apart)} tokens (more than one step, K + 1 = 9)"
    assert gaps[len(gaps) // 2] <= 1200, f"status updates {gaps[len(gaps) // 2]:.0f} ms apart (median)"
    assert running[0][1] <= 0.25 * total, f"the first status came at {running[0][1]}/{total} tokens"

    # D4: the page stays responsive while the run ends (the old view built its dashboard here: 1.0–1.7 s tasks).
    end_from = log[finishing[0]]["t"] - 2000
    during = [d for t, d in page.long_tasks() if end_from <= t <= ended_at]
    print(f"03: long tasks while the run ended: {during} ms")
    assert max(during, default=0) < 500, f"the page froze {max(during)} ms while the live run ended"
    page.screenshot_element(cell, "live_stopped_near_end")

    end_run_all(page, notebook, timeout=300)
    plots = page.plots(None)
    assert_drawn(plots, "03")
    static = figure_cell_plots(plots, notebook)
    assert len(static) == len(figure_cells(notebook)), \
        f"03: {len(static)} figures drawn by its figure cells, the notebook has {len(figure_cells(notebook))}"
    printed = page.wait_for(lambda: "generate" in (page.cell_text("run.on_done(") or "") and
                            page.cell_text("run.on_done("), timeout=30, what="the on_done check printed")
    assert "<b>" not in printed and final.split(":")[0] in printed and "True" in printed, printed

    # The dashboard on request (D5: its token strip stays short).
    cell.locator("button:has-text('Open the step dashboard')").click()
    live = page.wait_for(lambda: len(page.plots(LIVE)) >= 3 and page.plots(LIVE), timeout=120,
                         what="the finished run's dashboard")
    assert_drawn(live, "live view's dashboard")
    wait_readable(page, LIVE, "live view's dashboard")
    strips = page.page.evaluate("""(needle) => {
      const c = window.jupyterapp.shell.currentWidget.content.widgets
        .find(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(needle));
      return Array.from(c.node.querySelectorAll('.sl-strip')).filter(s => s.offsetParent !== null)
        .map(s => ({height: Math.round(s.getBoundingClientRect().height), text: s.textContent}));
    }""", LIVE)
    assert len(strips) == 1, f"the finished live view shows {len(strips)} token strips"
    assert strips[0]["height"] <= 600, f"the dashboard's token strip is {strips[0]['height']} px tall"
    assert "· space" in strips[0]["text"], f"no glyph legend on the token strip: {strips[0]['text'][:200]!r}"
    wait_dashboard_at(page, LIVE, slider_value(page, LIVE), "the stopped run's dashboard")
    assert not page.axis_titles_on_legend(LIVE), page.axis_titles_on_legend(LIVE)
    page.screenshot_element(page.cell("figures.timeline_figure(spec, step)"), "titled_figure")
    assert_tables_fit(page, "03")
    assert_prose_rows_printed(page, "03")
    assert_no_console_errors(page)
    close_clean(page, "03")


def test_compare(page: Page) -> None:
    """04: every static figure drew; the comparison figure's value labels are clear of its error bars and
    legible; the strategy table shows each description in full; nothing on stderr."""
    from specter_lab.run.strategies import STRATEGIES

    notebook = "04_compare.ipynb"
    page.open(notebook)
    run_all_measured(page, notebook)
    plots = page.plots(None)
    assert_drawn(plots, "04", expect=len(figure_cells(notebook)))
    for graph in page.labels_clear("sl.viz.compare_figure("):
        assert graph["labels"] and graph["errorbars"], graph
        assert not graph["struck"], f"04: error bars strike the labels {graph['struck']}"
        assert graph["min_font"] >= 10, f"04: labels shrunk to {graph['min_font']} px"
    source = page.page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets
        .map(c => c.model.sharedModel.getSource()).find(s => s.includes('"description"'))""")
    listed = re.findall(r'"(\w+)"', re.search(r"strategies = \[(.*?)\]", source, re.S).group(1))
    table = " ".join((page.cell_text('"description"') or "").split())
    cut = [s for s in listed if " ".join(STRATEGIES[s].description.split()) not in table]
    assert not cut, f"04: descriptions cut short in the strategy table: {cut}"
    assert_tables_fit(page, "04")
    first = page.cell("sl.viz.table(df.head(8)").locator(".jp-OutputArea-output table").first
    assert first.bounding_box()["height"] < 400, f"04: the first runs table is {first.bounding_box()} (rows wrap)"
    page.screenshot_element(page.cell("sl.viz.table(df.head(8)"), "compare_first_table")
    # D6: every number in the 'Routing recorded elsewhere' prose is printed by the cell under it, or is one of
    # the published references it quotes (the old prose said 0.83 where the cell printed 0.779)
    prose = page.page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets
        .map(c => c.model.sharedModel.getSource()).find(s => s.startsWith('## Routing recorded elsewhere'))""")
    printed = page.cell_text("sl.less_local(") or ""
    published = {"0.72", "0.61"}  # DeepSeek-V2-Lite-Chat, Mixtral-8x7B: TARGET_HIT_AT_HALF
    stray = [x for x in re.findall(r"\b0\.\d+\b", prose) if x not in published and x not in printed]
    assert not stray, f"04: prose numbers {stray} are not what the cell printed: {printed[:300]!r}"
    assert "0.72" in printed, printed[:300]
    assert not page.stderr_outputs(), page.stderr_outputs()
    assert_prose_rows_printed(page, "04")
    assert_no_console_errors(page)
    close_clean(page, "04")


def test_your_model(page: Page) -> None:
    """05: runs clean, with no red stderr box (our own helpers warn about nothing)."""
    notebook = "05_your_model.ipynb"
    page.open(notebook)
    run_all_measured(page, notebook, timeout=300)
    assert not page.stderr_outputs(), page.stderr_outputs()
    assert figure_cells(notebook), "05 shows no figure of the run (M6)"
    assert_drawn(figure_cell_plots(page.plots(None), notebook), "05", expect=len(figure_cells(notebook)))
    assert_tables_fit(page, "05")
    assert_no_console_errors(page)
    close_clean(page, "05")


# Cells the docs show (docs/*.png, issue 55): written where SPECTER_LAB_BROWSER_SHOTS names a folder.
SHOTS = {"06_reproducing_specter.ipynb": [('"deepseek-v2-lite-high", execution="eager"', "06_equal_memory_high"),
                                          ('"deepseek-v2-lite-low", execution="compiled"', "06_equal_memory_low")],
         "07_estimate.ipynb": [('e = sl.estimate("qwen3-30b-a3b"', "07_first_estimate")]}

# Notebooks with a test of their own above; any other tutorial notebook gets the generic check below.
DEDICATED = {"01_quickstart.ipynb", "02_quantization.ipynb", "03_timelines.ipynb", "04_compare.ipynb",
             "05_your_model.ipynb"}


@pytest.mark.parametrize("notebook", [n for n in NOTEBOOKS if n not in DEDICATED] or
                         [pytest.param(None, marks=pytest.mark.skip(reason="every notebook has its own test"))])
def test_other_notebook_runs_clean(page: Page, notebook: str) -> None:
    """A tutorial notebook without a test of its own: Run All without an error, every static figure drawn (and
    every figure widget at its cell's width), no stderr box, no console error."""
    page.open(notebook)
    run_all_measured(page, notebook)
    plots = page.plots(None)
    expected = len(figure_cells(notebook))
    assert len(figure_cell_plots(plots, notebook)) == expected, f"{notebook}: figures drawn vs {expected} figure cells"
    if plots:
        assert_drawn(plots, notebook)
    if any(p["widget"] for p in plots):
        wait_readable(page, None, notebook)
    assert_tables_fit(page, notebook)
    assert not page.stderr_outputs(), page.stderr_outputs()
    for needle, name in SHOTS.get(notebook, ()):
        page.screenshot_element(page.cell(needle), name)
    assert_prose_rows_printed(page, notebook)
    assert_no_console_errors(page)
    close_clean(page, notebook)


def test_a_panel_made_on_a_busy_page_takes_the_kernels_figures(page: Page, lab: Lab) -> None:
    """A figure panel whose module loaded while the page was busy for 4 s still draws what the kernel sends: the
    figure sent meanwhile and the next one (viz/listening.py). Before, anywidget gave up on the model after 2 s
    and it drew its first figure for good: in CI on 2026-12-06, 01's dashboard after Run All showed step 5 in two
    figures and step 1 in the timeline."""
    blank = {"cells": [], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                      "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    (lab.root / "busy_page.ipynb").write_text(json.dumps(blank))
    page.open("busy_page.ipynb")
    page.append_and_run(
        "import plotly.graph_objects as go\n"
        "from IPython.display import Javascript, display\n"
        "from specter_lab.viz.panel import FigurePanel\n\n"
        "fig = lambda title: go.Figure(go.Bar(y=[1, 2]), layout_title_text=title)\n"
        "panel = FigurePanel(fig('made'))\n"
        "display(Javascript('const t = performance.now(); while (performance.now() - t < 4000) {}'))\n"
        "display(panel)\n"
        "panel.show(fig('sent while the page was busy'))")

    def drawn(title):
        return lambda: [p["title"] for p in page.plots(None)] == [title]

    page.wait_for(drawn("sent while the page was busy"), timeout=30, what="the figure sent while the page was busy")
    page.append_and_run("panel.show(fig('sent later'))")
    page.wait_for(drawn("sent later"), timeout=30, what="the figure sent later")
    assert_no_console_errors(page)  # anywidget says it gave up on the model (ANYWIDGET_GAVE_UP); nothing else


def test_closing_a_notebook_leaves_no_console_error() -> None:
    """D9: no console error when a notebook with widgets is closed and shut down (README: 'the browser console
    has no error'). Reads what the notebook tests above recorded as they closed their notebooks."""
    if not CLOSING_ERRORS:
        pytest.skip("no notebook test closed its notebook")
    print(f"console errors on closing: { {k: len(v) for k, v in CLOSING_ERRORS.items()} }")
    left = {k: v for k, v in CLOSING_ERRORS.items() if v}
    assert not left, f"console errors on closing: {left}"


def test_slider_steps_redraw_under_200_ms() -> None:
    """Issue 37: each keyboard step of 01's dashboard slider redraws in under 200 ms, measured in the page from
    the keydown event to the first animation frame with every step title and the token strip at the new step
    (timed_key), each step the faster of two presses onto it (test_quickstart_dashboard says why). On this 2-core
    box, with the steps drawn ahead (viz/step_sync.py): 8-14 ms a step, 7-29 ms with another process busy on one
    core; redrawn on the key (dae239f) 151-161 ms here and 186-208 ms in one CI run, which failed this test
    (docs/measured/browser_before_after.md)."""
    if not SLIDER_STEPS_MS:
        pytest.skip("test_quickstart_dashboard did not time its slider")
    print(f"01: slider steps {SLIDER_STEPS_MS} ms; load average {os.getloadavg()[0]:.1f}")
    assert max(SLIDER_STEPS_MS) < 200, f"01: slider steps took {SLIDER_STEPS_MS} ms to redraw (goal: under 200)"


def _run_all_table() -> str:
    rows = [f"  {nb}: Run All {r.get('seconds')} s, longest task {r.get('longest_ms')} ms" for nb, r in RUN_ALL.items()]
    out = os.environ.get("SPECTER_LAB_BROWSER_ARTIFACTS")
    if out:  # for docs/measured: each notebook's Run All time, long tasks and cells
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "run_all.json").write_text(json.dumps(RUN_ALL, indent=1, default=str))
    return "\n".join(rows)


def test_run_all_has_no_long_task() -> None:
    """E3: no main-thread task over LONG_TASK_MS while Run All runs each notebook and draws its figures (the page
    froze 1.1-2.6 s at each notebook's first figure: plotly.js evaluated, then every figure of the cell drawn, in
    one task). Read from what the notebook tests recorded (RUN_ALL), with the scripts each freeze ran."""
    if not RUN_ALL:
        pytest.skip("no notebook test ran Run All")
    print("Run All:\n" + _run_all_table())
    over = {nb: [(round((t - r["page_t0"]) / 1000, 1), d) for t, d in r.get("tasks", []) if d > LONG_TASK_MS]
            for nb, r in RUN_ALL.items()}
    over = {nb: v for nb, v in over.items() if v}
    what = {nb: [(f["ms"], [(x["ms"], x["invoker"][:40]) for x in f["scripts"][:3]]) for f in RUN_ALL[nb]["frames"]
                 if f["ms"] > LONG_TASK_MS] for nb in over}
    assert not over, f"main-thread tasks over {LONG_TASK_MS} ms under Run All [s after Run All, ms]: {over}; " \
                     f"what they ran: {what}"


def test_slow_cells_show_progress() -> None:
    """E7: every cell that runs longer than SLOW_CELL_S shows progress while it runs (07's first estimate ran
    10.6 s with none). Kernel times from JupyterLab's recordTiming; progress as the page showed it (a 100 ms poll)."""
    if not RUN_ALL:
        pytest.skip("no notebook test ran Run All")
    silent, known = [], []
    for nb, r in RUN_ALL.items():
        for c in r.get("cells", []):
            if (c["seconds"] or 0) > SLOW_CELL_S and c["progress_after"] is None:
                entry = (nb, c["index"], round(c["seconds"], 1), c["source"][:60])
                why = [w for (n, start), w in SILENT_KNOWN.items() if n == nb and c["source"].startswith(start)]
                (known if why else silent).append(entry + tuple(why))
    print(f"silent slow cells handed over: {known}")
    assert not silent, f"cells over {SLOW_CELL_S} s without progress [notebook, cell, s, code]: {silent}"


def test_progress_bars_end_complete() -> None:
    """E4: every progress bar ends green (complete): 06's equal-memory cells ended red at 14/15, as if they had
    failed. A live run the test stopped ends orange ('stopped'), as it should."""
    if not RUN_ALL:
        pytest.skip("no notebook test ran Run All")
    bad = {}
    for nb, r in RUN_ALL.items():
        cells = json.loads((REPO / "notebooks" / nb).read_text())["cells"]
        live = {i for i, c in enumerate(cells) if LIVE in "".join(c["source"])}
        wrong = [b for b in r.get("bars", []) if b[1] != "success" and not (b[0] in live and b[1] == "warning")]
        if wrong:
            bad[nb] = wrong
    assert not bad, f"progress bars not ending green [cell, style, percent drawn]: {bad}"
