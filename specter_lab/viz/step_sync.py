"""Steps drawn in the page without the kernel: a slider's prepared steps, applied the moment it moves.

A dashboard's slider step used to go page → kernel → page: the key's value reached the kernel, which sent each
view its new figure, and only then did the page redraw. That round trip was 20–60 ms of a step's ~150 ms on a small
machine (issue 37). The kernel already builds the steps around the shown one ahead of time; :class:`StepSync`
also sends them to the page (:meth:`StepSync.prepare`), where they wait. When the slider moves in the page (a key,
a drag, Play), the page applies the prepared values of that step to every view at once, in one task: figures,
summary line and token strip from the same step. The kernel still answers the slider as before; its values are
the ones already shown, so the page sees no change and draws nothing twice. An answer for a step the slider has
already left (keys faster than the kernel: ipywidgets sends the page's next value only once the kernel has
answered the last) is put back in the same task for a few seconds after the page moved, so a passed step is never
painted again. A step that is not prepared takes the kernel's path, as before.

Applying a prepared step still redrew three plotly figures, ~90 ms of plotly.js in one task on a small machine
and 190-210 ms in one CI run, over the 200 ms a step may take. So the page also draws the figures of the prepared
steps up to two either side of the slider ahead of time, out of sight, one figure per idle callback, and a panel
whose model then takes such a figure swaps the drawn one in instead of redrawing (:mod:`.panel`): a step takes
10-60 ms from the key to the frame that shows it.

Values are applied with the target model's ``set_state``, as if the kernel had sent them: nothing is queued to be
sent back, and the kernel stays the owner of every view's state.

A step sync whose module loaded late on a busy page keeps taking the kernel's messages (:mod:`.listening`); the
prepared steps it may have dropped come again when it tells the kernel it is ready.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import ipywidgets as W
import traitlets
from ipywidgets import widget_serialization

from .listening import KEEP_LISTENING_JS, Listening

__all__ = ["StepSync"]

# The page keeps this many prepared steps (the oldest go first); a step of the dashboard is ~100 kB.
_KEEP = 96
# The page draws the figures of the prepared steps up to this many steps either side of the slider ahead of time.
_AROUND = 2
# How long after moving ahead of the kernel the page keeps a passed step from being drawn again (ms): the kernel's
# answers for the steps in between come within a few hundred ms; a later change is the kernel's to make.
_HOLD_MS = 3000

_ESM = KEEP_LISTENING_JS + r"""
const ref = r => String(r || "").replace(/^IPY_MODEL_/, "");

