"""Counting the aten ops a decode step dispatches, per layer kind: what eager PyTorch's host time is priced from.

Batch-1 decoding in eager PyTorch is bound by the host: every aten op costs microseconds of Python, dispatcher
and launch work on the CPU, whatever its size. The simulated clock prices that as *ops × a per-op host cost*
(:attr:`HardwareProfile.host_op_cost`). The ops are counted, not assumed: a ``TorchDispatchMode`` sees every aten
op a forward dispatches, and forward hooks on the decoder layers and their experts module say which part of the
model each op belongs to. The counts depend on the family (attention kind, shared experts, dense first layers)
and on the experts implementation, not on the width, so a tiny random model of the same family gives them; they
are counted once per (family, implementation, top-k) and cached for the process.

Implementations counted: transformers' own (``eager``, ``grouped_mm``, ``batched_mm``: the HF decode loop, as
``generate`` runs it), ``specter`` (this package's runtime: HF's attention and router, then the runtime's own
per-expert code, :func:`~specter_lab.model.experts.expert_apply` and ``combine``, counted as it runs) and
``mixtral_offloading`` (the DeepSeek dispatch Specter's artifact runs its Mixtral-Offloading baseline with).

Host synchronisations are counted beside the ops: every op that makes the host wait for the device on CUDA
(``.item()`` / a tensor's truth value, ``nonzero`` and ``torch.where(mask)``, and a read-back to the host:
``.cpu()``, ``.numpy()``, ``.tolist()``), so the cost model can price each one (it breaks host/device overlap).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Callable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps", "CountSyncs", "SYNCS", "OpCounts", "RegionCount", "count_ops", "count_model", "counting_model", "op_counts", "IMPLEMENTATIONS", "FAMILIES"]

IMPLEMENTATIONS = ("eager", "grouped_mm", "grouped_mm_fallback", "batched_mm", "deepseek_remote", "specter",
                   "mixtral_offloading")

# Matmul-like ops: one kernel each even when compiled (pointwise work around them fuses).
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "matmul", "linear", "_weight_int4pack_mm",
            "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention"}


@dataclass
class RegionCount:
    """aten ops seen in one region: all of them, those that launch a kernel (views and metadata ops don't) and
    the matmul-like ones (what is left as separate kernels once pointwise work is fused)."""

    ops: int = 0
    kernels: int = 0
    matmuls: int = 0
    syncs: int = 0  # host synchronisations the code asked for (:class:`_CountSyncsInto`)

    def add(self, func) -> None:
        self.ops += 1
        name = func.__name__.split(".")[0]
        if not getattr(func, "is_view", False) and name not in ("detach", "alias", "lift_fresh"):
            self.kernels += 1
        self.matmuls += name in _MATMULS


# The calls that make the host wait for the device: a read-back of a value, or of a whole tensor.
SYNCS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.__bool__, torch.Tensor.__int__,
         torch.Tensor.__float__, torch.Tensor.__index__}


class CountSyncs(TorchFunctionMode):
    """Counts the host synchronisations (:data:`SYNCS`) made while active. On the CPU they cost nothing, but the
    engine's code does not branch on the device there, so the count is the CUDA path's too."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += func in SYNCS
        return func(*args, **(kwargs or {}))


class CountOps(TorchDispatchMode):
    """Counts every aten op dispatched while active, per region (``push``/``pop`` a region name; ops outside any
    region count as ``"head"``: embeddings, final norm, LM head and the decode loop's own per-step work)."""

    def __init__(self) -> None:
        super().__init__()
        self.regions: dict[str, RegionCount] = {}
        self.funcs: Counter = Counter()
        self._stack: list[str] = []

    def push(self, name: str) -> None:
        self._stack.append(name)

    def pop(self) -> None:
        self._stack.pop()

    @property
    def total(self) -> int:
        return sum(r.ops for r in self.regions.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        region = self._stack[-1] if self._stack else "head"
        self.regions.setdefault(region, RegionCount()).add(func)
        self.funcs[func] += 1
        return func(*args, **(kwargs or {}))

    def sync(self) -> None:
        """One host synchronisation, counted in the current region."""
        region = self._stack[-1] if self._stack else "head"
        self.regions.setdefault(region, RegionCount()).syncs += 1


_NONZERO = {torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere}


class _CountSyncsInto(TorchFunctionMode):
    """Counts the syncs the code asks for into a :class:`CountOps`' regions: :data:`SYNCS` and the ops whose
    output size depends on the data (``nonzero``, one-argument ``torch.where``). Counted at the Python level,
    where the model's code calls them: the aten ops under them differ between CPU and CUDA (on the CPU
    ``one_hot`` checks its range with two read-backs that CUDA skips)."""

    def __init__(self, ops: CountOps) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SYNCS or func in _NONZERO or (func is torch.where and len(args) == 1 and not kwargs):
            self.ops.sync()
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class OpCounts:
    """aten ops of one decode token (T=1 forward + the decode loop's step), per layer kind, for one family and
    experts implementation. ``(ops, kernels, matmuls)`` triples; ``per_expert`` is the slope of the experts block
    in the number of experts computed, ``experts_fixed`` the rest of it (routing readback, sort, sum)."""

    family: str
    implementation: str
    moe_layer: tuple[float, float, float]  # per MoE layer, outside the routed experts: attention, norms, router, shared
    experts_fixed: tuple[float, float, float]  # per MoE layer, experts block, independent of experts hit
    per_expert: tuple[float, float, float]  # per routed expert computed
    dense_layer: tuple[float, float, float]  # per dense (non-MoE) decoder layer
    head: tuple[float, float, float]  # per forward: embeddings, final norm, LM head, decode loop step
    top_k: int  # experts per token in the counted model
    # host synchronisations per part, same keys as the triples: moe_layer, experts_fixed, per_expert,
    # dense_layer, head
    syncs: dict = field(default_factory=dict)

    def experts_block(self, n_experts: float) -> tuple[float, float, float]:
        return tuple(f + n_experts * p for f, p in zip(self.experts_fixed, self.per_expert))

    def per_token(self, moe_layers: int, dense_layers: int) -> dict[str, float]:
        """Total (ops, kernels, matmuls) of one decode token of a model with that depth, top_k experts a layer."""
        parts = [self.head, *[self.dense_layer] * dense_layers,
                 *[tuple(a + b for a, b in zip(self.moe_layer, self.experts_block(self.top_k)))] * moe_layers]
        return {k: sum(p[i] for p in parts) for i, k in enumerate(("ops", "kernels", "matmuls"))}

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------- tiny models
FAMILIES = ("qwen2_moe", "deepseek_v2")


def _tiny_config(family: str, top_k: int, n_experts: int, layers: int, dense_first: int):
    """A tiny config of the family with the real routing arity (top-k, experts) and structure (shared experts,
    MLA attention, dense first layers); width is irrelevant to op counts."""
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, max_position_embeddings=256,
                  pad_token_id=0, eos_token_id=1, bos_token_id=2, num_hidden_layers=layers)
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(**common, num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
                                 num_experts=n_experts, num_experts_per_tok=top_k, shared_expert_intermediate_size=32,
                                 decoder_sparse_step=1)
    if family == "deepseek_v2":
        # DeepSeek-V2-Lite: no q LoRA, kv LoRA + decoupled rope, 2 shared experts, first layer dense, greedy top-k
        return tf.DeepseekV2Config(**common, num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
                                   n_routed_experts=n_experts, num_experts_per_tok=top_k, n_shared_experts=2,
                                   first_k_dense_replace=dense_first, q_lora_rank=None, kv_lora_rank=16,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, topk_method="greedy",
                                   n_group=1, topk_group=1)
    raise ValueError(f"family={family!r}: op counts are available for {list(FAMILIES)}.")


def counting_model(family: str, top_k: int, n_experts: int, layers: int, dense_first: int = 0) -> nn.Module:
    """A tiny random model of ``family`` with the real routing arity and depth (for counting ops)."""
    return _tiny_model(family, top_k, n_experts, layers, dense_first)


def _tiny_model(family: str, top_k: int, n_experts: int, layers: int, dense_first: int) -> nn.Module:
    import transformers as tf

    cfg = _tiny_config(family, top_k, n_experts, layers, dense_first)
    torch.manual_seed(0)
    cls = {"qwen2_moe": tf.Qwen2MoeForCausalLM, "deepseek_v2": tf.DeepseekV2ForCausalLM}[family]
    return cls(cfg).eval()


# ---------------------------------------------------------------------------------------------------- counting
@contextlib.contextmanager
def _regions(model: nn.Module, mode: CountOps) -> Iterator[None]:
    """Forward hooks that put each op in its region: decoder layers (moe_layer / dense_layer) and experts."""
    from ..model.inspect import inspect_model

    info = inspect_model(model)
    moe_decoder = {l.decoder_index for l in info.layers}
    handles = []

    def enter(name: str) -> Callable:
        return lambda *_a, **_k: mode.push(name)

    def leave(*_a, **_k) -> None:
        mode.pop()

    for j, layer in enumerate(info.decoder_layers or []):
        kind = "moe_layer" if j in moe_decoder else "dense_layer"
        handles += [layer.register_forward_pre_hook(enter(kind)), layer.register_forward_hook(leave)]
    for l in info.layers:
        handles += [l.experts.register_forward_pre_hook(enter("experts")), l.experts.register_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _specter_experts(self, hidden_states, top_k_index, top_k_weights):
    """The runtime's own per-expert code on resident weights (no clock, no store): what a target forward with
    every expert resident dispatches. The routing readback is the runtime's (one host copy per layer)."""
    from ..model.experts import exact_forward

    return exact_forward(self, hidden_states, top_k_index, top_k_weights, lambda e: self._slot_views[e])


def _slot_views(experts: nn.Module) -> list[dict]:
    """Per expert, the weights a device slot hands the runtime: slices of the fused tensors plus the cached
    transposed views of the matmul weights (the store builds them once per slot, so no ``t`` op per call)."""
    names = [n for n in ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias",
                         "down_proj_bias") if isinstance(getattr(experts, n, None), torch.Tensor)]
    views = []
    for e in range(getattr(experts, names[0]).shape[0]):
        w = {n: getattr(experts, n)[e] for n in names}
        if not experts.is_transposed:
            w.update({n + ".t": w[n].t() for n in names if not n.endswith("_bias")})
        views.append(w)
    return views


def _remote_moe_infer(self, x, topk_ids, topk_weight):
    """Ops-equivalent replica of the experts block of DeepSeek-V2's original remote code
    (``modeling_deepseek.py``, ``DeepseekV2MoE.moe_infer``), written here for counting only: one count + sort,
    a host readback of tokens per expert, a Python loop over the experts that got tokens, each a
    ``DeepseekV2MLP`` (gate, up, down ``nn.Linear``, SiLU · mul), then one scatter and a weighted sum."""
    import torch.nn.functional as F

    cnts = topk_ids.new_zeros((topk_ids.shape[0], self.num_experts))
    cnts.scatter_(1, topk_ids, 1)
    tokens_per_expert = cnts.sum(dim=0)
    idxs = topk_ids.view(-1).argsort()
    sorted_tokens = x[idxs // topk_ids.shape[1]]
    tokens_per_expert = tokens_per_expert.cpu().numpy()
    outputs, start = [], 0
    for i, n in enumerate(tokens_per_expert):
        end = start + n
        if n == 0:
            continue
        gate_w, up_w, down_w = self._remote_weights[i]  # separate nn.Linear weights there: no view op per call
        t = sorted_tokens[start:end]
        outputs.append(F.linear(self.act_fn(F.linear(t, gate_w)) * F.linear(t, up_w), down_w))
        start = end
    outs = torch.cat(outputs, dim=0)
    new_x = torch.empty_like(outs)
    new_x[idxs] = outs
    return (new_x.view(*topk_ids.shape, -1).type(topk_weight.dtype).mul_(topk_weight.unsqueeze(dim=-1))
            .sum(dim=1).type(new_x.dtype))


def _mixtral_offloading_experts(self, hidden_states, top_k_index, top_k_weights):
    """Ops-equivalent replica of the DeepSeek dispatch Specter's artifact runs Mixtral-Offloading with
    (``baselines/mixtral_offloading/legacy_dispatch.py@c0325dc``, the author's ``SparseMoeWrapperDeepseekv2``),
    written here for counting only: a one-hot mask, a ``nonzero`` over it, then per hit expert ``.item()`` and
    ``torch.where(mask)``; the cache's ``load_experts`` takes each id by ``.item()`` again; each expert is an
    unfused MLP (gate, up, down linears, act · mul) scaled by its routing weight and ``index_add_``-ed."""
    import torch.nn.functional as F

    final = torch.zeros_like(hidden_states)
    mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    where = {}
    for idx in hit:
        e = idx.item()
        where[e] = torch.where(mask[e].squeeze(0))
    for e in [i.item() for i in hit]:  # load_experts(*((layer, e.item()) for e in hit), unordered=True)
        pos, rows = where[e]
        x = hidden_states[None, rows].reshape(-1, hidden_states.shape[-1])
        gate_w, up_w, down_w = self._remote_weights[e]
        out = F.linear(self.act_fn(F.linear(x, gate_w)) * F.linear(x, up_w), down_w) * top_k_weights[rows, pos, None]
        final.index_add_(0, rows, out.to(hidden_states.dtype))
    return final


def _set_implementation(model: nn.Module, implementation: str) -> None:
    """Select the experts implementation to count. ``grouped_mm_fallback`` is transformers' grouped_mm on a GPU
    where ``torch._grouped_mm`` is unavailable (e.g. an A100 with torch <= 2.8: one ``.tolist()`` of the offsets,
    then a ``mm`` per active expert); ``deepseek_remote`` the replica above; ``specter`` the runtime's code."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is unknown; use one of {list(IMPLEMENTATIONS)}.")
    from transformers.integrations import moe

    custom = {"specter": _specter_experts, "deepseek_remote": _remote_moe_infer,
              "mixtral_offloading": _mixtral_offloading_experts}
    if implementation in custom:
        moe.ExpertsInterface.register(f"{implementation}_count", custom[implementation])
        model.set_experts_implementation(f"{implementation}_count")
        if implementation == "specter":
            from ..model.inspect import inspect_model

            for l in inspect_model(model).layers:
                l.experts._slot_views = _slot_views(l.experts)
        if implementation in ("deepseek_remote", "mixtral_offloading"):
            from ..model.inspect import inspect_model

            for l in inspect_model(model).layers:
                e = l.experts
                inter = e.down_proj.shape[-1]
                e._remote_weights = [(e.gate_up_proj[i, :inter], e.gate_up_proj[i, inter:], e.down_proj[i])
                                     for i in range(e.gate_up_proj.shape[0])]
    else:
        model.set_experts_implementation("grouped_mm" if implementation == "grouped_mm_fallback" else implementation)


@contextlib.contextmanager
def _grouped_mm_path(implementation: str) -> Iterator[None]:
    """Force transformers' grouped_mm fallback (the path of a GPU without torch._grouped_mm) while counting."""
    if implementation != "grouped_mm_fallback":
        yield
        return
    from transformers.integrations import moe

    # The fallback is registered as one custom op (its inner ops would be invisible to the counter): call its
    # Python body directly, so the per-expert mm calls are counted as the host dispatches them.
    before = moe._grouped_mm
    moe._grouped_mm = lambda input, weight, offs: moe._grouped_mm_fallback(input.to(weight.dtype), weight, offs)
    try:
        yield
    finally:
        moe._grouped_mm = before


def _decode_counts(model: nn.Module, new_tokens: int = 4) -> dict[str, RegionCount]:
    """Ops per decode token by region: HF ``generate`` for n and n + new_tokens tokens, differenced (the prefill
    and the first step cancel), divided by new_tokens."""
    ids = torch.tensor([[5, 6, 7, 8]])
    runs = []
    for n in (2, 2 + new_tokens):
        mode = CountOps()
        with torch.no_grad(), _regions(model, mode), mode, _CountSyncsInto(mode):
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        runs.append(mode.regions)
    out = {}
    for name in set(runs[0]) | set(runs[1]):
        a, b = runs[0].get(name, RegionCount()), runs[1].get(name, RegionCount())
        out[name] = RegionCount(*[(getattr(b, f) - getattr(a, f)) / new_tokens
                                  for f in ("ops", "kernels", "matmuls", "syncs")])
    return out


def _triple(r: RegionCount | None, per: float = 1.0) -> tuple[float, float, float]:
    r = r or RegionCount()
    return (r.ops / per, r.kernels / per, r.matmuls / per)


def count_model(model: nn.Module, implementation: str = "eager") -> dict[str, RegionCount]:
    """Ops per decode token of ``model`` by region (head / moe_layer / dense_layer / experts, summed over
    layers), running ``implementation``: a whole model, any depth, counted as HF ``generate`` runs it."""
    _set_implementation(model, implementation)
    with _grouped_mm_path(implementation):
        return _decode_counts(model)


def count_ops(family: str, implementation: str = "eager", top_k: int = 4, n_experts: int = 16) -> OpCounts:
    """Count one decode token's aten ops per layer kind on tiny models of ``family`` (two MoE layers and, for a
    family with dense first layers, one dense layer). The experts block is counted at top_k and at top_k ∓ 2
    experts per token, giving its slope per expert and its fixed part."""
    dense_first = 1 if family == "deepseek_v2" else 0
    other = top_k - 2 if top_k > 2 else top_k + 2
    counted = {}
    for k in (top_k, other):
        model = _tiny_model(family, k, max(n_experts, top_k, other), layers=2 + dense_first, dense_first=dense_first)
        counted[k] = count_model(model, implementation)
    hi, lo = counted[top_k], counted[other]
    ex_hi, ex_lo = _triple(hi.get("experts"), 2), _triple(lo.get("experts"), 2)
    per_expert = tuple(max(0.0, (a - b) / (top_k - other)) for a, b in zip(ex_hi, ex_lo))
    fixed = tuple(max(0.0, a - top_k * p) for a, p in zip(ex_hi, per_expert))
    sy = lambda counted, region, per=1.0: (counted.get(region) or RegionCount()).syncs / per
    sync_slope = max(0.0, (sy(hi, "experts", 2) - sy(lo, "experts", 2)) / (top_k - other))
    syncs = {"moe_layer": sy(hi, "moe_layer", 2), "per_expert": sync_slope,
             "experts_fixed": max(0.0, sy(hi, "experts", 2) - top_k * sync_slope),
             "dense_layer": sy(hi, "dense_layer", max(1, dense_first)), "head": sy(hi, "head")}
    return OpCounts(family, implementation, moe_layer=_triple(hi.get("moe_layer"), 2), experts_fixed=fixed,
                    per_expert=per_expert, dense_layer=_triple(hi.get("dense_layer"), max(1, dense_first)),
                    head=_triple(hi.get("head")), top_k=top_k, syncs=syncs)


@lru_cache(maxsize=None)
def op_counts(family: str, implementation: str = "specter", top_k: int = 4) -> OpCounts:
    """:func:`count_ops`, counted once per process (a tiny model's few decode steps: well under a second)."""
    return count_ops(_family_of(family), implementation, top_k)


def _family_of(model_type: str) -> str:
    """The counted family that stands for a model type: DeepSeek-V3-like MLA models count as deepseek_v2, every
    other (GQA attention + routed experts) family as qwen2_moe."""
    if model_type in FAMILIES:
        return model_type
    return "deepseek_v2" if model_type.startswith("deepseek") else "qwen2_moe"
