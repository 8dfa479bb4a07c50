"""A run set up without a model: strategy, draft, clock, cost model and budget split resolved once, as plain values.

:func:`resolve` turns the caller's arguments into a :class:`RunSetup` (every argument checked, nothing allocated,
no model run); a setup is then bound to a live model (:class:`~specter_lab.run.engine.Engine`) or to recorded
routing (:func:`specter_lab.analysis.replay.replay`, :func:`specter_lab.analysis.bound.trace_bound`).
:func:`prepare_run` builds one run's parts from a setup and :class:`Run` executes them: the Engine and a replay
share both, so a replay prices exactly what the live run would, without the live run's checks (the family's
speculation probe, placement, host copies), which only a model needs.

The shape follows scikit-learn's split of validating parameters from fitting: the setup is what ``__init__``
validates; binding is ``fit``.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..decode import Decoder, Sampling, Speculation, StepInfo, StopGeneration, reference_greedy
from ..decode.speculative import check_verify_mode
from ..atomic import write_atomic
from ..errors import Diverged
from ..model import MoEModelInfo, attached
from ..offload.clock import Clock, ClockFactory, make_clock
from ..offload.runtime import OffloadRuntime
from ..offload.schedule import DraftSource
from ..offload.store import ExpertStore
from ..predict import KGovernor
from ..pricing.cost import CostModel
from ..pricing.engines import build_cost_model
from ..pricing.profiles import HardwareProfile
from ..pricing.shapes import CostShape, get_cost_shape
from ..records.metrics import compute_metrics
from ..records.trace import TRACE_LEVELS, Trace
from ..units import parse_budget
from .assembly import RunParts, assemble, dispatch_implementation, places_whole_layers, run_clock
from .budget import BudgetSplit, split_budget, split_slots, split_static
from .drafts import DraftSpec, as_draft_spec, draft_device_experts, draft_expert_bytes
from .quant import QuantSpec
from .strategies import Strategy, _is_number, get_strategy

__all__ = ["RunSetup", "resolve", "check_options", "as_host_dtype", "prepare_run", "Run", "GenerationResult"]


@dataclass
class GenerationResult:
    """What ``Engine.generate`` (and each replayed sequence) returns. ``token_ids`` are the generated tokens only."""

    token_ids: list[int]
    text: str | None
    metrics: dict[str, Any]
    trace: Trace
    prompt_ids: list[int]
    strategy: str
    config: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = field(default=None, repr=False)

    def frames(self):
        return self.trace.frames()

    def to_html(self, path: str) -> str:
        """Write a standalone HTML report of this run (figures + metrics), whole or not at all. Returns the path."""
        from ..viz.report import report_html  # the view layer, on request only (see tests/test_layers.py)

        write_atomic(path, report_html(self, self.tokenizer))
        return path

    def to_perfetto(self, path: str) -> str:
        """Write this run's timeline as Chrome trace-event JSON (open it in ui.perfetto.dev). Returns the path."""
        from ..records.perfetto import write_perfetto

        return write_perfetto(self, path)

    def __repr__(self) -> str:
        m = self.metrics
        return (f"GenerationResult(strategy={self.strategy!r}, new_tokens={len(self.token_ids)}, "
                f"tpot_ms={m.get('tpot_ms', float('nan')):.3f}, hit_rate={m.get('hit_rate', float('nan')):.3f}, "
                f"clock={m.get('clock')!r})")


def check_options(**options) -> None:
    """The caller's strategy overrides, validated as a strategy would validate them (before any planning)."""
    try:
        Strategy("options").with_options(**options)
    except (ValueError, TypeError) as exc:  # name the argument as the caller spelled it
        raise type(exc)(str(exc).replace("Strategy 'options': ", "")) from None


def as_host_dtype(host_dtype) -> "torch.dtype | None":
    """``host_dtype=``: the precision host execution computes in (None: the experts' own)."""
    if host_dtype is None:
        return None
    dt = getattr(torch, host_dtype, None) if isinstance(host_dtype, str) else host_dtype
    if dt not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"host_dtype={host_dtype!r}: use 'float32', 'bfloat16', 'float16' or None (the experts' "
                         "own dtype).")
    return dt