export default {
  initialize({ model }) {
    const ready = new Map();  // step → {view name: value}
    let targets = null;       // view name → [widget model, trait]
    let slider = null;
    model.on("msg:custom", msg => {
      if (!msg || msg.step === undefined) return;
      ready.delete(msg.step);
      ready.set(msg.step, msg.values);
      while (ready.size > KEEP) ready.delete(ready.keys().next().value);
      drawAhead();
    });
    // The figures of the prepared steps nearest the slider are drawn ahead, out of sight, while the page is idle
    // (panel.py): moving there then swaps them in instead of redrawing. One figure per idle callback, so a key
    // pressed meanwhile waits for one figure's draw at most.
    let queue = [], idle = null;
    // Safari has no requestIdleCallback: a short timeout stands in for it there.
    const whenIdle = globalThis.requestIdleCallback ? fn => requestIdleCallback(fn) : fn => setTimeout(fn, 50);
    const left = () => { globalThis.__specter_lab_drawing_ahead = queue.length; };  // 0: done (the browser test)
    const drawAhead = () => {
      if (!targets || !slider) return;
      const at = slider.get("value");
      const near = [...ready.keys()].filter(s => s !== at && Math.abs(s - at) <= AROUND)
        .sort((a, b) => Math.abs(a - at) - Math.abs(b - at));
      queue = [];
      for (const s of near)
        for (const [name, value] of Object.entries(ready.get(s))) {
          const [target, trait] = targets[name] || [];
          const panels = globalThis.__specter_lab_panels;  // panel.py's views, by their model's id
          const views = trait === "figure" && panels && panels.get(target.get("_own_id"));
          for (const draw of views || []) queue.push(() => draw(value));
        }
      if (queue.length && idle === null) idle = whenIdle(work);
      left();
    };
    const work = () => {
      idle = null;
      // a figure already drawn ahead costs nothing: go on to one that is not
      while (queue.length && !queue.shift()()) {}
      if (queue.length) idle = whenIdle(work);
      left();
    };
    // What the page moved to ahead of the kernel: for HOLD ms, a kernel answer that gives a view another value (an
    // answer for a step the slider has already left) is put back at once, in the same task, so it is never
    // painted. Without this, keys faster than the kernel showed a passed step again for a moment. The kernel's
    // answer for the step itself changes nothing (a model ignores an equal value).
    let ahead = null;  // {values, until}
    const apply = step => {
      const values = ready.get(step);
      ahead = null;
      if (!values || !targets) return;  // not prepared: the kernel's answer draws it
      for (const [name, value] of Object.entries(values)) {
        const target = targets[name];
        if (target) target[0].set_state({ [target[1]]: value });
      }
      ahead = { values, until: performance.now() + HOLD };
    };
    const hold = (name, target, trait) => () => {
      if (!ahead || performance.now() > ahead.until || !(name in ahead.values)) return;
      const want = ahead.values[name];
      const now = target.get(trait);
      if (now !== want && JSON.stringify(now) !== JSON.stringify(want)) target.set_state({ [trait]: want });
    };
    (async () => {
      await keepListening(model);  // before asking for the prepared steps (listening.py)
      const manager = model.widget_manager;
      const found = {};
      for (const [name, [r, trait]] of Object.entries(model.get("targets") || {}))
        found[name] = [await manager.get_model(ref(r)), trait];
      targets = found;
      for (const [name, [target, trait]] of Object.entries(found))
        target.on("change:" + trait, hold(name, target, trait));
      slider = await manager.get_model(ref(model.get("slider")));
      slider.on("change:value", () => { apply(slider.get("value")); drawAhead(); });
      model.send({ ready: true });  // a new page (or a reload): the kernel sends the steps it has ready
    })().catch(err => console.warn("specter_lab: step sync", err));
  },
  render() {}
};
""".replace("KEEP", str(_KEEP)).replace("HOLD", str(_HOLD_MS)).replace("AROUND", str(_AROUND))


class StepSync(Listening):
    """Prepared steps of ``slider``, applied in the page when the slider moves there.

    ``targets`` maps a view's name to ``[widget, trait]`` (a :class:`~.panel.FigurePanel` and ``"figure"``, an
    ``HTML`` and ``"value"``). :meth:`prepare` sends one step's values; ``on_ready`` is called (in the kernel)
    when a page has loaded the widget and can take prepared steps (on display and after a reload). It has no
    view of its own; it only needs to exist in the page."""

    _esm = _ESM
    slider = traitlets.Instance(W.IntSlider).tag(sync=True, **widget_serialization)
    targets = traitlets.Dict().tag(sync=True, **widget_serialization)

    def __init__(self, slider: W.IntSlider, targets: Mapping[str, tuple[W.Widget, str]],
                 on_ready: "Callable[[], Any] | None" = None) -> None:
        super().__init__(slider=slider, targets={name: [w, trait] for name, (w, trait) in targets.items()})
        self._on_ready = on_ready
        self.on_msg(self._handle)

    def prepare(self, step: int, values: Mapping[str, Any]) -> None:
        """Send ``step``'s values (view name → the value its trait will have when the kernel shows the step)."""
        if self.comm is not None:
            self.send({"step": int(step), "values": dict(values)})

    def _handle(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("ready") and self._on_ready is not None:
            self._on_ready()
