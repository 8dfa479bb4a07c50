"""``sl.estimate``: decode speed per strategy on a machine you describe, from a model's ``config.json`` alone.

Why a replay and not the simulated engine: the engine runs a model on this CPU and prices its own routing, so an
estimate with it needs either the real weights (the download this answers before) or the bundled model's routing
projected to the target (4 layers of 32 experts top-4, whose locality is not the target family's: Qwen3-30B-A3B's
LRU hit rate at a quarter of the experts is 0.83, DeepSeek-V2-Lite's 0.50). A replay of routing at the target's
real geometry (48 layers x 128 experts top-8 for Qwen3-30B-A3B) through each placement's cache logic, priced per
layer (:mod:`.pricing`), takes about a second and changes only where the routing comes from: synthetic routing
matched to the family's published locality (:mod:`specter_lab.traces.synthetic`) now, a recorded trace
when one is given (``trace=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..model.geometry import ModelGeometry, geometry_from_config
from ..pricing.precision import WeightPrecision
from ..pricing.gpus import GPU
from ..pricing.profiles import HardwareProfile, get_host, resolve_gpu
from ..traces.synthetic import locality_for, synthetic_routing
from ..traces.trace_file import RoutingTrace, load_trace
from ..run import STRATEGIES
from ..units import parse_bytes
from . import replay
from .budget import RUNTIME_OVERHEAD, VramBudget, precision_for, vram_budget
from .bands import Scenario, combine, disk_unknown, unknowns
from .page_cache import PageCache, page_cache
from .placement import UserPlacement, parse_placement
from .prefill import prefill_table
from .sizing import CacheSizing, cache_sizing
from .speculative import ACCEPTANCE_RANGE, speculative_rows, window_time
from .pricing import HOST_DECODE_EFFICIENCY, Machine, TokenTime, price_token

__all__ = ["estimate", "Estimate", "PLACEMENTS", "NOT_ESTIMATED", "get_gpu", "routing_for"]

# Each priced strategy: what it places where, and the engine that runs it that way today.
PLACEMENTS = {
    "resident": ("every expert on the GPU", "llama.cpp -ngl 99"),
    "static_split": ("the last layers' experts on the GPU, the first N layers' on the host CPU",
                     "llama.cpp --n-cpu-moe N / -ot"),
    "global_lru": ("one LRU over every layer's expert slots; a miss is copied over the link",
                   "llama.cpp --moe-cache-mib"),
    "fiddler": ("the most routed experts of each layer fixed on the GPU, the rest computed on the host CPU",
                "ktransformers GPU experts / Fiddler"),
    "host_lru": ("a per-layer LRU; a miss with recent reuse is copied, the rest computed on the host CPU",
                 "specter_lab host_lru"),
    "lru": ("a per-layer LRU; every miss is copied over the link", "mixtral-offloading"),
    "on_demand": ("nothing kept: every routed expert copied every token", "accelerate-style offload"),
    "yours": ("your llama.cpp flags, priced as given", "llama.cpp (your flags)"),
    "spec_lru": ("a low-bit draft of every expert resident; a per-layer LRU of full-precision slots, misses of the "
                 "verify window copied on demand (modelled draft)", "specter_lab spec_lru"),
    "specter": ("a low-bit draft resident; the draft's forecast prefetches the window's misses while it drafts "
                "(modelled draft)", "specter_lab specter"),
    "specter_host": ("a low-bit draft resident; forecast misses reused in the window prefetched, the rest computed on "
                     "the host CPU (modelled draft)", "specter_lab specter_host"),
}
# Every strategy row is priced above or left out here with its reason (tests/test_strategy_lists.py holds the two
# together, so a new strategy cannot be silently missing from the estimate). The speculative rows above are priced
# with the modelled draft (estimate/speculative.py).
_UNMODELLED = "its schedule is not modelled by this replay"
NOT_ESTIMATED = {
    "specmoeoff": f"{_UNMODELLED} (SpecMoEOff's chunked top-M prefetch)",
    "specter_plus": f"{_UNMODELLED} (a K governor and forecast eviction)",
    "oracle": "reads the target's true routing: a reference, not a placement anyone runs",
    "gate_lookahead": "needs the next layer's router predictions, which a config alone does not give",
    "mixtral_offloading": "a replica of an artifact's implementation costs (write-back, one stream); its "
                          "placement is lru's",
    "lfu_decay": f"{_UNMODELLED} (decayed-LFU eviction: caching/simulate.py has it, the estimate's placements "
                 "do not use it yet)",
    "host_lfu": f"{_UNMODELLED} (decayed-LFU eviction with host execution)",
    "split_lru": f"{_UNMODELLED} (the per-token split of misses between device and host by lane)",
    "split_lfu": f"{_UNMODELLED} (the per-token split by lane, decayed-LFU eviction)",
    "split_arc": f"{_UNMODELLED} (the per-token split by lane, adaptive-replacement eviction)",
    "pregate_split": "needs the next layer's router predictions, which a config alone does not give",
    "specter_split": f"{_UNMODELLED} (the forecast's link-bounded copies and the split by lane)",
}

_TOKENS, _WARMUP = 320, 64  # replayed decode tokens; the first _WARMUP warm the caches (the prompt would)
_CPU_SHARES = (0.0, 0.25, 0.5, 0.75)  # global_lru's share of misses computed on the host: the fastest is kept


def get_gpu(gpu: "str | HardwareProfile", vram: float | None = None) -> HardwareProfile:
    """``gpu=``: a catalog name (``"rtx3060"``, ``"RTX 4060 Ti 16GB"``, ``"a4000"``: see
    :mod:`specter_lab.pricing.gpus`), a profile name or a HardwareProfile. ``vram`` (bytes) picks among a
    family's memory sizes."""
    return resolve_gpu(gpu, vram)[0]


