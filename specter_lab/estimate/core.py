"""``sl.estimate``: decode speed per strategy on a machine you describe, from a model's ``config.json`` alone.

Why a replay and not the simulated engine: the engine runs a model on this CPU and prices its own routing, so an
estimate with it needs either the real weights (the download this answers before) or the bundled model's routing
projected to the target (4 layers of 32 experts top-4, whose locality is not the target family's: Qwen3-30B-A3B's
LRU hit rate at a quarter of the experts is 0.83, DeepSeek-V2-Lite's 0.50). A replay of routing at the target's
real geometry (48 layers x 128 experts top-8 for Qwen3-30B-A3B) through each placement's cache logic, priced per
layer (:mod:`.pricing`), takes about a second and changes only where the routing comes from: synthetic routing
matched to the family's published locality (:mod:`specter_lab.routing.synthetic`) now, a recorded trace
when one is given (``trace=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..model.geometry import ModelGeometry, geometry_from_config
from ..pricing.precision import WeightPrecision
from ..pricing.profiles import CONSUMER_GPUS, PROFILES, HardwareProfile, get_host
from ..routing.synthetic import locality_for, synthetic_routing
from ..routing.trace_file import RoutingTrace, load_trace
from ..run import STRATEGIES
from ..units import parse_bytes
from . import replay
from .budget import RUNTIME_OVERHEAD, VramBudget, precision_for, vram_budget
from .pricing import HOST_DECODE_EFFICIENCY, HOST_EFFICIENCY_RANGE, Machine, TokenTime, price_token

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
}
# Speculative strategies need a draft's acceptance and the union of a window's routing: measured on a loaded
# model (sl.plan), not estimated from a config.
NOT_ESTIMATED = ("spec_lru", "specmoeoff", "specter", "specter_plus", "specter_host", "oracle", "gate_lookahead")

_TOKENS, _WARMUP = 320, 64  # replayed decode tokens; the first _WARMUP warm the caches (the prompt would)
_CPU_SHARES = (0.0, 0.25, 0.5, 0.75)  # global_lru's share of misses computed on the host: the fastest is kept


def get_gpu(gpu: "str | HardwareProfile") -> HardwareProfile:
    """``gpu=``: a short name (``"rtx4090"``), a profile name or a HardwareProfile."""
    if isinstance(gpu, HardwareProfile):
        return gpu
    key = str(gpu).strip().lower().replace(" ", "")
    name = CONSUMER_GPUS.get(key, key)
    if name not in PROFILES:
        raise ValueError(f"gpu={gpu!r} is not a known GPU: use one of {sorted(CONSUMER_GPUS)} or a profile name "
                         f"{sorted(PROFILES)} (or pass a HardwareProfile with your card's numbers).")
    return PROFILES[name]


def _vram(vram, gpu: HardwareProfile) -> float:
    if vram is None:
        if gpu.device_memory is None:
            raise ValueError(f"vram= is needed: profile {gpu.name} records no device memory. Give e.g. vram='24GB'.")
        return float(gpu.device_memory)
    if isinstance(vram, str):
        return float(parse_bytes(vram, "vram"))
    if isinstance(vram, (int, float)) and not isinstance(vram, bool) and vram > 0:
        return float(vram)
    raise ValueError(f"vram={vram!r}: give bytes or a size such as '24GB' or '8GiB'.")


def routing_for(trace, geom: ModelGeometry, tokens: int = _TOKENS, seed: int = 0) -> tuple[np.ndarray, str]:
    """The routing an estimate replays, and its label. ``trace=None``: synthetic, matched to the family's
    published locality. A :class:`~specter_lab.routing.trace_file.RoutingTrace` (or the path of its ``.npz``): each
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

    @property
    def best(self) -> str:
        return str(self.table.iloc[0]["strategy"])

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
             eta_host: float = HOST_DECODE_EFFICIENCY, seed: int = 0) -> Estimate:
    """Expected batch-1 decode TPOT and tokens/s per strategy for the model of ``config`` (a ``config.json`` path,
    its folder, a dict or a bundled name) on ``gpu`` with ``vram`` bytes (default: the card's), beside ``host``
    (a name in ``sl.HOSTS``; default: the GPU profile's host fields), its weights in ``weights`` (``"q4_k_m"``,
    ``"mxfp4"``, ``"bf16"``, ``"<experts>+<dense>"``; default: the checkpoint's own format, else bf16), KV cache
    at ``context`` tokens. Routing: ``trace`` when given, else synthetic matched to the family's published
    locality. Modelled, not measured: :attr:`Estimate.assumptions` lists what every number rests on."""
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= 2**27:
        raise ValueError(f"context={context!r}: give the tokens the KV cache must hold, an integer in [1, 2**27].")
    _check_numbers(overhead=overhead, eta_host=eta_host, seed=seed)
    profile = get_gpu(gpu)
    machine = Machine(profile, _vram(vram, profile), get_host(host))
    geom = geometry_from_config(config)
    prec = precision_for(geom, weights)
    budget = vram_budget(geom, prec, machine.vram, context, overhead)
    routing, label = routing_for(trace, geom, seed=seed)
    rows, placements = [], {}
    for name, counts, params, extra in _placements(geom, budget, routing):
        if isinstance(counts, dict):  # a sweep of one parameter (global_lru's cpu_share): keep the fastest
            share, counts = min(counts.items(), key=lambda sc: price_token(geom, prec, machine, sc[1], context,
                                                                           eta_host, **extra).total_ms)
            params = {**params, "cpu_share": share}
        t = price_token(geom, prec, machine, counts, context, eta_host, **extra)
        band = [price_token(geom, prec, machine, counts, context, e, **extra).tokens_per_s
                for e in HOST_EFFICIENCY_RANGE]
        placements[name] = params
        rows.append(_row(name, t, counts, params, band))
    table = pd.DataFrame(rows).sort_values("tpot_ms", kind="stable").reset_index(drop=True)
    return Estimate(geom, machine, prec, context, budget, table, label,
                    _assumptions(machine, prec, label, overhead, eta_host), placements)


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


