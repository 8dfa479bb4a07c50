"""``sl.estimate``: decode speed per strategy on a machine you describe, from a model's ``config.json`` alone.

An estimate is a replay. The target's geometry (from its config), routing at that geometry (synthetic, matched to
the family's published locality, or a trace you give: :mod:`.workload`) with a modelled draft and a modelled
next-layer router, and **every row of** ``sl.STRATEGIES`` replayed on it by :func:`specter_lab.replay` on the
llama.cpp-class clock of your machine (``<gpu>+<host>@llama.cpp``, the weights in their GGUF / MXFP4 format:
:mod:`specter_lab.pricing.llamacpp`), at the device memory your VRAM leaves for experts (:mod:`.vram`). So the
estimate and ``sl.replay`` of the same trace on the same clock give the same TPOT for every row, and the planner's
rule (:func:`~specter_lab.run.strategies.planner_choice`) names its pick among them. Rows that are not deployments
(a replica of an artifact's costs, a reference reading the true routing) say why instead, by their role.

What is not known about the machine (host DRAM, the host's matvec efficiency, the GPU's efficiency in the
format, the link, the KV depth, the disk, the draft's acceptance) moves each row to a band (:mod:`.bands`), priced
by the same clock's closed form (:mod:`.lanes`) around the replay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..analysis.pool import cores, install, installed, process_pool
from ..analysis.replay import replay_runs, replay_setup
from ..errors import BudgetTooSmall
from ..model.geometry import ModelGeometry, geometry_from_config, load_config
from ..pricing.gpus import GPU, GPU_FAMILIES
from ..pricing.precision import WeightPrecision
from ..pricing.profiles import HOST_DECODE_EFFICIENCY, HardwareProfile, get_host, resolve_gpu, unified_gpu_bytes
from ..records.metrics import later_half_rate
from ..run import NOT_CANDIDATES, STRATEGIES, Strategy, planner_choice
from ..units import parse_bytes
from .bands import Scenario, Unknown, combine, disk_unknown, unknowns
from .flags import UserPlacement, parse_placement
from .lanes import Counts, Machine, price_token
from .sizing import CacheSizing, cache_sizing
from .vram import RUNTIME_OVERHEAD, VramBudget, precision_for, vram_budget
from .workload import PROMPT, TOKENS, Workload, draft_bits, workload

__all__ = ["estimate", "Estimate", "NOT_A_DEPLOYMENT", "get_gpu", "ACCEPTANCE_RANGE", "RESIDENT", "YOURS"]

# Rows that are not a deployment anyone runs, by their role (not by name): why the estimate leaves them out.
NOT_A_DEPLOYMENT = {
    "replica": "a replica of an artifact's implementation costs (write-back copies, one stream), not a deployment",
    "reference": "reads the target's true routing: a reference, not a placement anyone runs",
}
RESIDENT, YOURS = "resident", "yours"  # the two rows that are not strategies: every expert on the GPU; your flags
ACCEPTANCE_RANGE = (0.60, 0.95)  # assumption: larger models' drafts are less faithful than the bundled model's
DECODE_LENGTH, LATE = "decode length", "later_half_tok_s"  # the horizon unknown, and the rate it reads


def get_gpu(gpu: "str | HardwareProfile", vram: float | None = None) -> HardwareProfile:
    """``gpu=``: a catalog name (``"rtx3060"``, ``"RTX 4060 Ti 16GB"``, ``"a4000"``: see
    :mod:`specter_lab.pricing.gpus`), a profile name or a HardwareProfile. ``vram`` (bytes) picks among a
    family's memory sizes."""
    return resolve_gpu(gpu, vram)[0]