def _vram(vram, gpu: HardwareProfile, card: GPU | None) -> float:
    if vram is None:
        if card is not None:
            return card.vram_gb * 2**30
        if gpu.device_memory is None:
            raise ValueError(f"vram= is needed: profile {gpu.name} records no device memory. Give e.g. vram='24GB'.")
        return float(gpu.device_memory)
    v = float(vram)
    # marketed "12 GB" is 12 GiB of memory: a vram above the card's by more than the GB/GiB difference is a typo
    if card is not None and v > card.vram_gb * 2**30 * 1.001:
        sizes = sorted({f"{g.vram_gb:g}GB" for g in _family(card)})
        raise ValueError(f"vram={v / 2**30:.2f} GiB is more than the {card.name} has ({card.vram_gb:g} GB): use at most "
                         f"'{card.vram_gb:g}GB'" + (f" (this family comes with {sizes})" if len(sizes) > 1 else "")
                         + ", or name the card with more memory.")
    return v


def _family(card: GPU) -> list[GPU]:
    from ..pricing.gpus import GPU_FAMILIES

    return GPU_FAMILIES.get(card.family, [card])


def routing_for(trace, geom: ModelGeometry, tokens: int = _TOKENS, seed: int = 0) -> tuple[np.ndarray, str]:
    """The routing an estimate replays, and its label. ``trace=None``: synthetic, matched to the family's
    published locality. A :class:`~specter_lab.traces.trace_file.RoutingTrace` (or the path of its ``.npz``): each
    sequence's prefill then decode routing, the sequences one after the other. An array ``[tokens, moe_layers,
    top_k]`` of expert ids is replayed as given."""
    if trace is None:
        loc = locality_for(geom.model_type)
        return synthetic_routing(geom.moe_layers, geom.num_experts, geom.top_k, tokens, loc, seed), loc.label
    label = "recorded routing trace"
    if isinstance(trace, (str, Path)):
        trace = load_trace(trace)
    if isinstance(trace, RoutingTrace):
        label = f"recorded routing trace ({trace.source or trace.config.get('model_type', '?')}, {trace.tokens} tokens)"
        trace = np.concatenate([np.concatenate([s.prefill, s.decode]) for s in trace.sequences])
    arr = np.asarray(trace)
    want = (geom.moe_layers, geom.top_k)
    if arr.ndim != 3 or arr.shape[1:] != want or arr.shape[0] <= _WARMUP:
        raise ValueError(f"trace: expected expert ids shaped [tokens > {_WARMUP}, {want[0]} MoE layers, top-{want[1]}]"
                         f" for {geom.name}, got {tuple(arr.shape)}. Record it on this model, or pass trace=None.")
    if arr.min() < 0 or arr.max() >= geom.num_experts:
        raise ValueError(f"trace: expert ids must lie in [0, {geom.num_experts}) for {geom.name}.")
    return arr.astype(np.int64), label


