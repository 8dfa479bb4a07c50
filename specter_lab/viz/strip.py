"""The token strip as HTML: what the live view redraws while a run goes on.

A plotly figure costs the page a redraw of its axes and traces, and each redraw resends every trace array; an
HTML strip of the last rows costs a few kB per redraw and no script. It reads the same token records, placed by the same rule, as
:func:`~.figures.tokens_figure`, which the finished run's dashboard draws.
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
          + "".join(f".sl-strip .{s}{{background:{c}}}" for s, c in STATUS_COLORS.items()) + "</style>")


def tokens_html(tokens: pd.DataFrame, kinds: Mapping[int, str], tokenizer: Any = None, wrap: int = 16,
                last_rows: int = 6) -> str:
    """The last ``last_rows`` rows of the token strip as HTML: one cell per token coloured by status (rejected
    drafts struck through, with the token they were), a title line with the counts, and a legend of the
    statuses shown. ``tokens``: the tokens frame (of a snapshot or a finished trace); ``kinds``: step → kind."""
    committed = int(tokens.committed.sum()) if len(tokens) else 0
    counts = tokens.status.value_counts() if len(tokens) else pd.Series(dtype=int)
    parts = [f"{int(counts[s])} {s}" for s in STATUS_COLORS if s in counts.index and s != "prefill"]
    placed = token_rows(tokens, kinds, wrap) if len(tokens) else tokens.assign(row=[], col=[], row_label=[])
    more = bool(len(placed)) and placed.row.max() >= last_rows
    shown = placed[placed.row > placed.row.max() - last_rows] if more else placed
    title = (f"<b>Tokens</b> · {committed} generated" + (f" ({', '.join(parts)})" if parts else "")
             + (f" · last {last_rows} rows" if more else ""))
    rows = []
    for _, d in shown.groupby("row", sort=True) if len(shown) else ():
        cells = "".join(_cell(r, tokenizer) for r in d.sort_values("col").itertuples())
        rows.append(f"<div><span class='l'>{esc(d.row_label.iloc[0])}</span>{cells}</div>")
    legend = " ".join(f'<span class="t {s}" title="{_attr(STATUS_HELP[s])}">{s}</span>'
                      for s in STATUS_COLORS if s in counts.index)
    glyphs = (f"<span class='g'>{esc(GLYPH_LEGEND)}</span>" if tokenizer is not None else "")
    return f"{_STYLE}<div class='sl-strip'><div>{title} &nbsp; {legend} &nbsp; {glyphs}</div>{''.join(rows)}</div>"


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def _cell(r, tokenizer: Any) -> str:
    text = token_text(r.token_id, tokenizer)
    if r.status == "rejected":
        text = f"<s>{text}</s>"
    tip = _attr(f"{r.status} · index {r.index} · step {r.step}")
    return f'<span class="t {r.status}" title="{tip}">{text}</span>'
