"""Engine: one model, one strategy, one expert budget, one clock; ``generate`` returns text, tokens, metrics and
the full trace of every copy and compute span.

Every argument is checked before any work is done, and an error names the argument, the value and what would be
accepted. Nothing is left half-applied: the model is attached to the runtime only inside a run and is a plain HF
model again afterwards, whatever happened inside (errors, KeyboardInterrupt).

A run has parts (store, schedule, runtime, decoder, trace); :meth:`Engine.prepare` builds them with
:func:`specter_lab.run.assembly.assemble` and returns a :class:`Run`, so tests and tools can observe a run through its
parts (e.g. the schedule's named hook points) before :meth:`Run.execute`. :meth:`Engine.generate` is prepare +
execute.
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from .assembly import (RunParts, assemble, computes_on_host, dispatch_implementation, looks_at_the_target,
                       places_whole_layers, run_clock)
from .budget import BudgetSplit, split_budget, split_slots, split_static
from ..decode import Decoder, Sampling, Speculation, StepInfo, StopGeneration, reference_greedy
from ..decode.exactness import model_speculation_check
from ..decode.speculative import check_verify_mode
from ..decode.kv import rollback_blockers
from .drafts import DraftSpec, as_draft_spec, draft_device_experts, draft_expert_bytes
from ..errors import Diverged, NotExact
from ..records.metrics import compute_metrics
from ..model import MoEModelInfo, attached, inspect_model
from ..model.placement import ensure_offload_layout
from ..offload.clock import Clock, make_clock
from ..pricing.cost import CostModel, build_cost_model
from ..pricing.profiles import HardwareProfile
from ..offload.runtime import OffloadRuntime
from ..offload.schedule import DraftSource
from ..pricing.shapes import get_cost_shape
from ..offload.store import ExpertStore
from ..predict import KGovernor
from .quant import DraftExperts, QuantSpec
from .strategies import Strategy, get_strategy
from ..records.trace import TRACE_LEVELS, Trace
from ..units import parse_budget

__all__ = ["Engine", "GenerationResult", "BudgetSplit", "Run", "PlanLike", "register_auto_planner"]

# Quantizing the draft is the slow part of building an engine; engines on the same model share drafts.
_DRAFTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class PlanLike(Protocol):
    """What an Engine needs of a plan (``sl.plan`` returns one): the chosen engine options and a label."""

    label: str

    def engine_kwargs(self) -> dict[str, Any]: ...


# strategy="auto" plans with the function registered here (specter_lab.studies.planner registers sl.plan on import), so
# the engine never imports the planner that builds engines.
_AUTO_PLANNER: list[Callable[..., PlanLike]] = []


def auto_planner() -> Callable[..., PlanLike]:
    """The planner ``strategy="auto"`` runs (``sl.plan`` once :mod:`specter_lab.studies.planner` is imported)."""
    if not _AUTO_PLANNER:
        raise RuntimeError("strategy='auto' needs a planner: import specter_lab.studies.planner first.")
    return _AUTO_PLANNER[0]


def register_auto_planner(fn: Callable[..., PlanLike]) -> None:
    """Make ``fn(model, tokenizer, hardware, expert_budget, cost_shape=, progress=, draft=, k=)`` the planner
    that ``strategy="auto"`` runs."""
    _AUTO_PLANNER[:] = [fn]


@dataclass
class GenerationResult:
    """What ``Engine.generate`` returns. ``token_ids`` are the generated tokens only."""

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
        """Write a standalone HTML report of this run (figures + metrics). Returns the path."""
        from ..viz.report import report_html  # the view layer, on request only (see tests/test_layers.py)

        with open(path, "w", encoding="utf-8") as f:
            f.write(report_html(self, self.tokenizer))
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


def _check_options(**options) -> None:
    """The caller's strategy overrides, validated as a strategy would validate them (before any planning)."""
    try:
        Strategy("options").with_options(**options)
    except (ValueError, TypeError) as exc:  # name the argument as the caller spelled it
        raise type(exc)(str(exc).replace("Strategy 'options': ", "")) from None