@dataclass
class Estimate:
    """Decode speed per strategy on one machine, from a config: ``table`` has a row per strategy (fastest first),
    ``best`` the fastest that fits; every figure is modelled, and ``assumptions`` says on what."""

    model: ModelGeometry
    machine: Machine
    precision: WeightPrecision
    context: int
    budget: VramBudget
    table: pd.DataFrame
    routing_label: str
    assumptions: list[str]
    placements: dict = field(default_factory=dict)  # strategy -> its parameters (layers on GPU, slots, ...)
    depth: int | None = None  # tokens in the KV cache while decoding (None: not given, banded)
    unknowns: dict = field(default_factory=dict)  # what the band spans: unknown -> its range and why
    _inputs: dict = field(default_factory=dict, repr=False)  # routing, central scenario, unknowns (for the sweeps)

    @property
    def best(self) -> str:
        """The fastest placement the estimate chose (the user's own flags, row ``yours``, are priced beside it)."""
        return str(self.table[self.table.strategy != "yours"].iloc[0]["strategy"])

    def prefill(self, prompt: int) -> pd.DataFrame:
        """Time to first token at a ``prompt``-token prompt for every placement, modelled, beside its decode
        tokens/s: what each placement trades (see :mod:`.prefill`)."""
        return prefill_table(self, prompt)

    def summary(self, prompt: int | None = None) -> dict:
        """What a notebook shows, as plain values: the table, the best placement and its band with the unknown
        that dominates it, the cache cliff, TTFT at ``prompt`` tokens, the commands and the assumptions."""
        best = self.row(self.best)
        sizing = self.cache_sizing()
        return {"model": self.model.name, "machine": self.machine.label, "weights": self.precision.label,
                "host_given": self.machine.host is not None, "table": self.table, "best": self.best,
                "band_tok_s": (float(best.low_tok_s), float(best.high_tok_s)),
                "dominant_unknown": best.dominant_unknown, "unknowns": self.unknowns,
                "cache_sizing": sizing, "prefill": self.prefill(prompt) if prompt else None,
                "llama_cpp": self.llama_cpp(), "engine_call": self.engine_call(), "assumptions": self.assumptions}

    def cache_sizing(self) -> CacheSizing | None:
        """The cliff and the knee of a global expert cache (``--moe-cache-mib``) for this model on this machine:
        see :mod:`.sizing`. None when every expert fits in VRAM."""
        if self.budget.all_fit:
            return None
        central = self._inputs["central"]
        return cache_sizing(self.model, self.budget, self._inputs["routing"],
                            lambda c: _price(self.model, central, c, {}).tokens_per_s, _WARMUP)

    def row(self, strategy: str) -> pd.Series:
        return self.table.set_index("strategy").loc[strategy]

    def llama_cpp(self, model_path: str = "model.gguf") -> str:
        """The llama.cpp command for the fastest placement llama.cpp can express (see :mod:`.commands`)."""
        from .commands import llama_cpp_command

        return llama_cpp_command(self, model_path)

    def engine_call(self) -> str:
        """The specter_lab ``Engine`` call that runs the fastest of our strategies on this model."""
        from .commands import engine_call

        return engine_call(self)

    def __str__(self) -> str:
        from .commands import report

        return report(self)


