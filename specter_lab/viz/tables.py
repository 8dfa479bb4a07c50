"""Wide result tables as a notebook cell can show them: the columns that matter, numbers formatted for reading,
and the rest on demand.

A ``sl.compare`` frame has 30 columns; pandas draws all of them, with every float at six decimals, ``k`` as
``8.0`` or ``NaN`` and long text wrapped over many lines, so the table runs far past the cell and the column the
prose is about is off screen. :func:`table` keeps the DataFrame as it is (``.frame``) and only changes how it is
shown: the chosen columns in a compact HTML table, then a closed "all N columns" section with the whole frame
(opened with a click; ``.full()`` shows it as the main table).

No pandas ``Styler`` here on purpose: it needs jinja2 at display time and still sizes columns to their longest
text; this is a few lines of HTML with inline styles, which JupyterLab draws as is.
"""

from __future__ import annotations

import html
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

__all__ = ["Table", "table", "format_value"]

# Columns shown as whole numbers (a float column because pandas stores NaN there), or "auto" / "—".
_INT_COLUMNS = {"k", "K", "slots_per_layer", "slots", "residents/layer", "new_tokens", "moe_layers", "experts",
                "top_k", "buffers", "baseline_slots", "residents", "draft_bytes", "prompt", "first_commit_tokens"}
# Ratios of two times: printed as "1.23×".
_RATIO_PREFIXES = ("speedup", "vs_", "factor")
_RATIO_SUFFIXES = ("_speedup", "_vs_lru", "_over_oracle", "_over_lru", "x_of_bound")

MISSING = "—"


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # arrays, lists
        return False


def _is_ratio(column: str) -> bool:
    c = column.lower()
    return c.startswith(_RATIO_PREFIXES) or c.endswith(_RATIO_SUFFIXES)