@dataclass(frozen=True)
class RunSetup:
    """Everything a run is priced and split by, resolved once from the caller's arguments (print it to see it).

    ``host_dtype`` is the host lane's precision when it differs from the experts' own (None: theirs);
    ``budget_given``: the split came from ``expert_budget=`` (it follows a new draft's size), not ``cache_slots=``;
    ``ignore_eos``: every run commits ``max_new_tokens`` (a benchmark protocol's fixed output length);
    ``host_budget``: the disk tier's host expert cache in bytes (:mod:`specter_lab.offload.hostcache`), None for
    none (every expert has a host copy: in RAM, or mapped from the files)."""

    strategy: Strategy
    draft: DraftSpec
    clocks: ClockFactory
    cost_shape: CostShape | None
    cost: CostModel
    split: BudgetSplit
    draft_expert_bytes: float = 0.0  # packed bytes of one draft expert, priced like the fp ones
    trace_level: str = "full"
    host_dtype: torch.dtype | None = None
    budget_given: bool = True
    ignore_eos: bool = False
    verify: str = "batched"  # how a speculative window is verified: one K+1-token pass, or one-token passes
    host_budget: int | None = None  # the disk tier: host bytes for expert weights (None: every expert on the host)

    @property
    def profile(self) -> HardwareProfile:
        return self.clocks.profile

    @property
    def measured(self) -> bool:
        """A real clock (CUDA events), not a simulated one."""
        return self.clocks.measured

    @property
    def speculative(self) -> bool:
        return self.strategy.speculative

    def draft_source(self, weights=None, build=None) -> DraftSource | None:
        """The draft as the schedule prices it (``weights``: the low-bit experts a live run computes with)."""
        if not self.speculative:
            return None
        d = self.draft
        return DraftSource(d.variant, weights, self.draft_expert_bytes, d.hybrid_experts if d.hybrid else 0,
                           build=build)

    def meta(self, clock: Clock, info: MoEModelInfo) -> dict[str, Any]:
        """What the trace records about the run's set-up."""
        st = self.strategy
        return {"clock": clock.label, "simulated": not clock.measured, "profile": self.profile.name,
                "projected": self.cost.projected, "cost_shape": self.cost.shape_name, "strategy": st.name,
                "expert_bytes": self.cost.expert_bytes, "num_layers": info.num_layers,
                "num_experts": info.num_experts, "top_k": info.top_k, "k": st.k, "host_budget": self.host_budget}

    def metrics(self, trace: Trace, stopped: bool = False) -> dict[str, Any]:
        """The run's metrics plus the set-up's own columns (split, profile, draft, K)."""
        st = self.strategy
        m = compute_metrics(trace)
        m.update(self.split.as_dict())
        m.update({"strategy": st.name, "plan": None, "profile": self.profile.name, "projected": self.cost.projected,
                  "cost_shape": self.cost.shape_name, "draft": self.draft.label if st.speculative else None,
                  "k": st.k, "stopped": stopped,
                  "host_dtype": str(self.host_dtype or "").replace("torch.", "") or "experts' own",
                  "host_copy_bytes": 0, "host_budget": self.host_budget})
        return m

    def with_draft(self, info: MoEModelInfo, spec: "QuantSpec | DraftSpec | str") -> "RunSetup":
        """The same set-up with another draft: the slot split follows its size (raises if the budget cannot hold
        it; this set-up is unchanged either way)."""
        cfg = as_draft_spec(spec)
        if isinstance(spec, QuantSpec) and self.draft.variant != "quantized":
            cfg = DraftSpec(self.draft.variant, spec, self.draft.hybrid_experts)
        budget = self.split.budget_bytes if self.budget_given else None
        slots = None if self.budget_given else min(self.split.slots_per_layer)
        split, per_draft = _split(info, self.strategy, cfg, self.cost, self.cost_shape, budget, slots)
        return replace(self, draft=cfg, split=split, draft_expert_bytes=per_draft)

    def __str__(self) -> str:
        s, st = self.split, self.strategy
        lines = [f"strategy   {st.name}" + (f" (k={st.k})" if st.speculative else ""),
                 f"draft      {self.draft.label if st.speculative else '—'}",
                 f"clock      {'cuda (measured)' if self.measured else f'simulated {self.profile.name}'}",
                 f"pricing    {self.cost.assumptions}",
                 f"budget     {s.budget_bytes:,} B: draft {s.draft_bytes:,} B + {min(s.slots_per_layer)}"
                 f"–{max(s.slots_per_layer)} slots/layer × {s.expert_bytes:,} B",
                 f"verify     {self.verify}" if st.speculative else "verify     —",
                 "host tier  " + (f"host expert cache {self.host_budget:,} B; misses read from the checkpoint files "
                                  f"(disk priced at {self.profile.disk_bandwidth / 1e9:g} GB/s + "
                                  f"{self.profile.disk_latency * 1e6:g} us a read)" if self.host_budget else
                                  "every expert on the host (no disk tier)"),
                 f"trace      {self.trace_level}"]
        return "\n".join(lines)