def _as_host_dtype(host_dtype) -> "torch.dtype | None":
    if host_dtype is None:
        return None
    dt = getattr(torch, host_dtype, None) if isinstance(host_dtype, str) else host_dtype
    if dt not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"host_dtype={host_dtype!r}: use 'float32', 'bfloat16', 'float16' or None (the experts' "
                         "own dtype).")
    return dt


def _check_rewindable(model, info: MoEModelInfo, strategy: str, verify: str = "batched") -> None:
    """Speculation rewinds the cache after every window; refuse (before any work) where that is not exact."""
    blockers = rollback_blockers(model)
    if blockers:
        raise NotExact(
            f"strategy={strategy!r} cannot run exactly on {info.model_type}: its cache has layers of kind "
            f"{', '.join(blockers)}, which cannot be rewound after a rejected draft (no crop, no known checkpoint). "
            "The non-speculative strategies (on_demand, lru, gate_lookahead) are exact on this model.")
    why = model_speculation_check(model, info.model_type, verify)
    if why:
        raise NotExact(
            f"strategy={strategy!r} cannot run exactly on {info.model_type}: {why} (checked on a tiny random "
            f"{info.model_type}). The non-speculative strategies (on_demand, lru, gate_lookahead) are exact on "
            "this model.")


class Engine:
    """Run a Hugging Face MoE model with its routed experts offloaded, under one strategy and memory budget.

    Args:
        model: any transformers ≥5 MoE model (its experts use the experts interface).
        tokenizer: optional; needed for string prompts and ``result.text``.
        strategy: a name in ``sl.STRATEGIES``, a :class:`Strategy`, or a plan from ``sl.plan``
            (:meth:`from_plan`). ``"auto"`` is shorthand for planning here, which runs a short calibration first.
        expert_budget: device bytes for routed experts (draft + full-precision slots): a fraction in (0, 1] of
            the full-precision routed-expert bytes, a byte count, or a string like ``"2GiB"``. Default 0.5.
        cache_slots: alternatively, full-precision slots per layer (the draft comes on top).
        draft: the draft's :class:`QuantSpec` (speculative strategies), or a :class:`DraftSpec` / variant name.
        k: draft length, or ``"auto"`` for the per-window governor. With ``strategy="auto"``, ``draft`` and ``k``
            pin the planner's speculative candidates: it decides whether to speculate, with your draft and K.
        hardware: a profile name in ``sl.PROFILES``, a :class:`HardwareProfile`, or ``"cuda"`` (real clock).
        cost_shape: price experts as a named real model (``sl.COST_SHAPES``); results are labelled projected.
        eviction, prefetch, chunking, shared_slots, cpu_share: override the strategy's (for ablations;
            ``cpu_share`` is ``global_lru``'s share of misses computed on the host).
        host_dtype: the precision host execution computes in (``"float32"``, ``"bfloat16"``; None: the experts'
            own). A different one keeps a host copy of the experts in it (``metrics['host_copy_bytes']``); only
            on a GPU, where host and device results differ by rounding anyway.
        trace: ``"full"`` records every copy, compute span, cache event and routing (what the views read);
            ``"steps"`` records steps and tokens only, and the metrics stay the same (they come from a tally kept
            at both levels): what sweeps run, and a speed run on CUDA creates one untimed event per op instead of
            three timed ones (there the duration sums, e.g. stall, are NaN: untimed events carry no time).
        verify_lossless: after every greedy speculative run, check the committed tokens against a plain greedy
            pass of the target (off the clock) and raise :class:`~specter_lab.errors.Diverged` if they differ.
            Off by default (it doubles the work); the tests turn it on.
        verify: how speculative strategies verify a window: ``"batched"`` (default; one target pass over the
            K+1 positions: the target's greedy choice under that pass's rounding, which in bf16/fp16 can differ
            from token-by-token decoding at a near-tie: docs/lossless.md) or ``"exact"`` (one-token passes:
            equal to HF generate in every dtype, at up to K+1 dense forwards per window).

    Attribute ``fault_hook`` (default None): a ``fn(layer, expert)`` that each run's ExpertStore calls before
    every host→device copy; it may raise to inject a failed copy (tests).
    """

    def __init__(self, model, tokenizer=None, strategy: "str | Strategy | PlanLike" = "specter", *,
                 expert_budget: "float | int | str | None" = None, cache_slots: int | None = None,
                 draft: "QuantSpec | DraftSpec | str | None" = None, k: "int | str | None" = None,
                 hardware: "str | HardwareProfile | None" = None, cost_shape: str | None = None,
                 eviction: str | None = None, prefetch: str | None = None,
                 chunking: "str | tuple[float, ...] | None" = None, shared_slots: bool | None = None,
                 cpu_share: float | None = None, record_routing: bool = True, verify_lossless: bool = False, trace: str = "full",
                 host_dtype: "str | torch.dtype | None" = None, verify: str = "batched") -> None:
        self.info = inspect_model(model)  # raises on a dense model
        self.verify = check_verify_mode(verify)
        _as_host_dtype(host_dtype)  # a bad value fails before anything is planned or placed
        if trace not in TRACE_LEVELS:
            raise ValueError(f"trace={trace!r}: use 'full' (every copy, span and routing: the views need it) or "
                             "'steps' (steps and tokens only: a speed run on CUDA pays for no per-op events).")
        # The caller's own arguments first, before any planning/calibration work (strategy='auto').
        _check_options(k=k, eviction=eviction, prefetch=prefetch, chunking=chunking, cpu_share=cpu_share)
        if cache_slots is not None and expert_budget is not None:
            raise ValueError("give either expert_budget= or cache_slots=, not both.")
        self.plan = None
        if strategy == "auto" or hasattr(strategy, "engine_kwargs"):
            strategy, draft, k = self._resolve_plan(model, tokenizer, strategy, expert_budget, cache_slots, draft, k,
                                                    hardware, cost_shape)
        self.strategy = get_strategy(strategy).with_options(k=k, eviction=eviction, prefetch=prefetch,
                                                             chunking=chunking, shared_slots=shared_slots,
                                                             cpu_share=cpu_share)
        if self.strategy.speculative:
            _check_rewindable(model, self.info, self.strategy.name, self.verify)
        self.draft_cfg = as_draft_spec(draft)
        self.clocks = make_clock(hardware)  # raises on an unknown profile, or 'cuda' without CUDA
        if self.clocks.measured and cost_shape is not None:
            raise ValueError(f"cost_shape={cost_shape!r} prices experts as another model, but hardware='cuda' "
                             "measures this one: drop cost_shape=, or use a simulated profile to project.")
        if self.clocks.measured:  # dense weights on the GPU, experts in pinned host memory (done here if not yet)
            ensure_offload_layout(model, self.info)
            if looks_at_the_target(self.strategy):
                warnings.warn(f"strategy={self.strategy.name!r} on hardware='cuda': its look at the target's true "
                              "routing is a real forward on the GPU; it is cut out of the timeline, but its "
                              "prefetches cannot be issued back in time as on the simulated clock, and copies "
                              "in flight during it are not charged: read it as an estimate, not a strict bound.",
                              stacklevel=2)
        self.profile = self.clocks.profile  # on a measured clock it only feeds planner estimates
        self.cost_shape = get_cost_shape(cost_shape)
        # On the CUDA clock bytes are the real ones (the model's dtype); simulated runs price the deployment dtype.
        first = self.info.layers[0]
        wbytes = getattr(first.experts, first.param_names[0]).element_size() if self.clocks.measured else 2.0
        self.cost: CostModel = build_cost_model(self.info, self.profile, self.cost_shape, weight_bytes=wbytes,
                                                implementation=dispatch_implementation(self.strategy))
        self.model = model
        self.tokenizer = tokenizer
        self._budget_given = cache_slots is None
        self.split = self._resolve_budget(expert_budget, cache_slots)
        self.record_routing = record_routing
        self.trace_level = trace
        self.verify_lossless = bool(verify_lossless)
        self.fault_hook: Callable[[int, int], None] | None = None  # passed to each run's ExpertStore (tests)
        self._draft: DraftExperts | None = None
        # k="auto": the K governor, kept across generate() calls (set it to None to start its learning afresh).
        self.governor: KGovernor | None = None
        self._host = None  # host copies of the experts (pinned on CUDA), made once and kept across runs
        # The device the model computes on: where its non-expert weights live (experts may sit in host memory).
        self.device = (model.get_input_embeddings().weight.device if hasattr(model, "get_input_embeddings")
                       else next(model.parameters()).device)
        self.host_dtype = self._check_host_dtype(host_dtype)
        self._host_exec = None  # host copies in host_dtype (host execution), made once when it differs

    @classmethod
    def from_plan(cls, model, tokenizer, plan: PlanLike, **kwargs) -> "Engine":
        """The engine a plan (``sl.plan(...)``) chose, at the budget, hardware and cost shape it was planned for
        (``plan.expert_budget``, ``plan.hardware``, ``plan.cost_shape``) unless given here."""
        for name in ("expert_budget", "hardware", "cost_shape"):
            if name not in kwargs and getattr(plan, name, None) is not None:
                kwargs[name] = getattr(plan, name)
        return cls(model, tokenizer, plan, **kwargs)

    def _resolve_plan(self, model, tokenizer, strategy, expert_budget, cache_slots, draft, k, hardware, cost_shape):
        """strategy='auto' (plan now) or a plan made earlier: (strategy name, draft, k) it chose."""
        if cache_slots is not None:
            raise ValueError("strategy='auto' plans the slot split itself: give expert_budget=, not cache_slots=.")
        make_clock(hardware), get_cost_shape(cost_shape)  # fail before the calibration runs
        as_draft_spec(draft)
        if isinstance(expert_budget, str):
            parse_budget(expert_budget)  # a malformed size, not "too small for every candidate"
        if strategy == "auto":
            # The caller's draft / k pin the speculative candidates instead of being overridden afterwards.
            strategy = auto_planner()(model, tokenizer, hardware, 0.5 if expert_budget is None else expert_budget,
                                        cost_shape=cost_shape, progress=False, draft=draft, k=k)
        self.plan = strategy
        chosen = strategy.engine_kwargs()
        return chosen.pop("strategy"), chosen.get("draft", draft), chosen.get("k", k)

    # ------------------------------------------------------------------ budget
    @property
    def draft_spec(self) -> QuantSpec:
        """The low-bit format of the draft's experts (quantized and hybrid variants)."""
        return self.draft_cfg.quant

    @property
    def draft_bytes(self) -> int:
        """Device bytes the draft keeps resident, out of the expert budget."""
        if not self.strategy.speculative:
            return 0
        return int(self.draft_expert_bytes * draft_device_experts(self.info, self.draft_cfg))

    @property
    def draft_expert_bytes(self) -> float:
        """Packed bytes of one draft expert, priced like the fp ones."""
        return draft_expert_bytes(self.info, self.draft_spec, self.cost_shape, self.cost.expert_params)

    def _resolve_budget(self, expert_budget, cache_slots) -> BudgetSplit:
        eb, draft, name = self.cost.expert_bytes, self.draft_bytes, self.strategy.name
        if places_whole_layers(self.strategy):
            if cache_slots is not None:
                raise ValueError(f"strategy={name!r} places whole layers, not slots: give expert_budget=, "
                                 "not cache_slots=.")
            return split_static(self.info, expert_budget, eb, name)
        if cache_slots is not None:
            return split_slots(self.info, cache_slots, draft, eb, name)
        return split_budget(self.info, expert_budget, draft, eb, name)

    # ------------------------------------------------------------------ draft
    @property
    def draft(self) -> DraftExperts:
        """The quantized draft experts (built on first use, then shared by the engines of this model).

        On a GPU at most one draft per model is kept on the device (the planner and ``compare`` try several):
        building another drops the shared one, and engines look it up at every run instead of holding it, so
        a draft they no longer use is freed rather than sitting outside every budget."""
        if self._draft is not None and self._draft.spec == self.draft_spec:
            return self._draft
        shared = _DRAFTS.setdefault(self.model, {})
        key = (self.draft_spec, str(self.device))
        if key not in shared:
            if self.device.type != "cpu":
                for other in [k for k in shared if k[1] == key[1]]:
                    del shared[other]
            shared[key] = DraftExperts(self.info, self.draft_spec, device=self.device)
        if self.device.type == "cpu":
            self._draft = shared[key]  # host memory, outside the budget: keep it
        return shared[key]

    def _hybrid_builder(self) -> Callable[[list[set[int]]], DraftExperts]:
        """The hybrid draft's low-bit copies, made for the sets the run chose after its prefill (a few experts
        per layer: quantizing them is quick), so the device never holds the other experts' copies."""
        return lambda sets: DraftExperts(self.info, self.draft_spec, device=self.device, experts=sets)

    def set_draft(self, spec: "QuantSpec | DraftSpec | str") -> None:
        """Change the draft (re-quantized on next use). The slot split follows its new size; on an error (the
        budget cannot hold it) the engine keeps its previous draft."""
        cfg = as_draft_spec(spec)
        if isinstance(spec, QuantSpec) and self.draft_cfg.variant != "quantized":
            cfg = DraftSpec(self.draft_cfg.variant, spec, self.draft_cfg.hybrid_experts)
        old = (self.draft_cfg, self.split)
        self.draft_cfg = cfg
        try:
            self.split = self._resolve_budget(self.split.budget_bytes if self._budget_given else None,
                                              None if self._budget_given else min(self.split.slots_per_layer))
        except ValueError:
            self.draft_cfg, self.split = old
            raise

    # ------------------------------------------------------------------ generation
    def encode(self, prompt) -> list[int]:
        """A string (needs the tokenizer), a list of ids, or a 1-D / [1, T] tensor → list of ids, validated."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one character or token id.")
            if self.tokenizer is None:
                raise ValueError("prompt is a string but the Engine has no tokenizer: pass tokenizer= or token ids.")
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        elif isinstance(prompt, torch.Tensor):
            if prompt.dim() == 2:
                if prompt.shape[0] != 1:
                    raise ValueError(f"prompt tensor has batch {prompt.shape[0]}; specter_lab decodes batch 1.")
                prompt = prompt[0]
            if prompt.dim() != 1 or prompt.is_floating_point():
                raise ValueError("prompt tensor must hold integer token ids, shape [T] or [1, T].")
            ids = prompt.tolist()
        elif isinstance(prompt, (list, tuple)):
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                raise ValueError("prompt list must hold integer token ids.")
            ids = list(prompt)
        else:
            raise TypeError(f"prompt must be a string, a list of token ids or a tensor, got {type(prompt).__name__}.")
        if not ids:
            raise ValueError("prompt is empty: give at least one token id.")
        bad = [t for t in ids if not 0 <= t < self.info.vocab]
        if bad:
            raise ValueError(f"prompt has token ids outside the vocabulary [0, {self.info.vocab}): {bad[:5]}.")
        return ids

    def generate(self, prompt, max_new_tokens: int = 64, *, do_sample: bool = False, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = 0,
                 callback: Callable[[StepInfo], None] | None = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens (EOS stops, as HF generate). Greedy output equals HF's
        ``model.generate(do_sample=False)``; sampling draws from the target's distribution (seeded)."""
        run = self.prepare(prompt, max_new_tokens, do_sample=do_sample, temperature=temperature, top_p=top_p,
                           seed=seed, callback=callback)
        try:
            return run.execute()
        finally:
            run.store.release()

    def prepare(self, prompt, max_new_tokens: int = 64, *, do_sample: bool = False, temperature: float = 1.0,
                top_p: float = 1.0, seed: int | None = 0,
                callback: Callable[[StepInfo], None] | None = None, replay: Callable[..., Decoder] | None = None
                ) -> "Run":
        """Validate the arguments and build one run's parts (nothing runs yet): see :class:`Run`. ``replay``: a
        decoder that plays recorded routing instead of running the model (:func:`specter_lab.routing.replay.replay`)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r}: use an integer >= 1.")
        if do_sample and not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"temperature={temperature!r}: use a number > 0.")
        if do_sample and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
            raise ValueError(f"top_p={top_p!r}: use a number in (0, 1].")
        if do_sample and self.verify_lossless:
            raise ValueError("verify_lossless=True checks greedy decoding; sampled runs match the target's "
                             "distribution, not its tokens (use do_sample=False, or verify_lossless=False).")
        ids = self.encode(prompt)
        st = self.strategy
        clock = run_clock(st, self.clocks, self.device, self.trace_level)
        trace = Trace(meta=self._meta(clock), record_routing=self.record_routing, level=self.trace_level,
                      numeric=clock.readable_midrun)
        if st.k == "auto" and self.governor is None:
            # One governor per engine: what it learns about acceptance by depth and copy exposure carries over
            # from one generate() to the next (a 48-token run is mostly learning otherwise).
            self.governor = KGovernor()
        if st.k == "auto":
            self.governor.new_sequence()
        parts = assemble(st, model=self.model, info=self.info, slots_per_layer=self.split.slots_per_layer,
                         clock=clock, cost=self.cost, trace=trace,
                         sampling=Sampling(do_sample, float(temperature), float(top_p), seed),
                         eos=self.info.eos_token_ids, max_new_tokens=max_new_tokens, device=self.device,
                         host=self._host, draft=self._draft_source(replay is None) if st.speculative else None,
                         host_weights=self._host_weights if replay is None else None, governor=self.governor,
                         callback=callback, fault_hook=self.fault_hook, replay=replay)
        self._host = parts.store.host
        if parts.speculation is not None:
            parts.speculation.verify = self.verify
        return Run(self, ids, trace, clock, parts)

    def _draft_source(self, with_weights: bool = True) -> DraftSource:
        """The draft's experts (``with_weights=False``: priced only, a replay computes nothing)."""
        cfg = self.draft_cfg
        hybrid = cfg.variant == "hybrid"
        weights = self.draft if with_weights and cfg.variant == "quantized" else None
        return DraftSource(cfg.variant, weights, self.draft_expert_bytes, cfg.hybrid_experts if hybrid else 0,
                           build=self._hybrid_builder() if hybrid and with_weights else None)

    def _check_host_dtype(self, host_dtype) -> "torch.dtype | None":
        """``host_dtype``: the precision host execution computes in (None: the experts' own dtype)."""
        dt = _as_host_dtype(host_dtype)
        if dt is None:
            return None
        first = self.info.layers[0]
        native = getattr(first.experts, first.param_names[0]).dtype
        if dt != native and self.device.type == "cpu":
            raise NotExact(f"host_dtype={host_dtype!r} differs from the experts' {native}: on the CPU the host's "
                           "results would not be bit-identical to HF generate's. Leave host_dtype=None here; on a "
                           "GPU a different host precision is allowed (GPU and CPU kernels round differently "
                           "anyway; scripts/gpu_check.py measures the agreement).")
        return None if dt == native else dt

    @property
    def _host_weights(self) -> "list[dict[str, torch.Tensor]] | None":
        """The host lane's weights when they differ from the store's host copies: copies in ``host_dtype``
        (extra host memory: ``metrics['host_copy_bytes']``), made once per engine from the model's experts."""
        st = self.strategy
        if self.host_dtype is None or not computes_on_host(st):
            return None  # no host execution: no copy
        if self._host_exec is None:
            self._host_exec = [{n: getattr(l.experts, n).detach().to("cpu", self.host_dtype) for n in l.param_names}
                               for l in self.info.layers]
        return self._host_exec

    def _meta(self, clock: Clock) -> dict[str, Any]:
        st = self.strategy
        return {"clock": clock.label, "simulated": not clock.measured, "profile": self.profile.name,
                "projected": self.cost.projected, "cost_shape": self.cost.shape_name, "strategy": st.name,
                "expert_bytes": self.cost.expert_bytes, "num_layers": self.info.num_layers,
                "num_experts": self.info.num_experts, "top_k": self.info.top_k, "k": st.k}

    def _metrics(self, run: "Run", stopped: bool) -> dict[str, Any]:
        st, cfg = self.strategy, self.draft_cfg
        metrics = compute_metrics(run.trace)
        metrics.update(self.split.as_dict())
        metrics.update({"strategy": "auto" if self.plan else st.name, "plan": self.plan.label if self.plan else None,
                        "profile": self.profile.name, "projected": self.cost.projected,
                        "cost_shape": self.cost.shape_name, "draft": cfg.label if st.speculative else None,
                        "k": st.k, "stopped": stopped,
                        "host_dtype": str(self.host_dtype or "") .replace("torch.", "") or "experts' own",
                        "host_copy_bytes": sum(t.numel() * t.element_size() for l in (self._host_exec or [])
                                               for t in l.values())})
        if run.runtime.draft.experts is not None:
            metrics["draft_rel_error"] = run.runtime.draft.experts.rel_error
        return metrics

    def __repr__(self) -> str:
        s = self.split
        return (f"Engine(strategy={self.strategy.name!r}, slots/layer={min(s.slots_per_layer)}, "
                f"draft={self.draft_cfg.label if self.strategy.speculative else None}, "
                f"budget={s.budget_bytes:,} B, clock={'cuda' if self.clocks.measured else self.profile.name})")


