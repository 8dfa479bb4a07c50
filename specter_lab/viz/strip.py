"""The token strip as HTML: what the live view redraws while a run goes on, and the dashboard's strip.

A plotly figure costs the page a redraw of its axes and traces, and each redraw resends every trace array; an
HTML strip of the last rows costs a few kB per redraw and no script (the dashboard's slider redraws one plotly figure
fewer per step). It reads the same token records, placed by the same rule, as :func:`~.figures.tokens_figure`, which
a saved report draws.
"""

from __future__ import annotations

import html
from typing import Any, Mapping

import pandas as pd

from .frames import token_rows, token_text
from .style import GLYPH_LEGEND, STATUS_COLORS, STATUS_HELP, esc

__all__ = ["tokens_html"]

# One style block per strip, classes per cell: a cell costs ~60 bytes, not its whole style.
_STYLE = ("<style>.sl-strip{font-size:13px}.sl-strip .t{display:inline-block;min-width:14px;margin:1px;"
          "padding:0 4px;border-radius:3px;color:#fff;font:12px/18px ui-monospace,Menlo,monospace;white-space:pre;"
          "text-align:center}.sl-strip .l{display:inline-block;width:92px;color:#666;font-size:11px;"
          "text-align:right;margin-right:6px}.sl-strip .g{color:#666;font-size:11px;white-space:nowrap;display:inline-block}"
          ".sl-strip .later{opacity:.25}.sl-strip .now{outline:2px solid #111;outline-offset:0}"
          + "".join(f".sl-strip .{s}{{background:{c}}}" for s, c in STATUS_COLORS.items()) + "</style>")


def tokens_html(tokens: pd.DataFrame, kinds: Mapping[int, str], tokenizer: Any = None, wrap: int = 16,
                last_rows: int = 6, highlight_step: int | None = None) -> str:
    """The token strip as HTML, at most ``last_rows`` rows: one cell per token coloured by status (rejected
    drafts struck through, with the token they were), a title line with the counts, and a legend of the
    statuses shown. ``tokens``: the tokens frame (of a snapshot or a finished trace); ``kinds``: step → kind.

    Without ``highlight_step`` (the live view) a longer strip shows its last rows. With it (the dashboard, as
    :func:`~.figures.tokens_figure` draws it) that step's cells are outlined and every later step's dimmed, and
    a longer strip shows the rows that end at that step, so the step a slider shows is always in view."""
    committed = int(tokens.committed.sum()) if len(tokens) else 0
    counts = tokens.status.value_counts() if len(tokens) else pd.Series(dtype=int)
    parts = [f"{int(counts[s])} {s}" for s in STATUS_COLORS if s in counts.index and s != "prefill"]
    placed = token_rows(tokens, kinds, wrap) if len(tokens) else tokens.assign(row=[], col=[], row_label=[])
    n_rows = int(placed.row.max()) + 1 if len(placed) else 0
    more = n_rows > last_rows
    marked = placed.row[placed.step == highlight_step] if highlight_step is not None else placed.row[:0]
    end = int(marked.max()) if len(marked) else n_rows - 1
    shown = placed[(placed.row > end - last_rows) & (placed.row <= end)] if more else placed
    first = int(shown.row.min()) if len(shown) else 0
    where = (f" · last {last_rows} rows" if highlight_step is None else
             f" · rows {first}–{first + last_rows - 1} of {n_rows}") if more else ""
    title = f"<b>Tokens</b> · {committed} generated" + (f" ({', '.join(parts)})" if parts else "") + where
    rows = []
    for _, d in shown.groupby("row", sort=True) if len(shown) else ():
        cells = "".join(_cell(r, tokenizer, highlight_step) for r in d.sort_values("col").itertuples())
        rows.append(f"<div><span class='l'>{esc(d.row_label.iloc[0])}</span>{cells}</div>")
    legend = " ".join(f'<span class="t {s}" title="{_attr(STATUS_HELP[s])}">{s}</span>'
                      for s in STATUS_COLORS if s in counts.index)
    glyphs = (f"<span class='g'>{esc(GLYPH_LEGEND)}</span>" if tokenizer is not None else "")
    # Each part of the title line wraps as a whole: a narrow cell put the legend's last chip alone on a line (E15).
    parts = "".join(f"<span style='white-space:nowrap;margin-right:1em'>{p}</span>" for p in (title, legend, glyphs) if p)
    return f"{_STYLE}<div class='sl-strip'><div>{parts}</div>{''.join(rows)}</div>"


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def _cell(r, tokenizer: Any, highlight_step: int | None = None) -> str:
    text = token_text(r.token_id, tokenizer)
    if r.status == "rejected":
        text = f"<s>{text}</s>"
    tip = _attr(f"{r.status} · index {r.index} · step {r.step}")
    when = "" if highlight_step is None else (" now" if r.step == highlight_step else
                                             " later" if r.step > highlight_step else "")
    return f'<span class="t {r.status}{when}" title="{tip}">{text}</span>'
