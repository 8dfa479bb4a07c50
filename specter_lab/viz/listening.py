"""Widgets whose page side keeps taking the kernel's messages when their module loaded late.

anywidget (0.11.0, and its repository in February 2026) holds a model's messages from the kernel until the
widget's module has loaded in the page, and gives up two seconds after the model was made: from then on the model
drops every message from the kernel, for good (anywidget logs "Failed to initialize model" only when no message
was waiting). A page busy for longer when a cell displays widgets (plotly.js loading, figures drawing, a slow or
loaded machine) leaves such a model deaf, and its views never change again. CI met it on 2026-12-06: after Run
All, 01's dashboard showed step 5 in two figures and the first step in the third, and its step sync never heard a
prepared step.

Once the module runs there is nothing left to wait for, so :data:`KEEP_LISTENING_JS` (a function the module of a
:class:`Listening` widget calls from its ``initialize``) hands the model's messages straight to ipywidgets, which
is what anywidget does once the module has loaded in time. A model may have dropped messages before that; a
widget whose state matters asks the kernel for its state again (``request_state``, ipywidgets' own message).

It finds the page's model by the id the kernel gave it (:class:`Listening` makes the model id itself, so that
the module can read it from the synced ``_own_id``: anywidget hands a module a proxy of the model, without its id).
"""

from __future__ import annotations

import uuid
from typing import Any

import anywidget
import traitlets

__all__ = ["KEEP_LISTENING_JS", "Listening"]


class Listening(anywidget.AnyWidget):
    """An anywidget whose module can find its own model in the page (``_own_id`` is the model's id), so that it
    can keep taking the kernel's messages (:data:`KEEP_LISTENING_JS`)."""

    _own_id = traitlets.Unicode().tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        own = uuid.uuid4().hex
        super().__init__(model_id=own, _own_id=own, **kwargs)


# keepListening(model) → the widget manager's model (null where anywidget does not hold messages this way). The
# model's comm takes its messages again through ipywidgets' own handler, the one anywidget's AnyModel wraps.
KEEP_LISTENING_JS = r"""
async function keepListening(model) {
  const id = model.get("_own_id");  // none in a widget state saved by an older version: nothing to do
  const real = id ? await Promise.resolve(model.widget_manager.get_model(id)).catch(() => null) : null;
  if (!real) return null;
  const anyModel = Object.getPrototypeOf(real), base = Object.getPrototypeOf(anyModel);
  const wraps = Object.prototype.hasOwnProperty.call(anyModel, "_handle_comm_msg");
  if (!real.comm || !wraps || typeof base._handle_comm_msg !== "function") return null;
  real.comm.on_msg(msg => base._handle_comm_msg.call(real, msg));
  return real;
}
"""
