"""What the views show, computed from a run's frames: pure pandas, no plotly (testable without it).

Every function accepts a :class:`~specter_lab.run.engine.GenerationResult`, its ``Trace`` or the dict of frames
from ``trace.frames()``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from .style import ROUTING_CATEGORIES, esc

__all__ = ["Frames", "as_frames", "clock_label", "default_routing_step", "grid_shape", "hit_rates", "positions_text",
           "residency", "routing_cells", "run_meta", "step_outlines", "timeline_steps", "token_rows", "token_text"]


Frames = dict[str, pd.DataFrame]

def as_frames(result: Any) -> Frames:
    """Frames of a GenerationResult, a Trace or an already-made dict of frames."""
    if isinstance(result, Mapping):
        return dict(result)
    trace = getattr(result, "trace", result)
    return trace.frames()

def run_meta(result: Any) -> dict[str, Any]:
    """``trace.meta`` of a GenerationResult or a Trace (the ``meta`` entry of a dict of frames): which clock, which
    strategy, the model's shape; every title and axis label says where its times came from with it."""
    if isinstance(result, Mapping):
        return dict(result.get("meta", {})) if isinstance(result.get("meta"), Mapping) else {}
    trace = getattr(result, "trace", result)
    return dict(getattr(trace, "meta", {}) or {})

def clock_label(meta: Mapping[str, Any]) -> str:
    """How the times were produced, for axis titles: 'simulated (profile X)' or 'measured (CUDA)', plus
    'projected as <shape>' when experts were priced as a bigger real model."""
    clock = str(meta.get("clock") or "")
    simulated = meta.get("simulated")
    if simulated is None:
        simulated = clock.startswith("simulated")
    if simulated:
        label = f"simulated (profile {meta.get('profile') or clock.partition(':')[2] or '?'})"
    else:
        device = clock.partition(":")[2] if clock.startswith("cuda:") else ""
        label = f"measured (CUDA{', ' + device if device else ''})"
    if meta.get("projected"):
        label += f", projected as {meta.get('cost_shape')}"
    return label

def default_routing_step(frames: Frames) -> int:
    """The decode/window step whose target routing has the most rows (the widest verification pass); step 0
    (the prefill) only when the run has no other step. Ties go to the earliest step."""
    ro = frames["routing"]
    tgt = ro[ro.source == "target"]
    later = tgt[tgt.step >= 1]
    use = later if len(later) else tgt
    if use.empty:
        steps = frames["steps"]
        return int(steps.step.iloc[-1]) if len(steps) else 0
    counts = use.groupby("step").size()
    return int(counts.index[counts.values.argmax()])

def routing_cells(result: Any, step: int) -> pd.DataFrame:
    """One row per (layer, expert) of the model for one step: forecast count, target count, the token positions
    that chose it, and the category (see ``ROUTING_CATEGORIES``).

    "predicted" = the step's forecast rows; "used" = the step's target routing rows (for a window step, the
    verification pass)."""
    return _routing_cells(as_frames(result), run_meta(result), step)

def grid_shape(f: Frames, meta: Mapping[str, Any]) -> tuple[int, int]:
    """(layers, experts) from trace.meta, else from the largest ids seen in the frames."""
    ro, fc = f["routing"], f["forecast"]
    seen = pd.concat([ro[["layer", "expert"]], fc[["layer", "expert"]]])
    n_layers = int(meta.get("num_layers") or (seen.layer.max() + 1 if len(seen) else 1))
    n_experts = int(meta.get("num_experts") or (seen.expert.max() + 1 if len(seen) else 1))
    return n_layers, n_experts

def _routing_cells(f: Frames, meta: Mapping[str, Any], step: int) -> pd.DataFrame:
    ro, fc = f["routing"], f["forecast"]
    n_layers, n_experts = grid_shape(f, meta)
    grid = pd.MultiIndex.from_product([range(n_layers), range(n_experts)], names=["layer", "expert"])
    tgt = ro[(ro.source == "target") & (ro.step == step)]
    used = tgt.groupby(["layer", "expert"]).agg(target_count=("position", "size"),
                                                 positions=("position", lambda p: sorted(set(int(x) for x in p))))
    pred = fc[fc.step == step].groupby(["layer", "expert"])["count"].sum().rename("forecast_count")
    cells = pd.DataFrame(index=grid).join(used).join(pred).reset_index()
    cells["target_count"] = cells.target_count.fillna(0).astype(int)
    cells["forecast_count"] = cells.forecast_count.fillna(0).astype(int)
    cells["positions"] = [p if isinstance(p, list) else [] for p in cells.positions]
    is_pred, is_used = cells.forecast_count > 0, cells.target_count > 0
    code = np.select([is_pred & is_used, is_pred & ~is_used, ~is_pred & is_used], [1, 2, 3], default=0)
    cells["code"] = code
    cells["category"] = [ROUTING_CATEGORIES[c] for c in code]
    return cells

def positions_text(pos: list[int], limit: int = 12) -> str:
    """Token positions for a hover text, the first ``limit`` of them and a count of the rest."""
    if not pos:
        return "–"
    shown = ", ".join(str(p) for p in pos[:limit])
    return shown + (f" … (+{len(pos) - limit})" if len(pos) > limit else "")

