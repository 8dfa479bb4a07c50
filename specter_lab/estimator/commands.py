"""The commands an estimate emits (the llama.cpp flags for the fastest row llama.cpp can express, the specter_lab
``Engine`` call for the planner's pick) and the printed report.

Which rows llama.cpp expresses is each strategy's own field (``Strategy.llama_cpp``: its flags, filled from the
placement), not a list of names here."""

from __future__ import annotations

from ..run import STRATEGIES

__all__ = ["llama_cpp_command", "engine_call", "report", "llama_cpp_rows", "choices"]

MiB = 2**20


def llama_cpp_rows(e) -> list[str]:  # e: an estimate.core.Estimate
    """The rows llama.cpp runs as they are (every expert on the GPU, and the strategies with llama.cpp flags),
    fastest first."""
    return [s for s in e.table.strategy if s == "resident" or (s in STRATEGIES and STRATEGIES[s].llama_cpp)]


def _ot_regex(layers: list[int]) -> str:
    """The -ot override that keeps ``layers``' routed experts in host memory (tensors ``blk.N.ffn_*_exps``)."""
    return "blk\\.(" + "|".join(str(i) for i in layers) + ")\\.ffn_.*_exps\\.=CPU"


def _flags(e, row: str) -> str:
    """The row's own llama.cpp flags, filled from its replayed placement."""
    st = STRATEGIES.get(row)
    if st is None or not st.llama_cpp:
        return ""
    slots = e.placements[row]["slots_per_layer"]
    n_host = sum(1 for s in slots if s == 0)
    # --n-cpu-moe counts blocks from 0, dense ones included (DeepSeek's block 0): n expert layers need n + offset
    n_cpu_moe = n_host + e.model.dense_layers if n_host else 0
    return st.llama_cpp.format(n_cpu_moe=n_cpu_moe, cache_mib=int(e.placements[row]["budget_bytes"] // MiB))


def llama_cpp_command(e, model_path: str = "model.gguf") -> str:
    """``llama-server`` flags for the fastest of :func:`llama_cpp_rows` (the cache only where it beats the static
    split, which is then said as the fallback for a llama.cpp without the expert cache)."""
    rows = llama_cpp_rows(e)
    if not rows:
        return "# llama.cpp expresses none of the rows priced here"
    best = rows[0]
    mmap = "" if e.table.disk_ms.max() > 0 else " --no-mmap"  # RAM short: the file must stay mapped
    parts = [f"llama-server -m {model_path} -ngl 99 -c {e.context}{mmap}"]
    if e.machine.host is not None and e.machine.host.cores:
        parts.append(f"--threads {e.machine.host.cores}")
    base = " ".join(parts)
    flags = _flags(e, best)
    cmd = f"{base} {flags}".rstrip()
    if best == "static_split":
        slots = e.placements[best]["slots_per_layer"]
        host = [e.model.dense_layers + l for l, s in enumerate(slots) if s == 0]
        if host:
            cmd += f"\n# or, the same layers by name: {base} -ot \"{_ot_regex(host)}\""
    elif best == "global_lru" and "static_split" in rows:
        tps = e.row("static_split").tokens_per_s
        cmd += (f"\n# without the expert cache (llama.cpp before b12191), the split at {tps:.3g} tok/s: "
                f"{base} {_flags(e, 'static_split')}")
    return cmd


def engine_call(e) -> str:
    """``sl.Engine(...)`` with the planner's pick at this expert budget on this machine's llama.cpp-class clock."""
    pick = e.pick or "static_split"
    budget = "1.0" if e.budget.all_fit else f"'{e.budget.experts / 2**30:.2f}GiB'"
    return (f"sl.Engine(model, tok, strategy={pick!r}, expert_budget={budget}, "
            f"hardware='{e.machine.hardware_name}@llama.cpp', weights='{e.precision.key}')")


def choices(e) -> "pd.DataFrame":
    """The answers side by side: the planner's pick, llama.cpp's best row, the fastest row where it is neither, and
    the user's own flags (``yours``), each with its tokens/s, band, what runs it today and the command that would
    run it."""
    import pandas as pd

    ll = llama_cpp_rows(e)
    picks = [("the planner's pick", e.pick, e.engine_call() if e.pick else ""),
             ("llama.cpp's best", ll[0] if ll else None, e.llama_cpp().split("\n")[0] if ll else ""),
             ("the fastest row", e.best if e.best not in (e.pick, *ll[:1]) else None, ""),
             ("your flags", "yours" if "yours" in e.placements else None, e._inputs.get("yours") and
              f"llama-server ... {e._inputs['yours'].flags}")]
    rows = []
    for who, row, command in picks:
        if row is None:
            continue
        r = e.row(row)
        rows.append({"who": who, "strategy": row, "tokens_per_s": float(r.tokens_per_s), "band_tok_s": r.band_tok_s,
                     "runs_as": r.runs_as, "run_it": command or r.runs_as})
    return pd.DataFrame(rows)


def _yours(e) -> list[str]:
    """The user's own flags against the best row, in one line."""
    if "yours" not in e.placements:
        return []
    y, b = e.row("yours"), e.row(e.best)
    notes = "".join(f" Note: {n}." for n in e._inputs["yours"].notes)
    return [f"Your flags ({e._inputs['yours'].flags}): {y.tokens_per_s:.3g} tok/s (band {y.band_tok_s}); the "
            f"best, {e.best}, {b.tokens_per_s:.3g} tok/s: {b.tokens_per_s / y.tokens_per_s:.2f}x by changing "
            f"it.{notes}"]


def _sizing(e) -> list[str]:
    s = e.cache_sizing()
    return [] if s is None else [s.describe()]


def headline(e) -> list[str]:
    """The first lines of the report: what was estimated, and what VRAM leaves for experts."""
    g = e.model
    return [f"Estimate for {g.name} ({g.model_type}: {g.total_params / 1e9:.1f}B params, {g.moe_layers} MoE layers x "
            f"{g.num_experts} experts, top-{g.top_k}, {g.active_params / 1e9:.2f}B read per token) at weights "
            f"{e.precision.label}, context {e.context}, on {e.machine.label}.", e.budget.describe() + "."]


def verdict(e) -> list[str]:
    """The answer in words: the fastest row and its band, the planner's pick, llama.cpp's best, and the user's own
    flags."""
    best = e.row(e.best)
    band = (f"Fastest: {e.best}, {best.tokens_per_s:.3g} tok/s (band {best.low_tok_s:.3g}-{best.high_tok_s:.3g}"
            + (f"; the unknown that dominates it: {best.dominant_unknown}" if best.dominant_unknown else "") + ")")
    lines = [band + ".", f"Placement it implies: {best.placement}."]
    if e.pick:
        p = e.row(e.pick)
        lines.append(f"The planner's pick: {e.pick}, {p.tokens_per_s:.3g} tok/s ({p.runs_as}).")
    ll = llama_cpp_rows(e)
    if ll:
        r = e.row(ll[0])
        lines.append(f"llama.cpp's best: {ll[0]}, {r.tokens_per_s:.3g} tok/s ({r.runs_as}).")
    return lines + _yours(e)


def report(e, table: str | None = None) -> str:
    """What ``specter-lab estimate`` prints (``table``: the table as the terminal shows it; default: the columns
    that decide first, as text)."""
    warn = ([] if e.machine.host is not None else
            ["Host not given: the band spans a desktop from dual-channel DDR4-2666 to DDR5-6400; give --host "
             "ddr5-5600x2 (your memory), a measured GB/s, or 'calibrated' after `specter-lab calibrate --host`."])
    if e.machine.ram is None:
        warn.append("Host RAM not given: every expert is assumed to be in RAM; give --ram 32GB (the RAM free for the "
                    "model) to price the experts read from disk when it is short.")
    if table is None:
        cols = ["strategy", "tokens_per_s", "band_tok_s", "runs_as"]
        table = e.table[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}")
    lines = [*headline(e), *warn, "", "Decode, modelled (fastest first; every row a replay on the llama.cpp-class "
             "clock):", table, "", *verdict(e), *_sizing(e), "", "Run it:",
             "  " + e.llama_cpp().replace("\n", "\n  "), "  " + e.engine_call(), "", "Assumptions:"]
    return "\n".join(lines + [f"  * {a}" for a in e.assumptions])