def format_value(v: Any, column: str = "", digits: int = 3, max_chars: int = 40) -> str:
    """One cell as text: missing → "—"; a whole-number column (``k``, slots, counts) as an int, "auto" kept; a
    ratio column (``speedup*``, ``*_vs_lru``, ``factor``) as ``1.23×``; other floats with ``digits`` decimals
    below 10, 2 decimals below 1000, thousands separators above; long text cut to ``max_chars`` (the full text
    is in the cell's tooltip)."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if _is_missing(v):
        return MISSING
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}" if column not in ("prompt", "k", "K") else str(int(v))
    if isinstance(v, numbers.Real):
        x = float(v)
        if math.isinf(x):
            return "∞" if x > 0 else "−∞"
        if column in _INT_COLUMNS and x == int(x):
            return str(int(x)) if column in ("prompt", "k", "K") else f"{int(x):,}"
        if _is_ratio(column):
            return f"{x:.2f}×"
        a = abs(x)
        if a >= 1000:
            return f"{x:,.0f}"
        if a >= 10:
            return f"{x:.2f}"
        return f"{x:.{digits}f}"
    text = str(v)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


_TABLE_STYLE = "border-collapse:collapse;font-size:12px;font-variant-numeric:tabular-nums;margin:2px 0"
# Headers may break after an underscore (``stall_ms_<wbr>per_token``): snake_case names are the widest part of a
# numeric table, and the browser only breaks them when the table would not fit its cell otherwise.
_TH_STYLE = ("padding:3px 6px;border-bottom:1px solid #bbb;text-align:right;white-space:normal;font-weight:600;"
             "vertical-align:bottom")
_TD_STYLE = "padding:2px 6px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap"


def _header(name: Any) -> str:
    return html.escape(str(name)).replace("_", "_<wbr>")


def _html_table(df: pd.DataFrame, show_index: bool, formats: Mapping[str, Callable[[Any], str]], digits: int,
                max_chars: int) -> str:
    cols = list(df.columns)
    names = [str(n) for n in (df.index.names if show_index else [])]
    head = "".join(f"<th style='{_TH_STYLE};text-align:left'>{_header(n) if n != 'None' else ''}</th>"
                   for n in names)
    head += "".join(f"<th style='{_TH_STYLE}'>{_header(c)}</th>" for c in cols)
    rows = []
    for idx, row in zip(df.index, df.itertuples(index=False, name=None)):
        cells = ""
        if show_index:
            keys = idx if isinstance(idx, tuple) else (idx,)
            cells += "".join(f"<td style='{_TD_STYLE};text-align:left'><b>{html.escape(format_value(k))}</b></td>"
                             for k in keys)
        for c, v in zip(cols, row):
            text = formats[c](v) if c in formats else format_value(v, str(c), digits, max_chars)
            full = str(v)
            tip = f" title='{html.escape(full, quote=True)}'" if text.endswith("…") else ""
            align = ";text-align:left" if isinstance(v, str) and not text.endswith("×") else ""
            if isinstance(v, str) and len(text) > 48:  # prose (a description): wraps in a column of its own
                align += ";white-space:normal;min-width:280px;max-width:520px"
            cells += f"<td style='{_TD_STYLE}{align}'{tip}>{html.escape(text)}</td>"
        rows.append(f"<tr>{cells}</tr>")
    return (f"<table class='sl-table' style='{_TABLE_STYLE}'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


@dataclass
class Table:
    """A DataFrame (``frame``, unchanged) shown as a compact table of ``columns``, with the remaining columns
    in a closed "all columns" section below it. ``full()`` shows every column; ``frame`` is for computing."""

    frame: pd.DataFrame
    columns: list = field(default_factory=list)
    title: str = ""
    digits: int = 3
    max_chars: int = 40
    formats: dict = field(default_factory=dict)
    details: bool = True

    def __post_init__(self) -> None:
        missing = [c for c in self.columns if c not in self.frame.columns]
        if missing:
            raise ValueError(f"table(columns=...): {missing} are not columns of the frame; it has "
                             f"{list(self.frame.columns)}")
        if not self.columns:
            self.columns = list(self.frame.columns)

    @property
    def hidden(self) -> list:
        """The frame's columns the compact table leaves out."""
        return [c for c in self.frame.columns if c not in self.columns]

    def full(self) -> "Table":
        """Every column, formatted (in a box that scrolls sideways when it is wider than the cell)."""
        return Table(self.frame, list(self.frame.columns), self.title, self.digits, self.max_chars, self.formats,
                     details=False)

    def _show_index(self) -> bool:
        return not isinstance(self.frame.index, pd.RangeIndex)

    def _repr_html_(self) -> str:
        shown = _html_table(self.frame[self.columns], self._show_index(), self.formats, self.digits, self.max_chars)
        title = (f"<div style='font-size:12px;color:#555;margin-bottom:2px'>{html.escape(self.title)}</div>"
                 if self.title else "")
        out = f"{title}<div style='max-width:100%;overflow-x:auto'>{shown}</div>"
        if self.details and self.hidden:
            every = _html_table(self.frame, self._show_index(), self.formats, self.digits, self.max_chars)
            out += (f"<details style='font-size:12px;margin-top:2px'><summary style='cursor:pointer;color:#555'>"
                    f"all {len(self.frame.columns)} columns ({len(self.hidden)} more: "
                    f"{html.escape(', '.join(map(str, self.hidden[:6])))}{', …' if len(self.hidden) > 6 else ''})"
                    f"</summary><div style='max-width:100%;overflow-x:auto'>{every}</div></details>")
        return out

    def __repr__(self) -> str:
        shown = self.frame[self.columns].copy()
        for c in shown.columns:
            shown[c] = [format_value(v, str(c), self.digits, self.max_chars) for v in shown[c]]
        more = f"\n({len(self.hidden)} more columns: .full() or .frame)" if self.details and self.hidden else ""
        return (self.title + "\n" if self.title else "") + shown.to_string() + more


def table(df: pd.DataFrame, columns: "Sequence[str] | None" = None, *, title: str = "", digits: int = 3,
          max_chars: int = 40, formats: "Mapping[str, Callable[[Any], str]] | None" = None) -> Table:
    """Show ``df`` so it fits its cell: only ``columns`` (default: all), numbers formatted (:func:`format_value`),
    long text cut with the full text as a tooltip, and every other column in a closed section below. The
    DataFrame itself is ``.frame``; ``.full()`` shows all columns. ``formats`` maps a column to its own
    formatter (a function of the cell's value)."""
    return Table(df, list(columns or []), title, digits, max_chars, dict(formats or {}))