def _split(info, st: Strategy, draft: DraftSpec, cost: CostModel, cost_shape, expert_budget,
           cache_slots, host_layers=None) -> tuple[BudgetSplit, float]:
    """Slots per layer after the resident draft (or whole layers for a static split: ``host_layers`` given, or as
    many as the budget holds from the last layer back), and one draft expert's packed bytes."""
    eb = cost.expert_bytes
    per_draft = draft_expert_bytes(info, draft.quant, cost_shape, cost.expert_params)
    dbytes = int(per_draft * draft_device_experts(info, draft)) if st.speculative else 0
    forced = sorted(set(host_layers or ()) | set(getattr(cost, "host_moe_layers", ())))
    if forced and not places_whole_layers(st):
        raise ValueError(f"strategy={st.name!r} keeps a cache of experts per layer, but host_layers= / gpu_layers= "
                         "(llama.cpp's -ot / --n-cpu-moe / -ngl) place whole layers on the host: use "
                         "strategy='static_split'.")
    if places_whole_layers(st):
        if cache_slots is not None:
            raise ValueError(f"strategy={st.name!r} places whole layers, not slots: give expert_budget=, "
                             "not cache_slots=.")
        given = host_layers is not None or bool(forced)
        split = split_static(info, expert_budget, eb, st.name, forced if given else None)
    elif cache_slots is not None:
        split = split_slots(info, cache_slots, dbytes, eb, st.name)
    else:
        split = split_budget(info, expert_budget, dbytes, eb, st.name)
    return split, per_draft


def resolve(info: MoEModelInfo, strategy: "str | Strategy" = "specter", *,
            expert_budget: "float | int | str | None" = None, cache_slots: int | None = None,
            draft: "QuantSpec | DraftSpec | str | None" = None, k: "int | str | None" = None,
            hardware: "str | HardwareProfile | None" = None, cost_shape: str | None = None,
            eviction: str | None = None, prefetch: str | None = None,
            chunking: "str | tuple[float, ...] | None" = None, shared_slots: bool | None = None,
            cpu_share: float | None = None, trace: str = "full", host_dtype: "str | torch.dtype | None" = None,
            ignore_eos: bool = False, verify: str = "batched",
            host_budget: "float | int | str | None" = None, weights=None, depth: int | None = None,
            gpu_layers: int | None = None, host_layers=None, kv_type: str | None = None) -> RunSetup:
    """Check every argument and resolve them into a :class:`RunSetup` for the model ``info`` describes (a live
    model's or a weightless skeleton's: only sizes are read). Nothing runs, nothing is allocated.

    The arguments are the Engine's (see :class:`~specter_lab.run.engine.Engine`); ``strategy`` is a name in
    ``sl.STRATEGIES`` or a :class:`Strategy` (a plan is resolved by the Engine, which runs the planner).
    ``weights`` / ``depth`` / ``gpu_layers`` / ``kv_type`` price a llama.cpp-class engine
    (``hardware="...@llama.cpp"``: the weights' format, the KV cache read at ``depth`` tokens, llama.cpp's ``-ngl``,
    the KV cache's type); ``host_layers``: the MoE layers
    a static split keeps on the host (llama.cpp's ``--n-cpu-moe`` / ``-ot``), instead of as many as the budget
    leaves."""
    if trace not in TRACE_LEVELS:
        raise ValueError(f"trace={trace!r}: use 'full' (every copy, span and routing: the views need it) or "
                         "'steps' (steps and tokens only: a speed run on CUDA pays for no per-op events).")
    if cache_slots is not None and expert_budget is not None:
        raise ValueError("give either expert_budget= or cache_slots=, not both.")
    hdt = as_host_dtype(host_dtype)
    check_verify_mode(verify)
    check_options(k=k, eviction=eviction, prefetch=prefetch, chunking=chunking, cpu_share=cpu_share)
    st = get_strategy(strategy).with_options(k=k, eviction=eviction, prefetch=prefetch, chunking=chunking,
                                             shared_slots=shared_slots, cpu_share=cpu_share)
    draft_cfg = as_draft_spec(draft)
    clocks = make_clock(hardware)  # raises on an unknown profile, or 'cuda' without CUDA
    if clocks.measured and cost_shape is not None:
        raise ValueError(f"cost_shape={cost_shape!r} prices experts as another model, but hardware='cuda' "
                         "measures this one: drop cost_shape=, or use a simulated profile to project.")
    shape = get_cost_shape(cost_shape)
    # On the CUDA clock bytes are the real ones (the model's dtype); simulated runs price the deployment dtype.
    first = info.layers[0]
    native = getattr(first.experts, first.param_names[0]).dtype
    wbytes = native.itemsize if clocks.measured else 2.0
    cost = build_cost_model(info, clocks.profile, shape, weight_bytes=wbytes,
                            implementation=dispatch_implementation(st), weights=weights, depth=depth,
                            gpu_layers=gpu_layers, kv_type=kv_type)
    split, per_draft = _split(info, st, draft_cfg, cost, shape, expert_budget, cache_slots,
                              _layer_list(host_layers, info.num_layers))
    return RunSetup(st, draft_cfg, clocks, shape, cost, split, per_draft, trace, None if hdt == native else hdt,
                    budget_given=cache_slots is None, ignore_eos=bool(ignore_eos), verify=verify,
                    host_budget=resolve_host_budget(info, host_budget))