@dataclass
class Run:
    """One generation's parts, built by :meth:`Engine.prepare`: observe them (``runtime.hooks``, ``store``,
    ``trace``) before :meth:`execute`, or after it to see how the run ended."""

    engine: Engine
    prompt_ids: list[int]
    trace: Trace
    clock: Clock
    parts: RunParts

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
        """Generate (the model is attached for exactly this call), then finalize the trace and the metrics."""
        eng, dec = self.engine, self.decoder
        prompt_t = torch.tensor([self.prompt_ids], dtype=torch.long)
        stopped = False
        model_attached = attached(eng.model, eng.info, self.runtime) if self.parts.attach else nullcontext()
        with model_attached, torch.no_grad():
            try:
                self.parts.loop(dec, prompt_t)
                if eng.verify_lossless and self.speculation is not None:
                    self._check_lossless(prompt_t)
            except StopGeneration:
                stopped = True
            finally:
                # Copies still in flight on a CUDA copy stream must land before anything (an error handler, the
                # caching allocator) touches their buffers again. A no-op on the simulated clock.
                self.clock.synchronize()
                self.store.policy.follow(None)
        self.store.flush_unused_prefetches()
        self.trace.finalize(self.clock)
        metrics = eng._metrics(self, stopped)
        text = eng.tokenizer.decode(dec.out, skip_special_tokens=False) if eng.tokenizer is not None else None
        return GenerationResult(list(dec.out), text, metrics, self.trace, self.prompt_ids, metrics["strategy"],
                                config={"strategy": eng.strategy, "split": eng.split, "draft": eng.draft_cfg},
                                tokenizer=eng.tokenizer)

    def _check_lossless(self, prompt_t: torch.Tensor) -> None:
        dec = self.decoder
        ref = reference_greedy(self.engine.model, self.runtime, prompt_t, len(dec.out), dec.eos)
        if ref != dec.out:
            i = next((i for i, (a, b) in enumerate(zip(dec.out, ref)) if a != b), min(len(ref), len(dec.out)))
            raise Diverged(f"strategy {self.engine.strategy.name!r} on {self.engine.info.model_type}: token {i} is "
                           f"{dec.out[i] if i < len(dec.out) else None}, a plain greedy pass of the target gives "
                           f"{ref[i] if i < len(ref) else None}. This is a bug; please report it.")
