"""The commands an estimate emits: llama.cpp flags for the fastest placement llama.cpp can express, the specter_lab
``Engine`` call for the fastest of our strategies, and the printed report."""

from __future__ import annotations

from ..run import STRATEGIES

__all__ = ["llama_cpp_command", "engine_call", "report", "LLAMA_CPP_PLACEMENTS"]

# Placements stock llama.cpp runs: everything on the GPU, whole layers' experts on the host, the expert cache
# (--moe-cache-mib, mainline since tag b12191: ggml-org/llama.cpp docs/moe-cache.md).
LLAMA_CPP_PLACEMENTS = ("resident", "static_split", "global_lru")
MiB = 2**20


def _ot_regex(layers: list[int]) -> str:
    """The -ot override that keeps ``layers``' routed experts in host memory (tensors ``blk.N.ffn_*_exps``)."""
    return "blk\\.(" + "|".join(str(i) for i in layers) + ")\\.ffn_.*_exps\\.=CPU"


def llama_cpp_command(e, model_path: str = "model.gguf") -> str:  # e: an estimate.core.Estimate
    """``llama-server`` flags for the fastest of :data:`LLAMA_CPP_PLACEMENTS` in the estimate (a cache flag only
    where the cache beats the static split)."""
    rows = e.table[e.table.strategy.isin(LLAMA_CPP_PLACEMENTS)]
    best = str(rows.iloc[0]["strategy"])
    # --no-mmap reads the whole file into RAM; where RAM is short (ram=, rows reading from disk) the file must stay
    # mapped, so that the page cache can drop experts and read them again
    mmap = "" if e.table.disk_ms.max() > 0 else " --no-mmap"
    parts = [f"llama-server -m {model_path} -ngl 99 -c {e.context}{mmap}"]
    if e.machine.host is not None and e.machine.host.cores:
        parts.append(f"--threads {e.machine.host.cores}")
    dense_offset = e.model.dense_layers  # llama.cpp numbers blocks over all decoder layers
    if best == "static_split":
        n = e.placements["static_split"]["n_cpu_moe"]
        ot = _ot_regex([dense_offset + i for i in range(n)])
        # --n-cpu-moe counts blocks from 0, dense ones included (DeepSeek's block 0): n expert layers need n + offset
        flags = " ".join(parts) + f" --n-cpu-moe {n + dense_offset if n else 0}"
        return f"{flags}\n# or, the same layers by name: {' '.join(parts)} -ot \"{ot}\""
    if best == "global_lru":
        mib = int(e.budget.experts // MiB)
        share = e.placements["global_lru"]["cpu_share"]
        cached = " ".join(parts) + f" --cpu-moe --moe-cache-mib {mib}" + (
            f" --moe-cache-cpu-share {share:g}" if share else "")
        split = e.placements.get("static_split")
        if split is None:
            return cached
        tps = e.row("static_split").tokens_per_s
        return (f"{cached}\n# without the expert cache (llama.cpp before b12191), the split at {tps:.3g} tok/s: "
                f"{' '.join(parts)} --n-cpu-moe {split['n_cpu_moe'] + dense_offset if split['n_cpu_moe'] else 0}")
    return " ".join(parts)


def engine_call(e) -> str:
    """``sl.Engine(...)`` with the fastest of our strategies at this expert budget on this machine's profile."""
    ours = e.table[e.table.strategy.map(lambda s: s in STRATEGIES)]
    if e.budget.all_fit or ours.empty:
        strategy, budget = "static_split", "1.0"
    else:
        strategy, budget = str(ours.iloc[0]["strategy"]), f"'{e.budget.experts / 2**30:.2f}GiB'"
    share = e.placements.get(strategy, {}).get("cpu_share")
    extra = f"cpu_share={share:g}, " if share else ""
    return (f"sl.Engine(model, tok, strategy={strategy!r}, expert_budget={budget}, {extra}"
            f"hardware='{e.machine.hardware_name}@compiled')  # prices bf16 experts: its weights are the "
            "checkpoint's")


def _yours(e) -> list[str]:
    """The user's own flags against the best placement, in one line."""
    if "yours" not in e.placements:
        return []
    y, b = e.row("yours"), e.row(e.best)
    gain = b.tokens_per_s / y.tokens_per_s
    notes = "".join(f" Note: {n}." for n in e.placements["yours"]["notes"])
    return [f"Your flags ({e.placements['yours']['flags']}): {y.tokens_per_s:.3g} tok/s (band {y.band_tok_s}); the "
            f"best, {e.best}, {b.tokens_per_s:.3g} tok/s: {gain:.2f}x by changing it.{notes}"]


def _sizing(e) -> list[str]:
    s = e.cache_sizing()
    return [] if s is None else [s.describe()]


def report(e) -> str:
    """What ``specter-lab estimate`` prints."""
    g = e.model
    head = (f"Estimate for {g.name} ({g.model_type}: {g.total_params / 1e9:.1f}B params, {g.moe_layers} MoE layers x "
            f"{g.num_experts} experts, top-{g.top_k}, {g.active_params / 1e9:.2f}B read per token) at weights "
            f"{e.precision.label}, context {e.context}, on {e.machine.label}.")
    disk = ["disk_reads_per_token", "disk_ms"] if e.table.disk_ms.max() > 0 else []  # host RAM short: ram=
    cols = ["strategy", "tokens_per_s", "band_tok_s", "dominant_unknown", "tpot_ms", "hit_rate", "copies_per_token",
            "host_experts_per_token", *disk[:1], "device_ms", "link_ms", "host_ms", *disk[1:], "placement", "runs_as"]
    table = e.table[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}")
    best = e.row(e.best)
    band = (f"Band for {e.best}: {best.low_tok_s:.3g}-{best.high_tok_s:.3g} tok/s"
            + (f"; the unknown that dominates it: {best.dominant_unknown} ({e.unknowns.get(best.dominant_unknown)})"
               if best.dominant_unknown else ""))
    warn = ([] if e.machine.host is not None else
            ["Host not given: the band spans a desktop from dual-channel DDR4-2666 to DDR5-6400; give --host "
             "ddr5-5600x2 (your memory), a measured GB/s, or 'calibrated' after `specter-lab calibrate --host`."])
    if e.machine.ram is None:
        warn.append("Host RAM not given: every expert is assumed to be in RAM; give --ram 32GB (the RAM free for the "
                    "model) to price the experts read from disk when it is short.")
    lines = [head, e.budget.describe() + ".", *warn, "", "Decode, modelled (fastest first):", table, "", band + ".",
             f"Placement it implies: {e.best}: {best.placement}.", *_yours(e), *_sizing(e), "", "Run it:",
             "  " + e.llama_cpp().replace("\n", "\n  "), "  " + e.engine_call(), "", "Assumptions:"]
    if "global_lru" not in STRATEGIES:
        lines.insert(-1, "  (global_lru is priced here; the Engine strategy of that name is not in this install.)")
    return "\n".join(lines + [f"  * {a}" for a in e.assumptions])