def estimate(config, gpu: "str | HardwareProfile" = "rtx4090", vram=None, host=None, weights=None,
             context: int = 4096, trace=None, overhead: float = RUNTIME_OVERHEAD,
             eta_host: float = HOST_DECODE_EFFICIENCY, seed: int = 0, depth: int | None = None,
             placement: str | None = None, ram=None, disk=None) -> Estimate:
    """Expected batch-1 decode TPOT and tokens/s per strategy for the model of ``config`` (a ``config.json`` path,
    its folder, a dict or a bundled name) on ``gpu`` (a catalog name such as ``"rtx3060"``, a profile name or a
    HardwareProfile) with ``vram`` bytes (default: the card's), beside ``host`` (its memory ``"ddr5-5600x2"``, a
    measured GB/s, ``"calibrated"``, a HostCPU or a name in ``sl.HOSTS``; None: not given, the band spans the
    desktop range), its weights in ``weights`` (``"q4_k_m"``, ``"mxfp4"``, ``"bf16"``, ``"<experts>+<dense>"``;
    default: the checkpoint's own format, else bf16), KV cache at ``context`` tokens, decoding at ``depth``
    tokens in the cache (None: unknown, priced at the full context and banded down to empty). Routing:
    ``trace`` when given, else synthetic matched to the family's published locality. ``placement``: the llama.cpp
    flags you run today (``"--n-cpu-moe 20"``, ``"--cpu-moe --moe-cache-mib 6000"``, ``-ot`` patterns), priced as
    given in a row ``yours`` beside the others. ``ram``: host RAM free for the model's weights (bytes or
    ``"32GB"``; None: assumed to hold them all); where it cannot hold every routed expert beside the embeddings,
    the experts the host reads come from disk through the page cache at ``disk`` bytes/s (or ``"3.5GB/s"``;
    None: 5 GB/s, banded 2-7), priced per row (:mod:`.page_cache`). A size under a MiB is taken for a missing unit
    and refused (``vram=8``: write ``"8GiB"``). Modelled, not measured:
    :attr:`Estimate.assumptions` lists what every number rests on; ``band_tok_s`` what the unknowns allow."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context={context!r}: give the tokens the KV cache must hold, an integer >= 1 "
                         "(e.g. 4096).")
    if context > 2**27:  # beyond any model's positions: a typo, refused before pricing it
        raise ValueError(f"context={context!r}: at most 2**27 tokens (no model has more positions).")
    _check_numbers(overhead=overhead, eta_host=eta_host, seed=seed)
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= context):
        raise ValueError(f"depth={depth!r}: give the tokens already in the KV cache while decoding, an integer in "
                         f"[0, context={context}], or None when unknown.")
    v = _size(vram, "vram", "'24GB' or '8GiB'")
    ram_b = _size(ram, "ram", "'32GB' or '64GiB'")
    disk_b = _size(disk, "disk", "'3.5GB/s' (bytes per second)", rate=True)
    profile, card = resolve_gpu(gpu, v)
    machine = Machine(profile, _vram(v, profile, card), get_host(host), card, ram_b, disk_b)
    geom = geometry_from_config(config)
    prec = precision_for(geom, weights)
    budget = vram_budget(geom, prec, machine.vram, context, overhead)
    routing, label = routing_for(trace, geom, seed=seed)
    central = Scenario(machine, prec, eta_host, context if depth is None else depth)
    pages = page_cache(geom, prec, machine.ram, routing)
    unknown = unknowns(central, context, depth is not None) + ([disk_unknown(central)] if pages else [])
    rows, placements = [], {}
    for name, counts, params, extra in _placements(geom, budget, routing):
        if isinstance(counts, dict):  # a sweep of one parameter (global_lru's cpu_share): keep the fastest
            counts = {sh: _with_disk(pages, c, budget.slots) for sh, c in counts.items()}
            share, counts = min(counts.items(), key=lambda sc: _price(geom, central, sc[1], extra).total_ms)
            params = {**params, "cpu_share": share}
        else:
            counts = _with_disk(pages, counts, budget.slots)
        placements[name] = params
        rows.append(_priced_row(name, geom, central, unknown, counts, params, extra))
    draft, spec = speculative_rows(geom, budget, routing, _WARMUP, prec.experts.bits)
    for name, counts, pre, params in spec:
        placements[name] = params
        counts = _with_disk(pages, counts, params["slots_per_layer"] * geom.moe_layers)
        rows.append(_speculative_row(name, geom, central, unknown, counts, pre, params, draft))
    yours = None
    if placement is not None:
        yours = parse_placement(placement, geom)
        params = {"flags": yours.flags, "n_host_layers": yours.n_host, "cache_mib": yours.cache_mib,
                  "cpu_share": yours.cpu_share, "fits": yours.gpu_expert_bytes(geom, budget.expert_bytes)
                  <= budget.experts + 1.0, "notes": list(yours.notes)}
        placements["yours"] = params
        counts = _with_disk(pages, _user_counts(yours, routing, budget),
                            int(yours.gpu_expert_bytes(geom, budget.expert_bytes) // budget.expert_bytes))
        rows.append(_priced_row("yours", geom, central, unknown, counts, params, {}))
    table = pd.DataFrame(rows).sort_values("tpot_ms", kind="stable").reset_index(drop=True)
    e = Estimate(geom, machine, prec, context, budget, table, label,
                 _assumptions(machine, prec, label, overhead, eta_host)
                 + [_ram_assumption(geom, budget, machine, pages)],
                 placements)
    e.depth, e.unknowns = depth, {u.name: u.why for u in unknown}
    if spec:
        e.unknowns["draft acceptance"] = (f"speculative rows only: {ACCEPTANCE_RANGE[0]}-{ACCEPTANCE_RANGE[1]} per "
                                          f"token ({draft.describe()})")
    e._inputs = {"routing": routing, "central": central, "unknowns": unknown}
    return e


def _price(geom: ModelGeometry, sc: Scenario, counts: replay.Counts, extra: dict) -> TokenTime:
    return price_token(geom, sc.precision, sc.machine, counts, sc.depth, sc.eta, **extra)


def _priced_row(name, geom, central: Scenario, unknown, counts, params, extra) -> dict:
    """One table row: the central price, and the band from each unknown's ends."""
    t = _price(geom, central, counts, extra)
    swings = {u.name: (_price(geom, u.slow, counts, extra).tokens_per_s,
                       _price(geom, u.fast, counts, extra).tokens_per_s) for u in unknown}
    return _row(name, t, counts, params, combine(t.tokens_per_s, swings))