@dataclass
class Estimate:
    """Decode speed per strategy on one machine, from a config: ``table`` has a row per strategy (fastest first),
    ``best`` the fastest, ``pick`` the planner's pick among them; every figure is modelled, and ``assumptions``
    says on what. ``not_priced``: the rows left out and why."""

    model: ModelGeometry
    machine: Machine
    precision: WeightPrecision
    context: int
    budget: VramBudget
    table: pd.DataFrame
    routing_label: str
    assumptions: list[str]
    placements: dict = field(default_factory=dict)  # row -> its parameters (slots, layers on the GPU, draft, ...)
    depth: int | None = None  # tokens in the KV cache while decoding (None: not given, banded)
    unknowns: dict = field(default_factory=dict)  # what the band spans: unknown -> its range and why
    not_priced: dict = field(default_factory=dict)  # strategy -> why it has no row
    pick: str | None = None  # the planner's pick among the rows (its rule: planner_choice)
    _inputs: dict = field(default_factory=dict, repr=False)  # workload, scenario, replay options (for the sweeps)

    @property
    def best(self) -> str:
        """The fastest row (the user's own flags, row ``yours``, are priced beside it)."""
        return str(self.table[self.table.strategy != YOURS].iloc[0]["strategy"])

    @property
    def workload(self) -> Workload:
        return self._inputs["workload"]

    def replay_options(self, row: str | None = None) -> dict:
        """What the rows were replayed with (``row``: that row's own, its budget and placement included):
        ``sl.replay(e.workload.trace, e.replayed_strategy(row), **e.replay_options(row))`` gives its TPOT again."""
        if row is None:
            return dict(self._inputs["options"])
        return {**self._inputs["options"], **self._inputs["rows"][row][1]}

    def replayed_strategy(self, row: str) -> str:
        """The strategy a row is a replay of (``resident`` and ``yours`` are static splits, or the cache)."""
        return self._inputs["rows"][row][0]

    def prefill(self, prompt: int, progress: bool = False) -> pd.DataFrame:
        """Time to first token at a ``prompt``-token prompt for every row, modelled (a replay of one prompt of that
        length on the same clock: its prefill forward), beside its decode tokens/s: what each placement trades."""
        from .prefill import prefill_table

        return prefill_table(self, prompt, progress)

    def summary(self, prompt: int | None = None, progress: bool = False) -> dict:
        """What a notebook shows, as plain values: the table, the best row and the planner's pick, the band with the
        unknown that dominates it, the cache cliff, TTFT at ``prompt`` tokens, the commands and the assumptions."""
        best = self.row(self.best)
        return {"model": self.model.name, "machine": self.machine.label, "weights": self.precision.label,
                "host_given": self.machine.host is not None, "table": self.table, "best": self.best,
                "pick": self.pick, "choices": self.choices(),
                "band_tok_s": (float(best.low_tok_s), float(best.high_tok_s)),
                "dominant_unknown": best.dominant_unknown, "unknowns": self.unknowns,
                "cache_sizing": self.cache_sizing(), "prefill": self.prefill(prompt, progress) if prompt else None,
                "llama_cpp": self.llama_cpp(), "engine_call": self.engine_call(), "assumptions": self.assumptions,
                "not_priced": self.not_priced}

    def cache_sizing(self) -> CacheSizing | None:
        """The cliff and the knee of a global expert cache (``--moe-cache-mib``) for this model on this machine:
        see :mod:`.sizing`. None when every expert fits in VRAM. Computed once (beside the rows when they were
        replayed on a pool)."""
        if self.budget.all_fit:
            return None
        if self._inputs.get("sizing") is None:
            self._inputs["sizing"] = cache_sizing(self.model, self.budget, self._inputs["workload"].trace,
                                                  self._inputs["central"])
        return self._inputs["sizing"]

    def row(self, strategy: str) -> pd.Series:
        return self.table.set_index("strategy").loc[strategy]

    def llama_cpp(self, model_path: str = "model.gguf") -> str:
        """The llama.cpp command for the fastest row llama.cpp can express (see :mod:`.commands`)."""
        from .commands import llama_cpp_command

        return llama_cpp_command(self, model_path)

    def engine_call(self) -> str:
        """The specter_lab ``Engine`` call that runs the planner's pick on this model."""
        from .commands import engine_call

        return engine_call(self)

    def choices(self) -> pd.DataFrame:
        """The planner's pick beside llama.cpp's best row and the fastest row: tokens/s, band, what runs each today
        and the command (see :func:`.commands.choices`)."""
        from .commands import choices

        return choices(self)

    def __str__(self) -> str:
        from .commands import report

        return report(self)


