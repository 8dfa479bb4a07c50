"""A link to a file the kernel wrote that hands the reader the file itself, wherever the notebook runs (issue 55).

A plain link cannot: its address must be the file's as the server serves it (``/files/…`` below the server's
root in JupyterLab and Notebook 7, something else in VS Code), and a relative one resolved against JupyterLab's
own page and saved that 4.5 KB page under the file's name (E1). A report opened through JupyterLab is shown in
its HTML viewer, sandboxed: its figures stayed blank until the reader found "Trust HTML" (E2).

So the page asks the kernel for the bytes on a click and makes the file there: :class:`FileLink` with
``action="download"`` saves it as a download, ``action="open"`` opens it in a new tab of its own (a blob URL of
the page's origin: not sandboxed, its scripts run, so a report's figures draw). The tab is opened within the
click, before the bytes arrive, so no popup blocker stops it.
"""

from __future__ import annotations

import mimetypes
import os
from typing import Any

import traitlets

from .listening import KEEP_LISTENING_JS, Listening

__all__ = ["FileLink", "file_link"]


_ESM = KEEP_LISTENING_JS + r"""
export default {
  // The reply may come while the page is busy: keep taking the kernel's messages (listening.py).
  initialize({ model }) {
    keepListening(model).catch(err => console.warn("specter_lab: file link", err));
  },
  render({ model, el }) {
    const pending = new Map();  // request id → the tab opened for it (null: a download)
    const a = document.createElement("a");
    a.href = "#";
    a.className = "sl-file-link";
    const note = document.createElement("span");
    const draw = () => {
      a.textContent = model.get("name");
      a.title = model.get("action") === "open" ? "open it in a new tab" : "download it";
      note.textContent = ` (${model.get("size")})`;
    };
    draw();
    el.style.fontSize = "12px";
    el.append(model.get("prefix") ? model.get("prefix") + " " : "", a, note);
    a.addEventListener("click", ev => {
      ev.preventDefault();
      const id = Math.random().toString(36).slice(2);
      pending.set(id, model.get("action") === "open" ? window.open("", "_blank") : null);
      model.send({ method: "fetch", id });
    });
    const onMsg = (msg, buffers) => {
      if (!msg || msg.method !== "file" || !pending.has(msg.id)) return;  // another view's request
      const tab = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) { note.textContent = ` (${msg.error})`; if (tab) tab.close(); return; }
      const url = URL.createObjectURL(new Blob(buffers, { type: msg.mime }));
      if (tab) tab.location.href = url;
      else {
        const d = document.createElement("a");
        d.href = url;
        d.download = msg.name;
        document.body.appendChild(d);
        d.click();
        d.remove();
      }
      setTimeout(() => URL.revokeObjectURL(url), 60000);  // the tab or the download has read it by then
    };
    model.on("msg:custom", onMsg);
    model.on("change", draw);
    return () => { model.off("msg:custom", onMsg); model.off("change", draw); };
  }
};
"""


class FileLink(Listening):
    """``prefix`` and a link named after the file at ``path`` (its size beside it): a click hands the page the
    file's bytes, then saves them as a download (``action="download"``) or opens them in a new tab
    (``action="open"``). The file is read when clicked, so the link gives what the file holds then."""

    _esm = _ESM
    name = traitlets.Unicode("").tag(sync=True)
    size = traitlets.Unicode("").tag(sync=True)
    prefix = traitlets.Unicode("").tag(sync=True)
    action = traitlets.Unicode("download").tag(sync=True)

    def __init__(self, path: "str | os.PathLike", action: str = "download", prefix: str = "wrote",
                 **kwargs: Any) -> None:
        if action not in ("download", "open"):
            raise ValueError(f"action={action!r}: use 'download' or 'open'.")
        self.path = os.path.abspath(path)
        super().__init__(name=os.path.basename(self.path), size=_size(self.path), prefix=prefix, action=action,
                         **kwargs)
        self.on_msg(self._answer)

    def _answer(self, _widget: Any, content: dict, _buffers: Any) -> None:
        if not isinstance(content, dict) or content.get("method") != "fetch":
            return
        reply = {"method": "file", "id": content.get("id"), "name": self.name,
                 "mime": mimetypes.guess_type(self.name)[0] or "application/octet-stream"}
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as exc:  # moved or deleted since: say so where the reader clicked
            self.send({**reply, "error": f"cannot read it: {exc.strerror or exc}"})
            return
        self.size = _size(self.path)
        self.send(reply, buffers=[data])


def _size(path: str) -> str:
    n = os.path.getsize(path)
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB" if n >= 1000 else f"{n} B"


def file_link(path: "str | os.PathLike", action: str = "download", prefix: str = "wrote") -> FileLink:
    """A :class:`FileLink` to ``path``: display it in a cell (``action="open"`` for an HTML report to read)."""
    return FileLink(path, action=action, prefix=prefix)
