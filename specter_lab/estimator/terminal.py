"""The estimate in a terminal: the table fitted to the terminal's width (rich), the columns that decide first
(strategy, tok/s, band, what runs it), every column with ``--wide``; and the whole estimate as JSON.

rich is the table library: it measures the terminal, wraps long cells inside their column and never lets a row
run past the width (pandas' ``to_string`` writes ~330-character rows that a 120-column terminal wraps in three)."""

from __future__ import annotations

import io
import json
import shutil

from .commands import report

__all__ = ["render_estimate", "estimate_json", "NARROW", "WIDE"]

NARROW = ("strategy", "tokens_per_s", "band_tok_s", "runs_as")
WIDE = ("strategy", "tokens_per_s", "band_tok_s", "dominant_unknown", "later_half_tok_s", "tpot_ms", "hit_rate",
        "copies_per_token", "host_experts_per_token", "stall_ms", "host_ms", "disk_ms", "acceptance", "placement", "runs_as")
_HEADERS = {"tokens_per_s": "tok/s", "band_tok_s": "band tok/s", "runs_as": "runs today as",
            "dominant_unknown": "widest unknown", "copies_per_token": "copies/tok",
            "host_experts_per_token": "host experts/tok", "hit_rate": "hit rate",
            "later_half_tok_s": "later half tok/s"}


def _cell(v) -> str:
    if isinstance(v, float):
        return "-" if v != v else f"{v:.3g}"
    return str(v)


def table_text(df, columns, width: int) -> str:
    """``df[columns]`` as a rich table ``width`` characters wide at most (long cells wrap in their column)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    for c in columns:
        t.add_column(_HEADERS.get(c, c), justify="right" if df[c].dtype.kind in "fi" else "left",
                     overflow="fold")
    for _, row in df[list(columns)].iterrows():
        t.add_row(*(_cell(v) for v in row))
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(t)
    return buf.getvalue().rstrip("\n")


def render_estimate(e, wide: bool = False, prompt: int | None = None, gguf: str = "model.gguf",
                    width: int | None = None) -> str:
    """What ``specter-lab estimate`` prints: the report with its table fitted to ``width`` (default: the
    terminal's), and the prefill table at ``prompt`` tokens."""
    width = width or shutil.get_terminal_size((120, 40)).columns
    cols = [c for c in (WIDE if wide else NARROW) if c in e.table]
    text = report(e, table_text(e.table, cols, width)).replace("model.gguf", gguf)
    if prompt:
        pre = e.prefill(prompt)
        text += (f"\n\nPrefill, modelled, at a {prompt}-token prompt (a replay of one micro-batch of up to "
                 f"{int(pre.micro_batch.max())} tokens on the same clock, scaled to the prompt):\n"
                 + table_text(pre, ["strategy", "ttft_s", "prefill_tok_s", "decode_tok_s"], width))
    return text


def estimate_json(e, prompt: int | None = None, gguf: str = "model.gguf") -> str:
    """The whole estimate as JSON (every column, the verdict, the commands, the assumptions)."""
    s = e.cache_sizing()
    out = {"model": e.model.name, "machine": e.machine.label, "weights": e.precision.label, "context": e.context,
           "budget": e.budget.describe(), "best": e.best, "pick": e.pick, "table": e.table.to_dict(orient="records"),
           "host_given": e.machine.host is not None, "unknowns": e.unknowns, "depth": e.depth,
           "not_priced": e.not_priced,
           "cache_sizing": None if s is None else {"cliff_mib": s.cliff_mib, "enough_mib": s.enough_mib,
                                                   "budget_mib": s.budget_mib, "command": s.command()},
           "prefill": e.prefill(prompt).to_dict(orient="records") if prompt else None,
           "llama_cpp": e.llama_cpp(gguf), "engine_call": e.engine_call(), "routing": e.routing_label,
           "replay_options": {k: str(v) for k, v in e.replay_options().items()}, "assumptions": e.assumptions}
    return json.dumps(out, indent=1, default=lambda v: v.item() if hasattr(v, "item") else str(v))