def _layer_list(host_layers, n: int) -> "list[int] | None":
    """``host_layers=``: MoE layer indices in [0, n), checked (None stays None)."""
    if host_layers is None:
        return None
    try:
        layers = [int(l) for l in host_layers if not isinstance(l, bool) and int(l) == l]
    except (TypeError, ValueError):
        layers = None
    if layers is None or len(layers) != len(list(host_layers)) or any(not 0 <= l < n for l in layers):
        raise ValueError(f"host_layers={host_layers!r}: MoE layer indices in [0, {n}) whose experts stay on the "
                         "host (llama.cpp's --n-cpu-moe N is range(N) minus the dense first layers).")
    return sorted(set(layers))


def native_expert_bytes(info: MoEModelInfo) -> int:
    """Bytes of every routed expert in the model's own dtype (what a host copy of all of them holds)."""
    return sum(getattr(l.experts, n).numel() * getattr(l.experts, n).element_size()
               for l in info.layers for n in l.param_names)


def resolve_host_budget(info: MoEModelInfo, host_budget) -> int | None:
    """``host_budget=`` in bytes: a fraction of the routed experts' bytes in the model's dtype, bytes, or '64MiB'
    (None: no disk tier)."""
    if host_budget is None:
        return None
    return parse_budget(host_budget, "host_budget").resolve(native_expert_bytes(info))


@dataclass
class Run:
    """One generation's parts, built by :func:`prepare_run`: observe them (``runtime.hooks``, ``store``,
    ``trace``) before :meth:`execute`, or after it to see how the run ended.

    ``model`` is the live model the parts attach to (None: a replay, whose decoder plays recorded routing);
    ``finish`` adds the binding's own metrics (a plan's label, host copies) to the set-up's."""

    setup: RunSetup
    info: MoEModelInfo
    prompt_ids: list[int]
    trace: Trace
    clock: Clock
    parts: RunParts
    model: Any = None
    tokenizer: Any = None
    verify_lossless: bool = False
    finish: Callable[[dict[str, Any]], None] | None = None

    @property
    def store(self) -> ExpertStore:
        return self.parts.store

    @property
    def runtime(self) -> OffloadRuntime:
        return self.parts.runtime

    @property
    def decoder(self) -> Decoder:
        return self.parts.decoder

    @property
    def speculation(self) -> Speculation | None:
        return self.parts.speculation

    def execute(self) -> GenerationResult:
        """Generate (a live model is attached for exactly this call), then finalize the trace and the metrics."""
        dec, setup = self.decoder, self.setup
        prompt_t = torch.tensor([self.prompt_ids], dtype=torch.long)
        stopped = False
        model_attached = attached(self.model, self.info, self.runtime) if self.parts.attach else nullcontext()
        with model_attached, torch.no_grad():
            try:
                self.parts.loop(dec, prompt_t)
                if self.verify_lossless and self.speculation is not None:
                    self._check_lossless(prompt_t)
            except StopGeneration:
                stopped = True
            finally:
                # Copies still in flight on a CUDA copy stream must land before anything (an error handler, the
                # caching allocator) touches their buffers again. A no-op on the simulated clock.
                self.clock.synchronize()
                self.store.follow(None)
        self.store.flush_unused_prefetches()
        self.trace.finalize(self.clock)
        metrics = setup.metrics(self.trace, stopped)
        if self.runtime.draft.experts is not None:
            metrics["draft_rel_error"] = self.runtime.draft.experts.rel_error
        if self.finish is not None:
            self.finish(metrics)
        text = self.tokenizer.decode(dec.out, skip_special_tokens=False) if self.tokenizer is not None else None
        return GenerationResult(list(dec.out), text, metrics, self.trace, self.prompt_ids, metrics["strategy"],
                                config={"strategy": setup.strategy, "split": setup.split, "draft": setup.draft},
                                tokenizer=self.tokenizer)

    def _check_lossless(self, prompt_t: torch.Tensor) -> None:
        dec = self.decoder
        ref = reference_greedy(self.model, self.runtime, prompt_t, len(dec.out), dec.eos)
        if ref != dec.out:
            i = next((i for i, (a, b) in enumerate(zip(dec.out, ref)) if a != b), min(len(ref), len(dec.out)))
            raise Diverged(f"strategy {self.setup.strategy.name!r} on {self.info.model_type}: token {i} is "
                           f"{dec.out[i] if i < len(dec.out) else None}, a plain greedy pass of the target gives "
                           f"{ref[i] if i < len(ref) else None}. This is a bug; please report it.")


