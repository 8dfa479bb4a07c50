"""Engine: one model, one strategy, one expert budget, one clock; ``generate`` returns text, tokens, metrics and
the full trace of every copy and compute span.

Every argument is checked before any work is done, and an error names the argument, the value and what would be
accepted. Nothing is left half-applied: the model is attached to the runtime only inside ``generate`` and is a
plain HF model again afterwards, whatever happened inside (errors, KeyboardInterrupt).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from .drafts import DraftSpec, as_draft_spec
from .decode import Decoder, Sampling, StepInfo, StopGeneration, autoregressive, speculative
from .model import MoEModelInfo, attached, inspect_model
from .offload.cache import ForecastEviction, make_policy
from .offload.clock import CudaClock, SimClock
from .offload.hardware import PROFILES, CostModel, HardwareProfile, build_cost_model, get_cost_shape, get_profile, parse_bytes
from .offload.runtime import OffloadRuntime
from .offload.store import ExpertStore
from .predict import KGovernor, LookaheadPlanner
from .quant import DraftExperts, QuantSpec
from .strategies import Strategy, get_strategy
from .trace import Trace, compute_metrics

if TYPE_CHECKING:
    from .planner import Plan

__all__ = ["Engine", "GenerationResult", "BudgetSplit"]

# Quantizing the draft is the slow part of building an engine; engines on the same model share drafts.
_DRAFTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass
class BudgetSplit:
    """How the device memory for routed experts is spent: the resident draft plus full-precision slots."""

    budget_bytes: int
    draft_bytes: int
    slots_per_layer: list[int]
    expert_bytes: int

    @property
    def slot_bytes(self) -> int:
        return sum(self.slots_per_layer) * self.expert_bytes

    @property
    def device_bytes(self) -> int:
        return self.draft_bytes + self.slot_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "draft_bytes": self.draft_bytes, "slot_bytes": self.slot_bytes,
                "device_bytes": self.device_bytes, "slots_per_layer": int(min(self.slots_per_layer)),
                "expert_bytes": self.expert_bytes}


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
        from .viz.figures import report_html

        with open(path, "w", encoding="utf-8") as f:
            f.write(report_html(self, self.tokenizer))
        return path

    def __repr__(self) -> str:
        m = self.metrics
        return (f"GenerationResult(strategy={self.strategy!r}, new_tokens={len(self.token_ids)}, "
                f"tpot_ms={m.get('tpot_ms', float('nan')):.3f}, hit_rate={m.get('hit_rate', float('nan')):.3f}, "
                f"clock={m.get('clock')!r})")


def _draft_ratio(info: MoEModelInfo, spec: QuantSpec) -> float:
    """Packed draft bytes per fp16 byte of routed-expert weights, computed from shapes (no quantization)."""
    packed = numel = 0
    for layer in info.layers:
        for name in layer.param_names:
            t = getattr(layer.experts, name)
            if name.endswith("_bias"):
                packed += t.numel() * 2
            else:
                packed += spec.packed_bytes(t.numel(), t.shape[-1])
                numel += t.numel()
    return packed / (2 * numel)


class Engine:
    """Run a Hugging Face MoE model with its routed experts offloaded, under one strategy and memory budget.

    Args:
        model: any transformers ≥5 MoE model (its experts use the experts interface).
        tokenizer: optional; needed for string prompts and ``result.text``.
        strategy: a name in ``sl.STRATEGIES``, a :class:`Strategy`, or a plan from ``sl.plan`` (``"auto"`` plans
            here, which runs a short calibration first).
        expert_budget: device bytes for routed experts (draft + full-precision slots): a fraction in (0, 1] of
            the full-precision routed-expert bytes, a byte count, or a string like ``"2GiB"``. Default 0.5.
        cache_slots: alternatively, full-precision slots per layer (the draft comes on top).
        draft: the draft's :class:`QuantSpec` (speculative strategies).
        k: draft length, or ``"auto"`` for the per-window governor. With ``strategy="auto"``, ``draft`` and ``k``
            pin the planner's speculative candidates: it decides whether to speculate, with your draft and K.
        hardware: a profile name in ``sl.PROFILES``, a :class:`HardwareProfile`, or ``"cuda"`` (real clock).
        cost_shape: price experts as a named real model (``sl.COST_SHAPES``); results are labelled projected.
        eviction, prefetch, chunking, shared_slots: override the strategy's (for ablations).

    Attribute ``fault_hook`` (default None): a ``fn(layer, expert)`` that ``generate`` hands to each run's
    ExpertStore; it is called before every host→device copy and may raise to inject a failed copy (tests).
    """

    def __init__(self, model, tokenizer=None, strategy: "str | Strategy | Plan" = "specter", *,
                 expert_budget: "float | int | str | None" = None, cache_slots: int | None = None,
                 draft: "QuantSpec | DraftSpec | str | None" = None, k: "int | str | None" = None,
                 hardware: "str | HardwareProfile | None" = None, cost_shape: str | None = None,
                 eviction: str | None = None, prefetch: str | None = None,
                 chunking: "str | tuple[float, ...] | None" = None, shared_slots: bool | None = None,
                 record_routing: bool = True) -> None:
        self.info = inspect_model(model)  # raises on a dense model
        # The caller's own arguments first, before any planning/calibration work (strategy='auto').
        if k is not None and k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"k={k!r}: use an integer draft length >= 1 or 'auto'.")
        if eviction is not None:
            make_policy(eviction)
        if prefetch is not None and prefetch not in ("none", "gate", "draft", "oracle"):
            raise ValueError(f"prefetch={prefetch!r}: use 'none', 'gate', 'draft' or 'oracle'.")
        if chunking is not None and chunking not in ("adaptive", "budgeted") and not (
                isinstance(chunking, tuple) and chunking
                and all(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 <= f <= 1 for f in chunking)):
            raise ValueError(f"chunking={chunking!r}: use 'adaptive', 'budgeted' or a tuple of draft fractions in [0, 1].")
        self.plan = None
        from .planner import Plan

        if strategy == "auto" or isinstance(strategy, Plan):
            if cache_slots is not None:
                raise ValueError("strategy='auto' plans the slot split itself: give expert_budget=, not cache_slots=.")
            get_profile(hardware), get_cost_shape(cost_shape)  # fail before the calibration runs
            as_draft_spec(draft)
            if isinstance(expert_budget, str):
                parse_bytes(expert_budget)  # a malformed size, not "too small for every candidate"
            if isinstance(strategy, Plan):
                self.plan = strategy  # a plan made earlier with sl.plan(...)
            else:
                from .planner import plan as make_plan

                # The caller's draft / k pin the speculative candidates instead of being overridden afterwards.
                self.plan = make_plan(model, tokenizer, hardware, 0.5 if expert_budget is None else expert_budget,
                                      cost_shape=cost_shape, progress=False, draft=draft, k=k)
            chosen = self.plan.engine_kwargs()
            strategy = chosen.pop("strategy")
            draft, k = chosen.get("draft", draft), chosen.get("k", k)
        self.strategy = get_strategy(strategy).with_options(k=k, eviction=eviction, prefetch=prefetch,
                                                             chunking=chunking, shared_slots=shared_slots)
        self.draft_cfg = as_draft_spec(draft)
        profile = get_profile(hardware)  # raises on an unknown profile, or 'cuda' without CUDA
        self.use_cuda_clock = profile is None
        self.profile = profile or PROFILES["rtx4090-pcie4"]  # CUDA clock: profile only feeds planner estimates
        self.cost_shape = get_cost_shape(cost_shape)
        # On the CUDA clock bytes are the real ones (the model's dtype); simulated runs price the deployment dtype.
        wbytes = getattr(self.info.layers[0].experts, self.info.layers[0].param_names[0]).element_size() \
            if self.use_cuda_clock else 2.0
        self.cost: CostModel = build_cost_model(self.info, self.profile, self.cost_shape, weight_bytes=wbytes)
        self.model = model
        self.tokenizer = tokenizer
        self._budget_given = cache_slots is None
        self.split = self._resolve_budget(expert_budget, cache_slots)
        self.record_routing = record_routing
        self.fault_hook: Callable[[int, int], None] | None = None  # passed to each run's ExpertStore (tests)
        self._draft: DraftExperts | None = None
        # k="auto": the K governor, kept across generate() calls (set it to None to start its learning afresh).
        self.governor: KGovernor | None = None
        self._host = None  # host copies of the experts (pinned on CUDA), made once and kept across runs
        # The device the model computes on: where its non-expert weights live (experts may sit in host memory).
        self.device = (model.get_input_embeddings().weight.device if hasattr(model, "get_input_embeddings")
                       else next(model.parameters()).device)

    # ------------------------------------------------------------------ budget
    @property
    def draft_spec(self) -> QuantSpec:
        """The low-bit format of the draft's experts (quantized and hybrid variants)."""
        return self.draft_cfg.quant

    @property
    def draft_bytes(self) -> int:
        """Device bytes the draft keeps resident, out of the expert budget."""
        cfg = self.draft_cfg
        if not self.strategy.speculative or not cfg.uses_lowbit:
            return 0
        if cfg.variant == "hybrid":
            n = sum(min(cfg.hybrid_experts, l.num_experts) for l in self.info.layers)
        else:
            n = sum(l.num_experts for l in self.info.layers)
        return int(self.draft_expert_bytes * n)

    @property
    def draft_expert_bytes(self) -> float:
        """Packed bytes of one draft expert, priced like the fp ones (the cost shape's dims when projected, so a
        tiny model's group padding is not carried over to a real model's experts)."""
        shape = self.cost_shape
        if shape is None:
            return _draft_ratio(self.info, self.draft_spec) * 2 * self.cost.expert_params
        inter = shape.expert_params // (3 * shape.hidden)
        spec = self.draft_spec
        # gate/up rows run along hidden, down rows along the expert's intermediate width
        return spec.packed_bytes(2 * inter * shape.hidden, shape.hidden) + spec.packed_bytes(shape.hidden * inter, inter)

    def _resolve_budget(self, expert_budget, cache_slots) -> BudgetSplit:
        info, eb = self.info, self.cost.expert_bytes
        n_layers = info.num_layers
        full = eb * sum(l.num_experts for l in info.layers)
        draft = self.draft_bytes
        min_slots = 1
        if cache_slots is not None and expert_budget is not None:
            raise ValueError("give either expert_budget= or cache_slots=, not both.")
        if cache_slots is not None:
            if isinstance(cache_slots, bool) or not isinstance(cache_slots, int) or cache_slots < min_slots:
                raise ValueError(f"cache_slots={cache_slots!r}: strategy {self.strategy.name!r} needs at least "
                                 f"{min_slots} full-precision slot per layer; pass an integer >= {min_slots}.")
            slots = [min(cache_slots, l.num_experts) for l in info.layers]
            return BudgetSplit(draft + sum(slots) * eb, draft, slots, eb)
        if expert_budget is None:
            expert_budget = 0.5
        if isinstance(expert_budget, str):
            budget = parse_bytes(expert_budget)
        elif isinstance(expert_budget, bool) or not isinstance(expert_budget, (int, float)) or not math.isfinite(expert_budget):
            raise ValueError(f"expert_budget={expert_budget!r}: use a fraction in (0, 1], a byte count, or '2GiB'.")
        elif isinstance(expert_budget, float) and expert_budget <= 1.0:
            if expert_budget <= 0:
                raise ValueError(f"expert_budget={expert_budget!r}: a fraction must be in (0, 1].")
            budget = int(expert_budget * full)
        else:
            if expert_budget <= 1:
                raise ValueError(f"expert_budget={expert_budget!r}: a fraction must be in (0, 1]; a byte count > 1.")
            budget = int(expert_budget)
        per_layer = (budget - draft) // (n_layers * eb) if budget > draft else 0
        if per_layer < min_slots:
            need = draft + min_slots * n_layers * eb
            raise ValueError(
                f"expert_budget={expert_budget!r} ({budget:,} B) is too small for strategy {self.strategy.name!r}: "
                f"it needs the draft ({draft:,} B) plus {min_slots} full-precision slot per layer "
                f"({n_layers} × {eb:,} B), i.e. at least {need:,} B = {need / full:.3f} of the routed-expert bytes.")
        slots = [min(int(per_layer), l.num_experts) for l in info.layers]
        return BudgetSplit(budget, draft, slots, eb)

    # ------------------------------------------------------------------ draft
    @property
    def draft(self) -> DraftExperts:
        """The quantized draft experts (built on first use, then reused)."""
        if self._draft is None or self._draft.spec != self.draft_spec:
            shared = _DRAFTS.setdefault(self.model, {})
            key = (self.draft_spec, str(self.device))
            if key not in shared:
                shared[key] = DraftExperts(self.info, self.draft_spec, device=self.device)
            self._draft = shared[key]
        return self._draft

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
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r}: use an integer >= 1.")
        if do_sample and not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"temperature={temperature!r}: use a number > 0.")
        if do_sample and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
            raise ValueError(f"top_p={top_p!r}: use a number in (0, 1].")
        ids = self.encode(prompt)
        st = self.strategy
        cfg = self.draft_cfg
        draft = self.draft if st.speculative and cfg.uses_lowbit else None
        clock = CudaClock(self.device) if self.use_cuda_clock else SimClock(self.profile)
        trace = Trace(meta={
            "clock": clock.label, "simulated": clock.kind == "simulated", "profile": self.profile.name,
            "projected": self.cost.projected, "cost_shape": self.cost.shape_name, "strategy": st.name,
            "expert_bytes": self.cost.expert_bytes, "num_layers": self.info.num_layers,
            "num_experts": self.info.num_experts, "top_k": self.info.top_k, "k": st.k,
        }, record_routing=self.record_routing)
        if st.eviction == "forecast":
            policy = ForecastEviction()
        else:
            policy = make_policy(st.eviction)
        store = ExpertStore(self.info, self.split.slots_per_layer, clock, self.cost, policy, trace, self.device,
                            host=self._host)
        self._host = store.host
        store.fault_hook = self.fault_hook
        rt = OffloadRuntime(self.info, store, clock, self.cost, trace, draft=draft, draft_variant=cfg.variant,
                            gate_lookahead=st.prefetch == "gate", draft_expert_bytes=self.draft_expert_bytes)
        rt.hybrid_size = cfg.hybrid_experts if cfg.variant == "hybrid" else 0
        rt.keep_cache = st.keep
        eos = self.info.eos_token_ids
        dec = Decoder(self.model, rt, Sampling(do_sample, float(temperature), float(top_p), seed), eos,
                      max_new_tokens, callback)
        planner = governor = None
        if st.speculative:
            planner = LookaheadPlanner(store, self.cost, chunking=st.chunking, protect=st.protect,
                                       shared_slots=st.shared_slots and store.can_share())
            if st.k == "auto":
                # One governor per engine: what it learns about acceptance by depth and copy exposure carries
                # over from one generate() to the next (a 48-token run is mostly learning otherwise).
                if self.governor is None:
                    self.governor = KGovernor()
                governor = self.governor
                governor.new_sequence()
        if isinstance(policy, ForecastEviction):
            # Furthest forecast next use: the planner's live window forecast (none → recency).
            policy.next_use = lambda layer, e: rt.forecast.next_use(layer, e) if rt.forecast else math.inf
        prompt_t = torch.tensor([ids], dtype=torch.long)
        stopped = False
        with attached(self.model, self.info, rt), torch.no_grad():
            try:
                if st.speculative:
                    speculative(dec, prompt_t, st, planner if st.prefetch in ("draft", "oracle") else None, governor)
                else:
                    autoregressive(dec, prompt_t)
            except StopGeneration:
                stopped = True
            finally:
                # Copies still in flight on a CUDA copy stream must land before anything (an error handler, the
                # caching allocator) touches their buffers again. A no-op on the simulated clock.
                clock.synchronize()
        store.flush_unused_prefetches()
        trace.finalize(clock)
        metrics = compute_metrics(trace)
        metrics.update(self.split.as_dict())
        metrics.update({"strategy": "auto" if self.plan else st.name, "plan": self.plan.label if self.plan else None,
                        "profile": self.profile.name, "projected": self.cost.projected,
                        "cost_shape": self.cost.shape_name, "draft": cfg.label if st.speculative else None,
                        "k": st.k, "stopped": stopped})
        if draft is not None:
            metrics["draft_rel_error"] = draft.rel_error
        text = self.tokenizer.decode(dec.out, skip_special_tokens=False) if self.tokenizer is not None else None
        return GenerationResult(list(dec.out), text, metrics, trace, ids, metrics["strategy"],
                                config={"strategy": st, "split": self.split, "draft": cfg}, tokenizer=self.tokenizer)

    def __repr__(self) -> str:
        s = self.split
        return (f"Engine(strategy={self.strategy.name!r}, slots/layer={min(s.slots_per_layer)}, "
                f"draft={self.draft_cfg.label if self.strategy.speculative else None}, "
                f"budget={s.budget_bytes:,} B, clock={'cuda' if self.use_cuda_clock else self.profile.name})")