def _speculative_row(name, geom, central: Scenario, unknown, counts, prefetched, params, draft) -> dict:
    """A speculative strategy's row: per committed token, with the draft's acceptance as one more unknown."""
    t = window_time(geom, central, counts, prefetched, draft)
    swings = {u.name: (window_time(geom, u.slow, counts, prefetched, draft).tokens_per_s,
                       window_time(geom, u.fast, counts, prefetched, draft).tokens_per_s) for u in unknown}
    swings["draft acceptance"] = tuple(window_time(geom, central, counts, prefetched, draft, a).tokens_per_s
                                       for a in ACCEPTANCE_RANGE)
    per = draft.tokens_per_window()
    shown = replay.Counts(counts.device / per, counts.copied / per, counts.host / per, counts.host_trips / per,
                          None if counts.disk is None else counts.disk / per)
    return _row(name, t, shown, params, combine(t.tokens_per_s, swings))


def _user_counts(p: UserPlacement, routing: np.ndarray, budget: VramBudget) -> replay.Counts:
    """Where the user's flags run each routed expert: resident layers on the GPU; the host layers' experts on the
    host, or through the expert cache (a global LRU over the host layers only) when ``--moe-cache-mib`` is set."""
    k = routing.shape[2]
    host = np.array(p.host_layers, dtype=bool)
    static = replay.static_layers(list(~host), k)
    if not p.cache_mib or not host.any():
        return static
    slots = int(p.cache_mib * 2**20 // budget.expert_bytes)
    sub = replay.global_lru(routing[:, host, :], slots, _WARMUP, p.cpu_share)
    parts = [a.copy() for a in (static.device, static.copied, static.host, static.host_trips)]
    for a, b in zip(parts, (sub.device, sub.copied, sub.host, sub.host_trips)):
        a[host] = b
    return replay.Counts(*parts)


def _with_disk(pages: "PageCache | None", counts: replay.Counts, gpu_slots: int) -> replay.Counts:
    """A row's counts with its disk reads, the GPU holding ``gpu_slots`` experts (no page cache: none)."""
    return counts if pages is None else pages.with_disk(counts, gpu_slots)


_TOO_FEW_BYTES = 2**20  # no machine has less than a MiB of memory (or a MiB/s of disk): a unit was left out


def _size(value, name: str, example: str, rate: bool = False) -> float | None:
    """``vram=`` / ``ram=`` / ``disk=``: bytes (``rate``: bytes/s, a trailing "/s" allowed) as a number or a
    size string; None stays None. A size under a MiB is refused: ``vram=8`` means 8 GiB to its writer, not 8
    bytes, and priced as bytes it would only say that nothing fits."""
    if value is None:
        return None
    fix = f"{name}={value!r}: give bytes as a positive number or a size such as {example}."
    if isinstance(value, str):
        try:
            text = value.strip()
            n = float(parse_bytes(text.removesuffix("/s") if rate else text, name))
        except ValueError:
            raise ValueError(fix) from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) and value > 0:
        n = float(value)
    else:
        raise ValueError(fix)
    if n < _TOO_FEW_BYTES:
        raise ValueError(f"{name}={value!r} reads as {n:g} bytes{'/s' if rate else ''}, less than a MiB: a size "
                         f"without a unit is bytes. Give the unit, e.g. {example}.")
    return n