def residency(result: Any, step: int) -> pd.DataFrame:
    """Which experts sit in device slots at the end of ``step``: one row per resident (layer, expert) with its
    slot, the step and reason of the load that put it there.

    A transfer makes (layer, expert) resident and its 'evict' cache event removes it. An expert cannot be loaded
    again while resident, so it is resident exactly when it has had more loads than evictions up to that step;
    counting avoids relying on time order, which a prefetch issued in the past (the oracle's) would break."""
    f = as_frames(result)
    tr = f["transfers"]
    tr = tr[tr.step <= step]
    ev = f["cache"]
    ev = ev[(ev.step <= step) & (ev.event == "evict")]
    loads = tr.groupby(["layer", "expert"]).size().rename("loads")
    evicts = ev.groupby(["layer", "expert"]).size().rename("evicts")
    last = tr.groupby(["layer", "expert"]).tail(1).set_index(["layer", "expert"])[["slot", "step", "reason"]]
    res = pd.concat([loads, evicts], axis=1).fillna(0)
    res = res[res.loads > res.evicts].join(last).reset_index()
    res = res.rename(columns={"step": "loaded_at_step"})[["layer", "expert", "slot", "loaded_at_step", "reason"]]
    return res.astype({"layer": int, "expert": int, "slot": int, "loaded_at_step": int})

def hit_rates(frames: Frames) -> pd.DataFrame:
    """Per step: demand hits, misses, hit rate and the running decode hit rate (coverage so far; its last value
    is the run's ``hit_rate``, which excludes the prefill)."""
    steps = frames["steps"][["step", "kind"]]
    ce = frames["cache"]
    dem = ce[ce.event.isin(["hit", "miss"])]
    cnt = dem.groupby(["step", "event"]).size().unstack(fill_value=0).reindex(columns=["hit", "miss"], fill_value=0)
    out = steps.set_index("step").join(cnt).fillna({"hit": 0, "miss": 0}).reset_index()
    out[["hit", "miss"]] = out[["hit", "miss"]].astype(int)
    tot = out.hit + out.miss
    out["hit_rate"] = np.where(tot > 0, out.hit / tot.where(tot > 0, 1), np.nan)
    dec = out.step >= 1
    cum_h = out.hit.where(dec, 0).cumsum()
    cum_t = tot.where(dec, 0).cumsum()
    out["coverage"] = np.where(dec & (cum_t > 0), cum_h / cum_t.where(cum_t > 0, 1), np.nan)
    # Forecast recall per step (what fraction of the experts the target used had been forecast).
    fc, ro = frames["forecast"], frames["routing"]
    if len(fc):
        used = ro[ro.source == "target"][["step", "layer", "expert"]].drop_duplicates()
        pred = fc[["step", "layer", "expert"]].drop_duplicates()
        both = used.merge(pred).groupby("step").size()
        n_used = used[used.step.isin(pred.step.unique())].groupby("step").size()
        out["forecast_recall"] = out.step.map((both.reindex(n_used.index, fill_value=0) / n_used)).astype(float)
    else:
        out["forecast_recall"] = np.nan
    return out

def timeline_steps(frames: Frames, step: int | None, max_steps: int, max_bars: int) -> tuple[list[int], str]:
    """Which steps to draw and a note for the title. One step, or the first steps of the run up to
    ``max_steps`` and ``max_bars`` bars (a long run would make the browser draw tens of thousands of rects)."""
    all_steps = [int(s) for s in frames["steps"].step]
    if step is not None:
        return [int(step)], ""
    bars = (frames["compute"].groupby("step").size().add(frames["transfers"].groupby("step").size(), fill_value=0)
            .reindex(all_steps, fill_value=0))
    chosen, total = [], 0
    for s in all_steps[:max_steps]:
        if chosen and total + bars[s] > max_bars:
            break
        chosen.append(s)
        total += bars[s]
    note = "" if len(chosen) == len(all_steps) else f" · first {len(chosen)} of {len(all_steps)} steps shown"
    return chosen, note

def token_text(token_id: int, tokenizer: Any) -> str:
    """A token as a strip cell shows it (HTML-escaped): decoded, with newline, tab and space made visible; the id
    without a tokenizer."""
    if tokenizer is None:
        return str(int(token_id))
    s = tokenizer.decode([int(token_id)])
    s = s.replace("\n", "↵").replace("\t", "⇥").replace(" ", "·") or "∅"
    return esc(s)

def token_rows(tok: pd.DataFrame, kinds: Mapping[int, str], wrap: int) -> pd.DataFrame:
    """Place each token on a (row, column): one row per window for speculative runs (committed tokens first,
    then the rejected drafts), otherwise the tokens in index order wrapped ``wrap`` to a row."""
    tok = tok.copy()
    tok["rejected"] = tok.status == "rejected"
    tok = tok.sort_values(["step", "rejected", "index"], kind="stable").reset_index(drop=True)
    windows = any(k == "window" for k in kinds.values()) or (tok.status == "accepted").any() or tok.rejected.any()
    if windows:
        tok["row"] = tok.step.rank(method="dense").astype(int) - 1
        tok["col"] = tok.groupby("step").cumcount()
        labels = {r: f"step {s}" for r, s in zip(tok.row, tok.step)}
    else:
        tok["row"] = np.arange(len(tok)) // wrap
        tok["col"] = np.arange(len(tok)) % wrap
        labels = {r: f"tokens {r * wrap}–{min((r + 1) * wrap, len(tok)) - 1}" for r in tok.row.unique()}
    tok["row_label"] = tok.row.map(labels)
    return tok

def step_outlines(placed: pd.DataFrame, rows: list[str], step: int | None) -> list[dict]:
    """Rectangles around the cells of ``step``, one per strip row it occupies (a marker outline would also
    outline the legend swatch)."""
    if step is None or not len(placed):
        return []
    cur = placed[placed.step == step]
    shapes = []
    for label, d in cur.groupby("row_label", sort=False):
        i = rows.index(label)
        shapes.append(dict(type="rect", xref="x", yref="y", x0=float(d.col.min()) - 0.52, x1=float(d.col.max()) + 0.52,
                           y0=i - 0.5, y1=i + 0.5, line=dict(color="#111", width=2), fillcolor="rgba(0,0,0,0)"))
    return shapes