def estimate(config, gpu: "str | HardwareProfile" = "rtx4090", vram=None, host=None, weights=None,
             context: int = 4096, trace=None, overhead: float = RUNTIME_OVERHEAD,
             eta_host: float = HOST_DECODE_EFFICIENCY, seed: int = 0, depth: int | None = None,
             placement: str | None = None, ram=None, disk=None, tokens: int = TOKENS,
             workers: int | None = None, progress: bool = False) -> Estimate:
    """Expected batch-1 decode TPOT and tokens/s of every strategy for the model of ``config`` (a ``config.json``
    path, its folder, a dict or a bundled name) on ``gpu`` (a catalog name such as ``"rtx3060"``, a profile name or
    a HardwareProfile) with ``vram`` (a number of bytes, or ``"12GB"`` / ``"12GiB"``: a card's memory is binary,
    so "12GB" is 12 GiB; default: the card's), beside ``host`` (its memory ``"ddr5-5600x2"``, a measured GB/s,
    ``"calibrated"``, a HostCPU or a name in ``sl.HOSTS``; None: not given, the band spans the desktop range), its
    weights in ``weights`` (``"q4_k_m"``, ``"mxfp4"``, ``"bf16"``, ``"<experts>+<dense>"``; default: the
    checkpoint's own format, else bf16), KV cache at ``context`` tokens, decoding at ``depth`` tokens in the cache
    (None: unknown, priced at the full context and banded down to empty). Routing: ``trace`` when given, else
    synthetic matched to the family's published locality (:mod:`.workload`). ``placement``: the llama.cpp flags
    you run today (``"-ngl 20"``, ``"--n-cpu-moe 20"``, ``"--cpu-moe --moe-cache-mib 6000"``, ``-ot`` patterns:
    :mod:`.flags`), priced as given in a row ``yours``. ``ram``: host RAM free for the model's weights (None:
    assumed to hold them all); where it cannot hold every routed expert beside the embeddings, the experts the host
    reads come from disk at ``disk`` bytes/s (None: the profile's 5 GB/s, banded 2-7), through the replay's disk
    tier. ``tokens``: decode tokens replayed per row (after a prompt that warms the caches); ``workers``: processes
    the rows are replayed on (None: one per core; 1: here, one after the other; the figures are the same);
    ``progress``: a bar over the rows (a notebook's cell). Modelled, not measured: :attr:`Estimate.assumptions`
    lists what every number rests on."""
    _check(context, depth, overhead, eta_host, seed)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2:
        raise ValueError(f"tokens={tokens!r}: decode tokens to replay per row, an integer >= 2 (default {TOKENS}).")
    v = _size(vram, "vram", "'24GB' or '8GiB'")
    ram_b = _size(ram, "ram", "'32GB' or '64GiB'")
    disk_b = _size(disk, "disk", "'3.5GB/s' (bytes per second)", rate=True)
    profile, card = resolve_gpu(gpu, v)
    machine = Machine(profile, _vram(v, profile, card), get_host(host), card, ram_b, disk_b)
    geom = geometry_from_config(config)
    prec = precision_for(geom, weights)
    budget = vram_budget(geom, prec, machine.vram, context, overhead)
    if card is not None and card.unified_memory and not budget.all_fit:
        raise ValueError(f"{geom.name} at {prec.label} does not fit the GPU's share of the {card.name}'s unified "
                         f"memory: {budget.describe()}. Use a narrower format, a shorter context, give the GPU more "
                         f"(vram=, up to {card.vram_gb:g}GB, with sudo sysctl iogpu.wired_limit_mb=...), or a Mac with "
                         "more memory (llama.cpp would page experts from the SSD through mmap: not priced here).")
    yours = parse_placement(placement, geom) if placement is not None else None  # refused before any replay
    central = Scenario(machine, prec, eta_host, context if depth is None else depth)
    bits = None if budget.all_fit else draft_bits(geom, prec.experts.bits, budget.experts, budget.expert_bytes)
    wl = workload(geom, _config_dict(config), bits, trace, seed, tokens=tokens)
    host_budget = _host_budget(geom, prec, machine, wl)
    options = {"hardware": machine.profile(eta_host), "weights": prec, "depth": central.depth, "trace_level": "steps",
               **({"host_budget": host_budget} if host_budget else {})}
    unknown = unknowns(central, context, depth is not None) + ([disk_unknown(central)] if host_budget else [])
    if yours is not None:
        yours.check_fit(geom, prec, machine.vram, context, overhead)
    rows, placements, not_priced, replayed = [], {}, {}, {}
    todo = [(name, st, st.name if st else "static_split", opts) for name, st, opts in _rows(budget, yours)]
    for name, st, _, _ in todo:
        if st is not None and st.role in NOT_A_DEPLOYMENT:
            not_priced[name] = NOT_A_DEPLOYMENT[st.role]
    todo = [t for t in todo if t[0] not in not_priced]
    sizing = None if budget.all_fit else (geom, budget, central)  # the cache sweep, run beside the rows
    outs, sized = _replay_all(wl, [(t[2], {**options, **t[3]}) for t in todo], workers, progress, sizing)
    for (name, st, strategy, opts), out in zip(todo, outs):
        if isinstance(out, Exception):
            if name == YOURS:
                raise ValueError(f"placement={placement!r}: {out}") from None
            not_priced[name] = _why_not(out)
            continue
        metrics, params = out
        placements[name], replayed[name] = params, (strategy, opts)
        rows.append(_row(name, st, metrics, params, geom, central, unknown, yours))
    if not rows:
        raise ValueError(f"no strategy fits: {not_priced}")
    table = pd.DataFrame(rows).sort_values("tpot_ms", kind="stable").reset_index(drop=True)
    e = Estimate(geom, machine, prec, context, budget, table, wl.label, [], placements, depth,
                 {u.name: u.why for u in unknown}, not_priced, _pick(table))
    e.unknowns[DECODE_LENGTH] = (f"a generation longer than the {wl.trace.tokens} tokens replayed: each row's rate over "
                                 "the later half of them (a placement chosen early goes stale as routing drifts; a "
                                 "cache warms), beside the whole replay's")
    if wl.draft_bits and table.speculative.any():
        e.unknowns["draft acceptance"] = (f"speculative rows only: {ACCEPTANCE_RANGE[0]}-{ACCEPTANCE_RANGE[1]} per "
                                          "token against the measured one (the bundled model's)")
    e._inputs = {"workload": wl, "central": central, "unknowns": unknown, "options": options, "rows": replayed,
                 "yours": yours, "sizing": sized}
    e.assumptions = _assumptions(e, host_budget)
    return e