def _ram_assumption(geom: ModelGeometry, budget: VramBudget, m: Machine, pages) -> str:
    experts = budget.experts_total
    if m.ram is None:
        return (f"host RAM NOT GIVEN: assumed to hold every routed expert ({experts / 2**30:.1f} GiB) and the "
                "embeddings; give ram= (and disk=) to price experts read from disk")
    if pages is None:
        return (f"host RAM {m.ram / 2**30:.1f} GiB holds every routed expert ({experts / 2**30:.1f} GiB) beside the "
                "embeddings: nothing is read from disk")
    return (f"host RAM {m.ram / 2**30:.1f} GiB holds {pages.slots} of the {geom.moe_layers * geom.num_experts} "
            f"routed experts ({experts / 2**30:.1f} GiB) beside the embeddings; the experts the host reads come from "
            f"disk when the page cache misses them, modelled as one LRU with the GPU's expert slots over the routing, "
            f"each read {m.gpu.disk_latency * 1e6:.0f} us + its bytes at {m.disk_bandwidth / 1e9:.1f} GB/s, the "
            "layer waiting for it (disk_ms, disk_reads_per_token; estimate/page_cache.py); decode only, the "
            "prefill table does not price it")


def _check_numbers(overhead, eta_host, seed) -> None:
    """The numeric arguments of :func:`estimate`, refused before the config is read (a NaN would price silently)."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)

    if not (number(overhead) and overhead >= 0):
        raise ValueError(f"overhead={overhead!r}: bytes of VRAM the runtime keeps for itself, a number >= 0.")
    if not (number(eta_host) and 0 < eta_host <= 1):
        raise ValueError(f"eta_host={eta_host!r}: the share of host DRAM bandwidth an expert matvec reaches, in (0, 1].")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed={seed!r}: an integer.")


def _placements(geom: ModelGeometry, budget: VramBudget, routing: np.ndarray):
    """(strategy, counts, its parameters, pricing options) for every strategy the VRAM allows."""
    L, E, k = geom.moe_layers, geom.num_experts, geom.top_k
    if budget.all_fit:  # every cache would hold everything: they are all the resident placement
        yield "resident", replay.resident(L, k), {"layers_on_gpu": L}, {}
        yield "on_demand", replay.on_demand(L, k), {}, {}
        return
    on_gpu = min(L, int(budget.experts // (E * budget.expert_bytes)))
    # llama.cpp --n-cpu-moe N keeps the experts of the first N layers on the host
    yield "static_split", replay.static_layers([l >= L - on_gpu for l in range(L)], k), \
        {"layers_on_gpu": on_gpu, "n_cpu_moe": L - on_gpu}, {}
    slots = budget.slots
    per_layer = max(0, min(E, slots // L))
    yield "global_lru", {share: replay.global_lru(routing, slots, _WARMUP, share) for share in _CPU_SHARES}, \
        {"slots": slots}, {}
    yield "fiddler", replay.hot_set(routing, per_layer, _WARMUP), {"slots_per_layer": per_layer}, {}
    if per_layer >= 1:
        yield "host_lru", replay.layer_lru(routing, per_layer, _WARMUP, miss="reuse"), \
            {"slots_per_layer": per_layer}, {}
        yield "lru", replay.layer_lru(routing, per_layer, _WARMUP), {"slots_per_layer": per_layer}, {}
    yield "on_demand", replay.on_demand(L, k), {}, {}


def _row(name: str, t: TokenTime, counts: replay.Counts, params: dict, band: tuple[float, float, str]) -> dict:
    what, engine = PLACEMENTS[name]
    lo, hi, dominant = band
    return {"strategy": name, "tpot_ms": t.total_ms, "tokens_per_s": t.tokens_per_s,
            "band_tok_s": f"{lo:.3g}-{hi:.3g}", "low_tok_s": lo, "high_tok_s": hi, "dominant_unknown": dominant,
            "hit_rate": counts.hit_rate,
            "copies_per_token": counts.copies_per_token, "host_experts_per_token": counts.host_per_token,
            "device_ms": t.device_ms, "link_ms": t.link_ms, "host_ms": t.host_ms, "trips_ms": t.trips_ms,
            "disk_ms": t.disk_ms, "disk_reads_per_token": 0.0 if counts.disk is None else float(counts.disk.sum()),
            "placement": _placement_text(name, params, what), "runs_as": engine,
            "in_specter_lab": name in STRATEGIES or name == "resident"}


def _placement_text(name: str, params: dict, what: str) -> str:
    """The placement in a few words, with its numbers."""
    n = params.get("slots_per_layer")
    text = {
        "static_split": lambda: (f"experts of the last {params['layers_on_gpu']} layers on the GPU, the first "
                                 f"{params['n_cpu_moe']} on the host CPU"),
        "global_lru": lambda: (f"one LRU of {params['slots']} slots over all layers; misses copied" +
                               (f", {params['cpu_share']:.0%} of them on the host CPU" if params["cpu_share"] else "")),
        "fiddler": lambda: f"{n} most routed experts/layer pinned on the GPU; the rest on the host CPU",
        "host_lru": lambda: f"LRU of {n} experts/layer; misses reused lately copied, the rest on the host CPU",
        "lru": lambda: f"LRU of {n} experts/layer; misses copied",
        **{sp: (lambda sp=sp: f"{PLACEMENTS[sp][0].split(';')[1].strip()}; {n} full-precision slots/layer, "
                              f"K={params['k']}, int{params['draft_bits']} draft {params['draft_gib']:.2f} GiB, acceptance "
                              f"{params['acceptance']:.3f} (MODELLED)") for sp in ("spec_lru", "specter", "specter_host")},
        "yours": lambda: (f"{params['flags']}: {params['n_host_layers']} expert layers in host memory"
                          + (f", an expert cache of {params['cache_mib']:g} MiB" if params["cache_mib"] else "")
                          + ("" if params["fits"] else " (DOES NOT FIT: more expert bytes in VRAM than it has)")),
    }.get(name)
    return text() if text else what


def _assumptions(m: Machine, prec: WeightPrecision, label: str, overhead: float, eta: float) -> list[str]:
    h = m.host_cpu
    host = (f"host {h.name}: {h.dram_delivered / 1e9:.1f} GB/s delivered DRAM ({h.source})" if m.host else
            f"HOST NOT GIVEN: priced at {h.dram_delivered / 1e9:.0f} GB/s delivered DRAM, the band spans "
            f"{h.delivered_band[0] / 1e9:.0f}-{h.delivered_band[1] / 1e9:.0f} GB/s ({h.source})")
    gpu = (f"GPU {m.card.name} ({m.card.memory}, {m.card.pcie}; {m.card.source})" if m.card else f"GPU {m.gpu.name}")
    return [
        "modelled, not measured: a llama.cpp-class engine at batch 1 (graphs, one fused MoE kernel a layer, "
        "device and host parts of a layer run one after the other)",
        f"{gpu}: {m.vram_bandwidth / 1e9:.0f} GB/s datasheet VRAM x decode efficiency by format "
        f"(experts {prec.experts.name} {prec.experts.gpu_efficiency}, dense {prec.dense.name} "
        f"{prec.dense.gpu_efficiency}: {prec.experts.source}); link {m.gpu.pcie_bandwidth / 1e9:.1f} GB/s; "
        f"{m.gpu.kernel_time * 1e6:.1f} us per kernel, kernels counted on a tiny sibling of the family",
        f"{host}; the host reaches {eta:.3f} of it in a batch-1 expert matvec (fitted to the fit rows of "
        "sl.bench.consumer_anchors())",
        "band_tok_s: the unknowns (host DRAM bandwidth, host matvec efficiency, GPU format efficiency, link "
        "bandwidth, context depth when not given) each moved to its ends, combined in quadrature on a log scale; "
        "dominant_unknown names the widest (Estimate.unknowns says each range and why)",
        f"weights {prec.label}: experts {prec.experts.bits} bits/weight, dense {prec.dense.bits}; embeddings on "
        "the host; KV cache at 2 bytes/value, read at the stated depth (default: the full context)",
        f"runtime overhead {overhead / 2**30:.2f} GiB of VRAM (CUDA context + compute buffers)",
        f"routing: {label}; {_TOKENS - _WARMUP} decode tokens replayed after {_WARMUP} warm-up tokens",
        "speculative rows (spec_lru, specter, specter_host; only where a draft narrower than the experts fits beside "
        "one full-precision slot per layer) are MODELLED: an RTN-g64 draft of every expert resident (the dense "
        "weights shared), K=8, per-token acceptance and forecast recall measured at the draft's bits on the bundled "
        f"model (routing/importing.MEASURED_DRAFT), acceptance banded {ACCEPTANCE_RANGE[0]}-{ACCEPTANCE_RANGE[1]}; "
        "sl.plan measures them on a loaded model",
        "not estimated: " + "; ".join(f"{n} ({why})" for n, why in NOT_ESTIMATED.items()),
    ]
