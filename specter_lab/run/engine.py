"""Engine: one model, one strategy, one expert budget, one clock; ``generate`` returns text, tokens, metrics and
the full trace of every copy and compute span.

The Engine binds a :class:`~specter_lab.run.setup.RunSetup` (strategy, draft, clock, cost model, budget split:
resolved by :func:`~specter_lab.run.setup.resolve` without the model) to a live model: it checks that speculation
is exact on the model's family, places the weights on a real clock and keeps the draft and host copies across
runs. Every argument is checked before any work is done, and an error names the argument, the value and what would
be accepted. Nothing is left half-applied: the model is attached to the runtime only inside a run and is a plain HF
model again afterwards, whatever happened inside (errors, KeyboardInterrupt).

:meth:`Engine.prepare` builds one run's parts (:func:`~specter_lab.run.setup.prepare_run`) and returns a
:class:`~specter_lab.run.setup.Run`, so tests and tools can observe a run through its parts (e.g. the schedule's
named hook points) before :meth:`Run.execute`. :meth:`Engine.generate` is prepare + execute.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Protocol

import torch

from ..decode import Sampling, StepInfo
from ..decode.exactness import model_speculation_check
from ..decode.kv import rollback_blockers
from ..errors import NotEnoughMemory, NotExact
from ..model import MoEModelInfo, inspect_model, memory  # memory.available_memory: looked up per call
from ..model.expert_files import ExpertFiles, checkpoint_of
from ..model.placement import ensure_offload_layout
from ..offload.clock import make_clock
from ..offload.hostcache import HostExpertCache
from ..offload.schedule import DraftSource
from ..predict import KGovernor
from ..pricing.profiles import HardwareProfile
from ..pricing.shapes import get_cost_shape
from ..units import format_bytes, parse_budget
from .assembly import computes_on_host, looks_at_the_target
from .budget import BudgetSplit
from .drafts import DraftSpec, as_draft_spec
from .quant import DraftExperts, QuantSpec, shared_draft
from .setup import (GenerationResult, Run, RunSetup, as_host_dtype, check_context, check_generation, check_options,
                    prepare_run)
from .setup import resolve
from .strategies import Strategy

__all__ = ["Engine", "GenerationResult", "BudgetSplit", "Run", "PlanLike", "register_auto_planner"]

class PlanLike(Protocol):
    """What an Engine needs of a plan (``sl.plan`` returns one): the chosen engine options and a label."""

    label: str

    def engine_kwargs(self) -> dict[str, Any]: ...


# strategy="auto" plans with the function registered here (specter_lab.studies.planner registers sl.plan on
# import), so the engine never imports the planner that builds engines.
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


# The keyword options an Engine passes to resolve() as given (the named ones it also plans with).
_SETUP_OPTIONS = {"eviction", "prefetch", "chunking", "shared_slots", "cpu_share", "trace", "host_dtype", "ignore_eos",
                  "verify", "host_budget", "weights", "depth", "gpu_layers", "host_layers", "kv_type"}


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
        weights, depth, gpu_layers: with a llama.cpp-class profile (``hardware="rtx3060-12gb-pcie4@llama.cpp"``),
            the weights' format (``"q4_k_m"``, ``"mxfp4+q8_0"``), the KV cache read at ``depth`` tokens, and
            llama.cpp's ``-ngl`` (decoder layers on the GPU; the rest whole on the host, with a static split).
        host_layers: the MoE layers a static split (``static_split``) keeps on the host, as llama.cpp's
            ``--n-cpu-moe`` / ``-ot`` place them, instead of as many as the budget leaves.
        eviction, prefetch, chunking, shared_slots, cpu_share: override the strategy's (for ablations;
            ``cpu_share`` is ``global_lru``'s share of misses computed on the host).
        host_dtype: the precision host execution computes in (``"float32"``, ``"bfloat16"``; None: the experts'
            own). A different one keeps a host copy of the experts in it (``metrics['host_copy_bytes']``); only
            on a GPU, where host and device results differ by rounding anyway.
        trace: ``"full"`` records every copy, compute span, cache event and routing (what the views read);
            ``"steps"`` records steps and tokens only, and the metrics stay the same (they come from a tally kept
            at both levels): what sweeps run, and a speed run on CUDA creates one untimed event per op instead of
            three timed ones (there the duration sums, e.g. stall, are NaN: untimed events carry no time).
        ignore_eos: every run commits ``max_new_tokens`` (a benchmark protocol's fixed output length).
        verify: how speculative strategies verify a window: ``"batched"`` (default; one target pass over the
            K+1 positions: the target's greedy choice under that pass's rounding, which in bf16/fp16 can differ
            from token-by-token decoding at a near-tie: docs/lossless.md) or ``"exact"`` (one-token passes:
            equal to HF generate in every dtype, at up to K+1 dense forwards per window).
        host_budget: the disk tier (``docs/disk_tier.md``): host RAM for routed-expert weights, as a fraction of
            their bytes in the model's dtype, bytes, or ``"512MiB"``. The host then keeps at most that much in a
            bounded LRU cache and reads every other expert from the checkpoint's safetensors files on demand (a
            ``disk`` lane on the clock, priced by the profile's ``disk_bandwidth``; ``metrics['disk_reads']``).
            Needs a model loaded from a local folder (``sl.load_model(path)``) whose files hold the experts in
            the model's dtype. None (default): every expert has a host copy (in RAM, or mapped from the files).
        verify_lossless: after every greedy speculative run, check the committed tokens against a plain greedy
            pass of the target (off the clock) and raise :class:`~specter_lab.errors.Diverged` if they differ.
            Off by default (it doubles the work); the tests turn it on.

    Attribute ``fault_hook`` (default None): a ``fn(layer, expert)`` that each run's ExpertStore calls before
    every host→device copy; it may raise to inject a failed copy (tests).
    """

    def __init__(self, model, tokenizer=None, strategy: "str | Strategy | PlanLike" = "specter", *,
                 expert_budget: "float | int | str | None" = None, cache_slots: int | None = None,
                 draft: "QuantSpec | DraftSpec | str | None" = None, k: "int | str | None" = None,
                 hardware: "str | HardwareProfile | None" = None, cost_shape: str | None = None,
                 record_routing: bool = True, verify_lossless: bool = False, **options) -> None:
        self.info = inspect_model(model)  # raises on a dense model
        # The caller's own arguments first, before any planning/calibration work (strategy='auto').
        as_host_dtype(options.get("host_dtype"))
        unknown = set(options) - _SETUP_OPTIONS
        if unknown:
            raise TypeError(f"Engine() got unexpected keyword arguments {sorted(unknown)}; the run's options are "
                            f"{sorted(_SETUP_OPTIONS)}.")
        check_options(k=k, **{n: options.get(n) for n in ("eviction", "prefetch", "chunking", "cpu_share")})
        self.plan = None
        if strategy == "auto" or hasattr(strategy, "engine_kwargs"):
            strategy, draft, k = self._resolve_plan(model, tokenizer, strategy, expert_budget, cache_slots, draft, k,
                                                    hardware, cost_shape)
        self.setup: RunSetup = resolve(self.info, strategy, expert_budget=expert_budget, cache_slots=cache_slots,
                                       draft=draft, k=k, hardware=hardware, cost_shape=cost_shape, **options)
        self.model = model
        self.tokenizer = tokenizer
        self.record_routing = record_routing
        self.verify_lossless = bool(verify_lossless)
        self.fault_hook: Callable[[int, int], None] | None = None  # passed to each run's ExpertStore (tests)
        # k="auto": the K governor, kept across generate() calls (set it to None to start its learning afresh).
        self.governor: KGovernor | None = None
        self._draft: DraftExperts | None = None
        self._host = None  # host copies of the experts (pinned on CUDA), made once and kept across runs
        self._host_exec = None  # host copies in host_dtype (host execution), made once when it differs
        self._host_cache = None  # the disk tier's bounded host cache (host_budget=), made once and kept warm
        # The device the model computes on: where its non-expert weights live (experts may sit in host memory).
        self.device = (model.get_input_embeddings().weight.device if hasattr(model, "get_input_embeddings")
                       else next(model.parameters()).device)
        self._bind()

    def _bind(self) -> None:
        """What only a live model needs: speculation's exactness on this family, the offload layout on a real
        clock, the host lane's precision on this device, and the disk tier's files."""
        st = self.strategy
        if self.setup.host_budget is not None:
            self._host_cache = self._make_host_cache()
        if st.speculative:
            _check_rewindable(self.model, self.info, st.name, self.setup.verify)
        if self.setup.measured:  # dense weights on the GPU, experts in pinned host memory (done here if not yet)
            ensure_offload_layout(self.model, self.info)
            if looks_at_the_target(st):
                warnings.warn(f"strategy={st.name!r} on hardware='cuda': its look at the target's true "
                              "routing is a real forward on the GPU; it is cut out of the timeline, but its "
                              "prefetches cannot be issued back in time as on the simulated clock, and copies "
                              "in flight during it are not charged: read it as an estimate, not a strict bound.",
                              stacklevel=3)
        if self.setup.host_dtype is not None and self.device.type == "cpu":
            first = self.info.layers[0]
            native = getattr(first.experts, first.param_names[0]).dtype
            raise NotExact(f"host_dtype={str(self.setup.host_dtype).replace('torch.', '')!r} differs from the "
                           f"experts' {native}: on the CPU the host's results would not be bit-identical to HF "
                           "generate's. Leave host_dtype=None here; on a GPU a different host precision is allowed "
                           "(GPU and CPU kernels round differently anyway; scripts/gpu_check.py measures the "
                           "agreement).")

    def _make_host_cache(self):
        """The disk tier's host cache over the files the model was loaded from (checked against the model's own
        parameters before use). Refused, before any run: a model not loaded from a local folder, files in another
        dtype or layout, a budget below one expert, and host execution on a measured clock (its worker thread
        would read a host slot the main thread may refill)."""
        folder = checkpoint_of(self.model)
        if folder is None:
            raise ValueError("host_budget= reads routed experts from the checkpoint's safetensors files, and this "
                             f"model has no local folder (name_or_path={getattr(self.model, 'name_or_path', None)!r})"
                             ": load it with sl.load_model(folder), or save_pretrained it and load that.")
        host_draft = self.strategy.speculative and self.draft_cfg.variant == "host"
        if self.setup.measured and (computes_on_host(self.strategy) or host_draft):
            raise ValueError(f"host_budget= with strategy={self.strategy.name!r} on hardware='cuda': host execution "
                             "reads host-cache slots on a worker thread, which the disk tier does not yet order "
                             "against refills. Use a strategy that copies every miss (e.g. 'lru', 'specter'), or a "
                             "simulated profile.")
        files = ExpertFiles(self.info, folder)
        files.verify()
        eb, total = files.expert_bytes[0], sum(l.num_experts for l in self.info.layers)
        pool = min(self.setup.host_budget // eb, total) * eb  # what the cache will allocate
        have, source = memory.available_memory()
        if have and pool > have:  # refused before the pool is allocated, with the numbers
            raise NotEnoughMemory(f"host_budget={format_bytes(self.setup.host_budget)}: its cache of "
                                  f"{format_bytes(pool)} is more than the {format_bytes(have)} of RAM available "
                                  f"({source}); nothing was allocated. Give a smaller host_budget (the rest of the "
                                  "experts is read from disk).")
        return HostExpertCache(files, self.setup.host_budget, pin=self.device.type == "cuda")

    @property
    def host_cache(self):
        """The disk tier's host expert cache (``host_budget=``), or None: its ``held_bytes``, ``pool_bytes``,
        ``reads`` and ``hits`` are the tier's own accounting across this engine's runs."""
        return self._host_cache

    # The set-up's values, read where callers have always read them.
    strategy = property(lambda self: self.setup.strategy)
    split = property(lambda self: self.setup.split)
    cost = property(lambda self: self.setup.cost)
    clocks = property(lambda self: self.setup.clocks)
    profile = property(lambda self: self.setup.profile)
    cost_shape = property(lambda self: self.setup.cost_shape)
    draft_cfg = property(lambda self: self.setup.draft)
    host_dtype = property(lambda self: self.setup.host_dtype)
    trace_level = property(lambda self: self.setup.trace_level)
    verify = property(lambda self: self.setup.verify)

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
        return self.split.draft_bytes

    @property
    def draft_expert_bytes(self) -> float:
        """Packed bytes of one draft expert, priced like the fp ones."""
        return self.setup.draft_expert_bytes

    # ------------------------------------------------------------------ draft
    @property
    def draft(self) -> DraftExperts:
        """The quantized draft experts (built on first use, then shared by the engines of this model).

        On a GPU at most one draft per model is kept on the device (the planner and ``compare`` try several):
        building another drops the shared one, and engines look it up at every run instead of holding it, so
        a draft they no longer use is freed rather than sitting outside every budget."""
        if self._draft is not None and self._draft.spec == self.draft_spec:
            return self._draft
        draft = shared_draft(self.model, self.info, self.draft_spec, self.device)
        if self.device.type == "cpu":
            self._draft = draft  # host memory, outside the budget: keep it
        return draft

    def set_draft(self, spec: "QuantSpec | DraftSpec | str") -> None:
        """Change the draft (re-quantized on next use). The slot split follows its new size; on an error (the
        budget cannot hold it) the engine keeps its previous draft."""
        self.setup = self.setup.with_draft(self.info, spec)

    def use_draft(self, experts: DraftExperts) -> None:
        """Run with these already quantized draft experts (e.g. the ones a fidelity study just measured) instead
        of quantizing the engine's draft spec again; they must be of that spec."""
        if not isinstance(experts, DraftExperts) or experts.spec != self.draft_spec:
            raise ValueError(f"use_draft: give the DraftExperts of this engine's draft {self.draft_spec.label}, "
                             f"got {getattr(getattr(experts, 'spec', None), 'label', type(experts).__name__)}.")
        self._draft = experts

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
        ``model.generate(do_sample=False)``; sampling draws from the target's distribution (seeded). A prompt plus
        ``max_new_tokens`` past the model's ``max_position_embeddings`` is refused before anything runs."""
        run = self.prepare(prompt, max_new_tokens, do_sample=do_sample, temperature=temperature, top_p=top_p,
                           seed=seed, callback=callback)
        try:
            return run.execute()
        finally:
            run.store.release()

    def prepare(self, prompt, max_new_tokens: int = 64, *, do_sample: bool = False, temperature: float = 1.0,
                top_p: float = 1.0, seed: int | None = 0,
                callback: Callable[[StepInfo], None] | None = None) -> Run:
        """Validate the arguments and build one run's parts (nothing runs yet): see :class:`Run`."""
        check_generation(max_new_tokens, do_sample, temperature, top_p)
        if do_sample and self.verify_lossless:
            raise ValueError("verify_lossless=True checks greedy decoding; sampled runs match the target's "
                             "distribution, not its tokens (use do_sample=False, or verify_lossless=False).")
        ids = self.encode(prompt)
        check_context(len(ids), max_new_tokens, self.model.config)
        if self.strategy.k == "auto" and self.governor is None:
            # One governor per engine: what it learns about acceptance by depth and copy exposure carries over
            # from one generate() to the next (a 48-token run is mostly learning otherwise).
            self.governor = KGovernor()
        run = prepare_run(self.setup, self.info, ids, max_new_tokens,
                          sampling=Sampling(do_sample, float(temperature), float(top_p), seed), model=self.model,
                          device=self.device, host=self._host, draft=self._draft_source(),
                          host_weights=self._host_weights, governor=self.governor, callback=callback,
                          fault_hook=self.fault_hook, record_routing=self.record_routing,
                          host_cache=self._host_cache)
        self._host = run.store.host
        run.tokenizer, run.verify_lossless, run.finish = self.tokenizer, self.verify_lossless, self._finish
        return run

    def _draft_source(self) -> DraftSource | None:
        """The draft's experts as the schedule computes with them (low-bit copies built on first use)."""
        d = self.draft_cfg
        build = ((lambda sets: DraftExperts(self.info, self.draft_spec, device=self.device, experts=sets))
                 if d.hybrid else None)  # the hybrid's copies: made for the sets the run chose after its prefill
        return self.setup.draft_source(self.draft if d.variant == "quantized" and self.strategy.speculative else None,
                                       build)

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

    def _finish(self, metrics: dict[str, Any]) -> None:
        """The binding's own metrics: a plan's label, the host copies it made."""
        if self.plan is not None:
            metrics.update({"strategy": "auto", "plan": self.plan.label})
        if self._host_cache is not None:  # the disk tier's own accounting (cumulative over this engine's runs)
            c = self._host_cache
            metrics.update(host_cache_bytes=c.pool_bytes, host_cache_peak_bytes=c.peak_bytes,
                           host_cache_slots=c.capacity)
        metrics["host_copy_bytes"] = sum(t.numel() * t.element_size() for l in (self._host_exec or [])
                                         for t in l.values())

    def __repr__(self) -> str:
        s = self.split
        return (f"Engine(strategy={self.strategy.name!r}, slots/layer={min(s.slots_per_layer)}, "
                f"draft={self.draft_cfg.label if self.strategy.speculative else None}, "
                f"budget={s.budget_bytes:,} B, clock={'cuda' if self.clocks.measured else self.profile.name})")