# ------------------------------------------------------------------------------------------------------- rows

def _rows(budget: VramBudget, yours: "UserPlacement | None"):
    """(row name, strategy or None, replay options) of every row: each strategy, or the resident placement where
    every expert fits (every strategy is it there), then the user's flags."""
    if budget.all_fit:
        yield RESIDENT, None, {"expert_budget": 1.0}
    else:
        for name, st in STRATEGIES.items():
            yield name, st, {"expert_budget": int(budget.experts)}
    if yours is not None:
        yield YOURS, yours.strategy, yours.replay_options(budget)


def _replay_all(wl: Workload, tasks: list[tuple[str, dict]], workers: int | None, progress: bool = False,
                sizing: tuple | None = None) -> tuple[list, "CacheSizing | None"]:
    """Each (strategy, options) replayed on the workload: (metrics, parameters), or the refusal it raised. On a
    local process pool when there is more than one core (the set-up is built here first, so forked workers inherit
    the model's skeleton), with the cache sizing of ``sizing`` (its arguments after the trace) beside the rows;
    without a pool the sizing is left to :meth:`Estimate.cache_sizing` (None)."""
    n = min(len(tasks), workers or cores())
    bar = dict(total=len(tasks), desc="estimate: replaying rows", unit="row", disable=not progress)
    if n <= 1 or installed() is not None:  # one core, asked to stay here, or already inside a pool's worker
        return list(tqdm((_attempt(wl, s, o) for s, o in tasks), **bar)), None
    replay_setup(wl.trace, tasks[0][0], check=False, **_setup_options(tasks[0][1]))
    with process_pool(n, install, (wl,)) as pool:
        sized = pool.submit(_sizing_installed, *sizing) if sizing else None  # first: the longest task
        outs = list(tqdm(pool.map(_attempt_installed, tasks, chunksize=1), **bar))
        return outs, (sized.result() if sized else None)