def check_generation(max_new_tokens, do_sample: bool, temperature, top_p) -> None:
    """One run's own arguments (the set-up's were checked by :func:`resolve`). ``temperature`` and ``top_p`` must
    be numbers even when greedy decoding ignores them: a typo there is still a typo."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: use an integer >= 1.")
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample={do_sample!r}: use True or False.")
    if not (_is_number(temperature) and temperature > 0):
        raise ValueError(f"temperature={temperature!r}: use a number > 0 (1.0: the model's own distribution).")
    if not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p={top_p!r}: use a number in (0, 1] (1.0: no nucleus cut).")


def check_context(prompt_tokens: int, max_new_tokens: int, config) -> None:
    """Refuse a run longer than the model's context (``max_position_embeddings`` of its text config) before
    anything is allocated: past it positions are ones the model never saw, and a huge ``max_new_tokens`` would
    only grow the KV cache and the trace until memory runs out."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and prompt_tokens + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens}: the prompt's {prompt_tokens} tokens plus {max_new_tokens} "
                         f"new ones exceed the model's context (config max_position_embeddings={limit}); use "
                         f"max_new_tokens <= {max(0, limit - prompt_tokens)} or a shorter prompt.")


def prepare_run(setup: RunSetup, info: MoEModelInfo, prompt_ids: list[int], max_new_tokens: int, *,
                sampling: Sampling = Sampling(), model=None, device: "torch.device | str" = "cpu", host=None,
                draft: DraftSource | None = None, host_weights=None, governor: KGovernor | None = None,
                callback: Callable[[StepInfo], None] | None = None,
                fault_hook: Callable[[int, int], None] | None = None,
                replay: Callable[..., Decoder] | None = None, record_routing: bool = True,
                host_cache=None) -> Run:
    """One run's parts from a set-up (nothing runs yet). ``replay``: a decoder that plays recorded routing instead
    of running ``model``; the store then holds no tensors. ``governor``: the K governor a ``k="auto"`` run
    consults (kept by the caller across runs, so what it learns carries over). ``host_cache``: the disk tier's
    bounded host cache (:class:`~specter_lab.offload.hostcache.HostExpertCache`, kept by the caller across runs),
    or None."""
    st = setup.strategy
    clock = run_clock(st, setup.clocks, torch.device(device), setup.trace_level)
    trace = Trace(meta=setup.meta(clock, info), record_routing=record_routing, level=setup.trace_level,
                  numeric=clock.readable_midrun)
    if st.k == "auto" and governor is not None:
        governor.new_sequence()
    eos = [] if setup.ignore_eos else info.eos_token_ids
    parts = assemble(st, model=model, info=info, slots_per_layer=setup.split.slots_per_layer, clock=clock,
                     cost=setup.cost, trace=trace, sampling=sampling, eos=eos, max_new_tokens=max_new_tokens,
                     device=device, host=host, draft=draft, host_weights=host_weights, governor=governor,
                     callback=callback, fault_hook=fault_hook, replay=replay, host_cache=host_cache)
    if parts.speculation is not None:
        parts.speculation.verify = setup.verify
    return Run(setup, info, list(prompt_ids), trace, clock, parts, model=model)