def _row(name: str, t: TokenTime, counts: replay.Counts, params: dict, band: list[float]) -> dict:
    what, engine = PLACEMENTS[name]
    return {"strategy": name, "tpot_ms": t.total_ms, "tokens_per_s": t.tokens_per_s,
            "band_tok_s": f"{band[0]:.3g}-{band[1]:.3g}", "hit_rate": counts.hit_rate,
            "copies_per_token": counts.copies_per_token, "host_experts_per_token": counts.host_per_token,
            "device_ms": t.device_ms, "link_ms": t.link_ms, "host_ms": t.host_ms, "trips_ms": t.trips_ms,
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
    }.get(name)
    return text() if text else what


def _assumptions(m: Machine, prec: WeightPrecision, label: str, overhead: float, eta: float) -> list[str]:
    host = (f"host {m.host.name}: {m.host_bandwidth / 1e9:.1f} GB/s delivered DRAM ({m.host.source})" if m.host
            else f"host: the {m.gpu.name} profile's default ({m.host_bandwidth / 1e9:.0f} GB/s DRAM)")
    return [
        "modelled, not measured: a llama.cpp-class engine at batch 1 (graphs, one fused MoE kernel a layer, "
        "device and host parts of a layer run one after the other)",
        f"GPU {m.gpu.name}: {m.vram_bandwidth / 1e9:.0f} GB/s datasheet VRAM x decode efficiency by format "
        f"(experts {prec.experts.name} {prec.experts.gpu_efficiency}, dense {prec.dense.name} "
        f"{prec.dense.gpu_efficiency}: {prec.experts.source}); link {m.gpu.pcie_bandwidth / 1e9:.1f} GB/s; "
        f"{m.gpu.kernel_time * 1e6:.1f} us per kernel, kernels counted on a tiny sibling of the family",
        f"{host}; the host reaches {eta:.2f} of it in a batch-1 expert matvec (fitted to the consumer rows, "
        f"sl.bench.consumer_anchors(); band_tok_s: at {HOST_EFFICIENCY_RANGE[0]} and {HOST_EFFICIENCY_RANGE[1]}, the "
        "lowest and highest a single row reproduces)",
        f"weights {prec.label}: experts {prec.experts.bits} bits/weight, dense {prec.dense.bits}; embeddings on "
        "the host; KV cache at 2 bytes/value, read at the full stated context (the speed once the context is full)",
        f"runtime overhead {overhead / 2**30:.2f} GiB of VRAM (CUDA context + compute buffers)",
        f"routing: {label}; {_TOKENS - _WARMUP} decode tokens replayed after {_WARMUP} warm-up tokens",
        f"speculative strategies ({', '.join(NOT_ESTIMATED)}) are not estimated: they need a draft's acceptance, "
        "measured on a loaded model (sl.plan)",
    ]