def _sizing_installed(geom: ModelGeometry, budget: VramBudget, central: Scenario) -> CacheSizing:
    return cache_sizing(geom, budget, installed().trace, central)


def _attempt_installed(task: tuple[str, dict]):
    return _attempt(installed(), *task)


def _attempt(wl: Workload, strategy: str, options: dict):
    """:func:`_replay`, or the refusal it raised (a row that does not fit is a row that says so)."""
    try:
        return _replay(wl, strategy, options)
    except (BudgetTooSmall, ValueError) as exc:
        return exc


def _setup_options(options: dict) -> dict:
    return {k: v for k, v in options.items() if k != "trace_level"}


def _replay(wl: Workload, strategy: str, options: dict) -> tuple[dict, dict]:
    """The row's metrics (means over the workload's sequences) and its placement's parameters, from a replay."""
    setup, info = replay_setup(wl.trace, strategy, check=False, **options)  # sl.replay's two halves, set-up once
    results = replay_runs(wl.trace, setup, info)
    keys = [k for k, v in results[0].metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    metrics = {k: float(np.mean([r.metrics[k] for r in results])) for k in keys}
    metrics[LATE] = float(np.mean([later_half_rate(r.trace.tokens) for r in results]))
    split = setup.split
    params = {"slots_per_layer": list(split.slots_per_layer), "draft_bytes": split.draft_bytes,
              "expert_bytes": split.expert_bytes, "budget_bytes": split.budget_bytes,
              "k": setup.strategy.k if setup.strategy.speculative else None,
              "draft_bits": (setup.draft.quant.bits if setup.strategy.speculative else None),
              "strategy": setup.strategy.name, "gpu_layers": getattr(setup.cost, "gpu_layers", None)}
    return metrics, params


def _row(name: str, st: "Strategy | None", m: dict, params: dict, geom: ModelGeometry, central: Scenario,
         unknown: list[Unknown], yours: "UserPlacement | None") -> dict:
    """One table row: the replay's figures, and the band its closed form moves it to."""
    tps = m["tokens_per_s"]
    counts = _counts(m, geom, params)
    spec = bool(st is not None and st.speculative)
    overlap = bool(st is not None and st.miss in ("host", "auto", "balance") and not st.static)
    gpu_layers = params.get("gpu_layers")
    mid = price_token(central.cost(geom, gpu_layers), counts, geom.top_k, central.depth, overlap).total_ms
    swings = {}
    for u in unknown:
        ends = [price_token(s.cost(geom, gpu_layers), counts, geom.top_k, s.depth, overlap).total_ms
                for s in (u.slow, u.fast)]
        swings[u.name] = tuple(tps * mid / t for t in ends)
    late = m.get(LATE, float("nan"))
    if math.isfinite(late):  # a longer generation: the rate its later half ran at (a placement going stale, a cache
        swings[DECODE_LENGTH] = (min(tps, late), max(tps, late))  # warming), around the replay's own
    if spec:  # a window's time held, the tokens it commits moved by the acceptance
        k = params["k"] if isinstance(params["k"], int) else 8
        a = m.get("acceptance_rate")
        a = a if a is not None and math.isfinite(a) else ACCEPTANCE_RANGE[1]
        swings["draft acceptance"] = tuple(tps * _per_window(x, k) / _per_window(a, k) for x in ACCEPTANCE_RANGE)
    lo, hi, dominant = combine(tps, swings)
    return {"strategy": name, "tokens_per_s": tps, "band_tok_s": f"{lo:.3g}-{hi:.3g}", "low_tok_s": lo,
            "high_tok_s": hi, "dominant_unknown": dominant, LATE: late, "tpot_ms": m["tpot_ms"],
            "hit_rate": m["hit_rate"],
            "copies_per_token": m["h2d_bytes_per_token"] / params["expert_bytes"],
            "host_experts_per_token": m["host_experts_per_token"], "stall_ms": m["stall_ms_per_token"],
            "host_ms": m["host_ms_per_token"], "disk_reads_per_token": m.get("disk_reads_per_token", 0.0),
            "disk_ms": m.get("disk_ms_per_token", 0.0), "acceptance": m.get("acceptance_rate", float("nan")),
            "placement": _placement_text(name, st, params, geom, yours), "runs_as": _runs_as(name, st, yours),
            "speculative": spec, "in_specter_lab": name != YOURS,
            "description": st.description if st is not None and name != YOURS else ""}


def _per_window(a: float, k: int) -> float:
    """Tokens a window of ``k`` drafts commits when each is accepted with probability ``a`` independently."""
    return 1.0 + sum(a ** i for i in range(1, k + 1))


def _counts(m: dict, geom: ModelGeometry, params: dict) -> Counts:
    """Where a row's routed experts ran per token, spread evenly over the MoE layers (what the closed form reads
    to move the row to an unknown's ends)."""
    L, k = geom.moe_layers, geom.top_k
    copies = m["h2d_bytes_per_token"] / params["expert_bytes"]
    host = m["host_experts_per_token"]
    device = max(0.0, L * k - copies - host)
    disk = m.get("disk_reads_per_token", 0.0)
    per = lambda x: np.full(L, x / L)
    return Counts(per(device), per(copies), per(host), per(min(float(L), host)), per(disk) if disk else None)


def _pick(table: pd.DataFrame) -> str | None:
    """The planner's pick among the rows it would weigh (its candidates), by its own rule."""
    ranked = [(s, t) for s, t in zip(table.strategy, table.tpot_ms) if s in STRATEGIES and s not in NOT_CANDIDATES]
    return ranked[planner_choice(ranked)][0] if ranked else None


def _placement_text(name: str, st: "Strategy | None", p: dict, geom: ModelGeometry,
                    yours: "UserPlacement | None") -> str:
    """The placement in a few words, with its numbers."""
    slots = p["slots_per_layer"]
    if name == YOURS:
        return yours.describe(geom, slots)
    if name == RESIDENT or (st is not None and st.static and all(s == geom.num_experts for s in slots)):
        return "every expert on the GPU"
    if st.static:
        on_gpu = sum(1 for s in slots if s)
        return f"experts of the last {on_gpu} MoE layers on the GPU, the first {len(slots) - on_gpu} on the host CPU"
    where = (f"one pool of {sum(slots)} expert slots over all layers" if st.pool == "global" else
             f"{min(slots)} expert slots/layer")
    if st.speculative:
        where += (f", int{p['draft_bits']}-g64 draft {p['draft_bytes'] / 2**30:.2f} GiB (MODELLED), K={p['k']}")
    return where


def _runs_as(name: str, st: "Strategy | None", yours: "UserPlacement | None") -> str:
    if name == YOURS:
        return "llama.cpp (your flags)"
    if name == RESIDENT:
        return "llama.cpp -ngl 99 (every engine)"
    return st.elsewhere or "specter_lab only"


def _why_not(exc: Exception) -> str:
    text = str(exc).split(": ", 1)[-1] if isinstance(exc, BudgetTooSmall) else str(exc)
    return ("does not fit: " + text) if isinstance(exc, BudgetTooSmall) else text


# ------------------------------------------------------------------------------------------------------- inputs

def _config_dict(config) -> dict:
    """The config as the trace keeps it (a dict with its model_type)."""
    cfg = load_config(config)
    return cfg.to_dict()


def _host_budget(geom: ModelGeometry, prec: WeightPrecision, m: Machine, wl: Workload) -> int | None:
    """The replay's disk tier where ``ram`` cannot hold every routed expert beside the embeddings: a host cache of
    as many experts (at the weights' format) as the RAM holds, in the replayed model's own bytes (None: no disk)."""
    if m.ram is None:
        return None
    embed = geom.embed_params * prec.dense.bytes_per_weight
    if m.ram <= embed:
        raise ValueError(f"ram={m.ram / 2**30:.2f} GiB cannot hold the embeddings the host keeps "
                         f"({embed / 2**30:.2f} GiB for {geom.name}): give the RAM free for the model's weights.")
    slots = int((m.ram - embed) // (geom.expert_params * prec.experts.bytes_per_weight))
    if slots >= geom.moe_layers * geom.num_experts:
        return None
    native = _native_expert_bytes(wl)
    return max(1, slots) * native


def _native_expert_bytes(wl: Workload) -> int:
    """One routed expert in the replayed skeleton's own dtype (what the disk tier counts its slots in)."""
    from ..analysis.replay import skeleton_info

    info = skeleton_info(wl.trace.config)
    first = info.layers[0]
    return sum(math.prod(getattr(first.experts, n).shape[1:]) * getattr(first.experts, n).element_size()
               for n in first.param_names)


def _vram(v: float | None, gpu: HardwareProfile, card: GPU | None) -> float:
    if v is None:
        if card is not None and card.unified_memory:
            return unified_gpu_bytes(card.vram_gb * 2**30)  # the memory less what macOS keeps
        if card is not None:
            return card.vram_gb * 2**30
        if gpu.device_memory is None:
            raise ValueError(f"vram= is needed: profile {gpu.name} records no device memory. Give e.g. vram='24GB'.")
        return float(gpu.device_memory)
    if card is not None and v > card.vram_gb * 2**30 * 1.001:
        sizes = sorted({f"{g.vram_gb:g}GB" for g in GPU_FAMILIES.get(card.family, [card])})
        raise ValueError(f"vram={v / 2**30:.2f} GiB is more than the {card.name} has ({card.vram_gb:g} GiB): use at "
                         f"most '{card.vram_gb:g}GB'" + (f" (this family comes with {sizes})" if len(sizes) > 1 else "")
                         + ", or name the card with more memory.")
    return v


_TOO_FEW_BYTES = 2**20  # no machine has less than a MiB of memory (or a MiB/s of disk): a unit was left out


def _size(value, name: str, example: str, rate: bool = False) -> float | None:
    """``vram=`` / ``ram=`` / ``disk=``: bytes (``rate``: bytes/s, a trailing "/s" allowed) as a number or a
    size string; None stays None. Memory sizes are binary whatever their label ("12GB" of a card or of RAM is
    12 GiB: that is what the chips hold); a rate's GB is decimal, as disks and links are sold. A size under a MiB
    is refused: ``vram=8`` means 8 GiB to its writer, not 8 bytes."""
    if value is None:
        return None
    fix = f"{name}={value!r}: give bytes as a positive number or a size such as {example}."
    if isinstance(value, str):
        try:
            text = value.strip()
            n = float(parse_bytes(text.removesuffix("/s") if rate else text, name, binary=not rate))
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


def _check(context, depth, overhead, eta_host, seed) -> None:
    """The numeric arguments of :func:`estimate`, refused before the config is read (a NaN would price silently)."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context={context!r}: give the tokens the KV cache must hold, an integer >= 1 "
                         "(e.g. 4096).")
    if context > 2**27:  # beyond any model's positions: a typo, refused before pricing it
        raise ValueError(f"context={context!r}: at most 2**27 tokens (no model has more positions).")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= context):
        raise ValueError(f"depth={depth!r}: give the tokens already in the KV cache while decoding, an integer in "
                         f"[0, context={context}], or None when unknown.")

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)

    if not (number(overhead) and overhead >= 0):
        raise ValueError(f"overhead={overhead!r}: bytes of VRAM the runtime keeps for itself, a number >= 0.")
    if not (number(eta_host) and 0 < eta_host <= 1):
        raise ValueError(f"eta_host={eta_host!r}: the share of host DRAM bandwidth an expert matvec reaches, in (0, 1].")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed={seed!r}: an integer.")


def _assumptions(e: Estimate, host_budget) -> list[str]:
    m, prec, geom = e.machine, e.precision, e.model
    h = m.host_cpu
    host = (f"host {h.name}: {h.dram_delivered / 1e9:.1f} GB/s delivered DRAM ({h.source})" if m.host else
            f"HOST NOT GIVEN: priced at {h.dram_delivered / 1e9:.0f} GB/s delivered DRAM, the band spans "
            f"{h.delivered_band[0] / 1e9:.0f}-{h.delivered_band[1] / 1e9:.0f} GB/s ({h.source})")
    gpu = (f"GPU {m.card.name} ({m.card.memory}, {m.card.pcie}; {m.card.source})" if m.card else f"GPU {m.gpu.name}")
    wl = e.workload
    out = [
        f"modelled, not measured: every row is sl.replay of the routing below on the llama.cpp-class clock "
        f"'{m.hardware_name}@llama.cpp' (graphs, one fused MoE kernel a layer; pricing/llamacpp.py), the device and "
        "host lanes overlapping as the row's own schedule runs them; e.replay_options() repeats it",
        f"{gpu}: {m.vram_bandwidth / 1e9:.0f} GB/s datasheet VRAM x decode efficiency by format "
        f"(experts {prec.experts.name} {prec.experts.gpu_efficiency}, dense {prec.dense.name} "
        f"{prec.dense.gpu_efficiency}: {prec.experts.source}); link {m.gpu.pcie_bandwidth / 1e9:.1f} GB/s; "
        f"{m.gpu.kernel_time * 1e6:.1f} us per kernel, kernels counted on a tiny sibling of the family",
        f"{host}; the host reaches {e._inputs['central'].eta:.3f} of it in a batch-1 expert matvec (fitted to the "
        "fit rows of sl.bench.consumer_anchors())",
        "band_tok_s: the unknowns (host DRAM bandwidth, host matvec efficiency, GPU format efficiency, link "
        "bandwidth, context depth when not given, the draft's acceptance) each moved to its ends on the clock's "
        "closed form (estimate/lanes.py) with the row's replayed placement held, and the decode length (the "
        "replay's own rate over its later half), combined in quadrature on a log scale; dominant_unknown names the "
        "widest (Estimate.unknowns says each range and why)",
        f"weights {prec.label}: experts {prec.experts.bits} bits/weight, dense {prec.dense.bits}; embeddings on "
        f"the host; KV cache at 2 bytes/value, read at {e._inputs['central'].depth} tokens, each layer to its window",
        f"{e.budget.describe()}",
        f"routing: {e.routing_label}; " + (f"{wl.trace.tokens} tokens replayed, the first {len(wl.trace.sequences[0].prefill)}"
                                           " a prompt that warms the caches" if not e.routing_label.startswith("recorded")
                                           else "replayed as recorded"),
        (f"speculative rows are MODELLED: an int{wl.draft_bits}-g64 RTN draft of every expert resident (the widest "
         "narrower than the experts that fits beside one slot per layer), forecast recall and per-token "
         "acceptance measured at its bits on the bundled model (traces/importing.MEASURED_DRAFT); sl.plan measures "
         "them on a loaded model" if wl.draft_bits else
         "speculative rows: no draft narrower than the experts fits beside one full-precision slot per layer"),
        "pre-gated rows (gate_lookahead, pregate_split) are MODELLED: the next layer's router names each expert with "
        "the bundled model's measured recall (traces/importing.MEASURED_GATE_RECALL)",
        ("host RAM NOT GIVEN: assumed to hold every routed expert and the embeddings; give ram= (and disk=) to "
         "price experts read from disk" if m.ram is None else
         "host RAM holds every routed expert beside the embeddings: nothing is read from disk" if not host_budget
         else f"host RAM {m.ram / 2**30:.1f} GiB: the experts it cannot hold are read from disk at "
              f"{m.disk_bandwidth / 1e9:.1f} GB/s + {m.gpu.disk_latency * 1e6:.0f} us a read, through the replay's "
              "disk tier (an LRU host cache of the experts RAM holds)"),
        f"the planner's pick: its own rule (run/strategies.planner_choice: the fastest, a speculative row only if "
        f"10 % ahead of the best plain one) among the rows that are its candidates",
    ]
    if e.not_priced:
        out.append("not priced: " + "; ".join(f"{n} ({why})" for n, why in e.not_priced.items()))
    return out
