"""One routed expert's forward on given weights, the grouping of a layer's routing by expert, and the weighted
sum of the experts' outputs: the same float operations, in the same shapes and order, as the experts
implementation transformers runs for the model (``config._experts_implementation``), so that an offloaded run
computes bit for bit what HF ``generate`` computes, in float32, bfloat16 and float16.

Written against transformers' experts interface (its layout flags), so they work for every family that uses it:
gate or not, transposed, biases, a custom ``_apply_gate``, a post-expert norm.

What each implementation does, and what is mirrored here (transformers 5.x, ``integrations/moe.py``):

=============  ============================================  =====================================================
implementation  per-expert matmuls                            weighted sum
=============  ============================================  =====================================================
``eager``       ``F.linear`` on the expert's token rows       ``index_add_`` per expert, ascending, in the hidden
                                                              dtype (one rounding per added expert)
``grouped_mm``  one grouped GEMM over the tokens sorted by    ``[T, k, H].sum(dim=1)``: top-k position order,
                expert (its kernel, or transformers' per-     accumulated in float32, rounded once
                group ``mm`` fallback): per expert, the same
                dispatcher with one group (on the CPU, where
                torch's grouped kernel is a ``mm`` per group,
                one ``mm``)
``batched_mm``  ``bmm`` over the (token, expert) pairs, one   as ``grouped_mm``
                matrix-vector product per pair; called per
                expert with the same batched shapes
=============  ============================================  =====================================================

The per-pair and per-group results do not depend on which other experts share the call, so the runtime can
compute each expert where and when its weights are and still sum exactly what HF sums. That is a property of the
kernels, so it is checked where the run happens: :func:`implementation_gap` compares HF's implementation with this
code on the run's device and dtype (random weights of the layer's shapes) and the runtime refuses a model where
they differ (``tests/test_lossless_bf16.py`` checks every implementation × dtype on the CPU). One exception is mirrored explicitly: on the CPU a ``bmm`` of batch 1 takes another
kernel (``mm``) than a batch of two or more, so a lone pair is computed in a batch of two when HF's call had more.

The hot path of every MoE layer, kept lean for a GPU where the host dispatches every op: the routing is read
back once (the scheduler needs it anyway); the token indices per expert are slices of one device-side sort, not
host→device copies; a one-token forward (decode, draft steps) needs no indices at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["expert_apply", "route_groups", "combine", "exact_forward", "Group", "EXACT_IMPLEMENTATIONS",
           "implementation_of", "implementation_gap"]

# transformers' experts implementations whose numerics the runtime reproduces
EXACT_IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")


def implementation_of(mod) -> str:
    """The experts implementation ``mod`` runs under in HF (what the runtime must reproduce): the one
    :func:`~specter_lab.model.dispatch.attached` saved while ``specter`` replaces it, else the config's."""
    saved = mod.__dict__.get("_specter_math")
    if saved:
        return saved
    name = getattr(getattr(mod, "config", None), "_experts_implementation", None)
    return "eager" if name in (None, "specter") else name


@dataclass
class Group:
    """One expert's share of a layer's routing: its token ``rows`` (None: the single token of a one-token
    forward) and the top-k positions ``kpos`` those tokens chose it at (an int for one token). ``pairs``: the
    (token, expert) pairs of the whole call (a batched implementation's batch)."""

    rows: torch.Tensor | None
    kpos: "torch.Tensor | int"
    n: int
    pairs: int = 0
    at: "torch.Tensor | slice | None" = None  # where these pairs sit in HF's [pairs, ...] layout (_activate)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.rows is None else x[self.rows]


_OFFS: dict[tuple[int, str], torch.Tensor] = {}


def _grouped(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``x [n, in] @ m [in, out]`` as transformers' grouped_mm runs it. On the CPU torch's grouped kernel is a
    ``mm`` per group (bit for bit, checked per dtype by :func:`implementation_gap`): one ``mm``. Elsewhere
    transformers' own dispatcher (the grouped kernel where the device has one, else its per-group ``mm``), with
    this expert as the only group."""
    if x.device.type == "cpu":
        return x @ m
    from transformers.integrations.moe import _grouped_mm

    key = (x.shape[0], str(x.device))
    offs = _OFFS.get(key)
    if offs is None:  # one small device tensor per row count, made once
        offs = _OFFS[key] = torch.tensor([x.shape[0]], dtype=torch.int32, device=x.device)
    return _grouped_mm(x, m.unsqueeze(0), offs=offs)


def _batched(x: torch.Tensor, m: torch.Tensor, transposed: bool, pairs: int) -> torch.Tensor:
    """``x [n, in]`` times one expert's matrix as transformers' batched_mm runs it: one ``bmm`` matrix-vector
    product per row. A single row of a call with more pairs goes in a batch of two (``bmm`` of batch 1 is ``mm``)."""
    n = x.shape[0]
    b = 2 if n == 1 and pairs > 1 else n
    xb = x.expand(b, -1) if b != n else x
    if transposed:  # [b, 1, in] @ [b, in, out]
        out = torch.bmm(xb.unsqueeze(1), m.expand(b, -1, -1)).squeeze(1)
    else:  # [b, out, in] @ [b, in, 1]
        out = torch.bmm(m.expand(b, -1, -1), xb.unsqueeze(-1)).squeeze(-1)
    return out[:n] if b != n else out


def _matmul(x: torch.Tensor, w: dict, name: str, transposed: bool, impl: str = "eager", pairs: int = 0
            ) -> torch.Tensor:
    m = w[name]
    if not isinstance(m, torch.Tensor):  # a packed low-bit weight with its own kernel (the draft)
        return m.packed_matmul(x)
    if impl == "batched_mm":
        return _batched(x, m, transposed, pairs)
    if impl == "grouped_mm":
        if transposed:
            return _grouped(x, m)
        mt = w.get(name + ".t")  # the cached transposed view; only without one a transpose op
        return _grouped(x, mt if mt is not None else m.t())
    if transposed:
        return x @ m
    mt = w.get(name + ".t")  # the slot's cached transposed view: one mm instead of linear's t + mm
    return x @ mt if mt is not None else F.linear(x, m)


def expert_apply(mod, x: torch.Tensor, w: dict, post_norm: bool = True, impl: str = "eager",
                 pairs: int = 0, at: "torch.Tensor | slice | None" = None) -> torch.Tensor:
    """One expert on tokens ``x [n, H]`` with weights ``w`` (slices of the fused tensors, or packed weights),
    with the matmuls of experts implementation ``impl`` (``pairs``: the call's (token, expert) pairs, which a
    batched implementation's shapes depend on; ``at``: where these pairs sit among them, see :func:`_activate`).
    ``post_norm=False`` leaves out a post-expert norm (the caller applies it where its weights are)."""
    up = "gate_up_proj" if mod.has_gate else "up_proj"
    h = _matmul(x, w, up, mod.is_transposed, impl, pairs)
    if w.get(up + "_bias") is not None:
        h = h + w[up + "_bias"]
    h = _activate(mod, h, at, pairs)
    out = _matmul(h, w, "down_proj", mod.is_transposed, impl, pairs)
    if w.get("down_proj_bias") is not None:
        out = out + w["down_proj_bias"]
    if post_norm and getattr(mod, "has_post_expert_norm", False):
        out = mod.post_expert_norm(out)
    return out


_GRAIN = 32768  # at::internal::GRAIN_SIZE: ATen splits an elementwise op across threads only above this


def _activate(mod, h: torch.Tensor, at, pairs: int) -> torch.Tensor:
    """The gate (or activation) on one expert's rows ``h``, rounded as HF's one call over all ``pairs`` rounds
    them. On the CPU with several threads an elementwise op over more than 32,768 elements (ATen's grain size)
    is split across threads at element offsets that fall inside rows, and the elements at each split's edge take
    the kernel's scalar path, whose ``exp`` rounds differently from the vectorised one. So where HF's call had
    more rows than this expert (``grouped_mm``, ``batched_mm``: one call over the layer's pairs), the rows are
    activated in a buffer of HF's shape at HF's row positions ``at``: the same split, the same paths. Elsewhere
    (one thread, a device, ``eager``'s per-expert calls) the expert's own rows are HF's call."""
    act = mod._apply_gate if mod.has_gate else mod.act_fn
    if (at is None or pairs <= h.shape[0] or h.device.type != "cpu" or torch.get_num_threads() == 1
            or pairs * h.shape[-1] <= _GRAIN):  # HF's call was not split either: the expert's rows round as its
        return act(h)
    buf = h.new_zeros(pairs, h.shape[-1])
    buf[at] = h
    return act(buf)[at]


def route_groups(idx: torch.Tensor, idx_np: np.ndarray, impl: str = "eager") -> dict[int, Group]:
    """expert → its :class:`Group`, experts ascending. ``idx_np`` is the host copy of the routing ``[T, k]``.

    Within an expert the rows keep the order ``impl`` gives them: a GEMM's rounding of a row can depend on where
    the row sits in the matrix (its micro-kernel tile, the rows each thread takes), so the rows must be where HF's
    call puts them. ``eager`` walks them in token order (a stable sort); ``grouped_mm`` in the order of its own
    ``torch.sort`` of the flat routing, which is not stable and, with several threads on the CPU, not token order:
    the same call on the same tensor gives the same permutation."""
    t, k = idx_np.shape
    if t == 1 and len(set(idx_np[0].tolist())) == k:  # one token, k distinct experts: no index tensors at all
        ranked = sorted(enumerate(idx_np[0].tolist()), key=lambda p: p[1])
        # HF's row of each pair: its rank among the sorted experts (grouped_mm), else its top-k position
        return {int(e): Group(None, r, 1, k, slice(rank, rank + 1) if impl == "grouped_mm" else slice(r, r + 1))
                for rank, (r, e) in enumerate(ranked) if e >= 0}
    flat = idx_np.reshape(-1)
    order = np.argsort(flat, kind="stable")
    cuts = np.flatnonzero(np.diff(flat[order])) + 1
    # Each expert's rows are a slice of one device-side sort (counts from the host copy, no index copies): the
    # stable sort for token order, or grouped_mm's own call, whose order within an expert only the device knows.
    flat_dev = idx.reshape(-1)
    dev_order = torch.sort(flat_dev).indices if impl == "grouped_mm" else torch.argsort(flat_dev, stable=True)
    rows_all, kpos_all = dev_order // k, dev_order % k
    groups: dict[int, Group] = {}
    for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [flat.size]])):
        e = int(flat[order[a]])
        if e >= 0:
            # HF's rows of these pairs: a block of its sorted order (grouped_mm), else the pairs' flat indices
            at = slice(int(a), int(b)) if impl == "grouped_mm" else dev_order[a:b]
            groups[e] = Group(rows_all[a:b], kpos_all[a:b], int(b - a), int(flat.size), at)
    return groups


def combine(x: torch.Tensor, outs: dict[int, torch.Tensor], groups: dict[int, Group], w: torch.Tensor,
            impl: str = "eager") -> torch.Tensor:
    """Σ_e weight · output_e over the experts in ``outs``, as implementation ``impl`` sums them: ``eager`` adds
    the experts in ascending order in the hidden dtype; ``grouped_mm`` / ``batched_mm`` sum each token's top-k
    products in top-k order, in float32, rounding once."""
    if impl in ("grouped_mm", "batched_mm"):
        return _sum_over_topk(x, outs, groups, w)
    if not outs:
        return torch.zeros_like(x)
    if all(g.rows is None for g in groups.values()):  # one token: a running sum, as HF's loop adds them
        total = None
        for e in sorted(outs):
            p = groups[e].kpos
            c = (outs[e] * w[:, p:p + 1]).to(x.dtype)
            total = c if total is None else total + c
        return total
    final = torch.zeros_like(x)
    for e in sorted(outs):
        g = groups[e]
        final.index_add_(0, g.rows, (outs[e] * w[g.rows, g.kpos, None]).to(final.dtype))
    return final


def _sum_over_topk(x: torch.Tensor, outs: dict[int, torch.Tensor], groups: dict[int, Group],
                   w: torch.Tensor) -> torch.Tensor:
    """transformers' ``weighted_out.view(T, k, H).sum(dim=1)``: the products laid out [T, k, H] (contiguous, as
    HF's are after undoing its sort) and reduced by the same op. Pairs with no output (a draft's skipped
    expert, an EP sentinel) stay zero."""
    t, k = w.shape
    if not outs:
        return torch.zeros_like(x)
    # Each product is one elementwise multiply, so the products of all pairs in one op are the per-pair products,
    # bit for bit: one op per layer instead of a few per expert (the launch count a GPU pays).
    if t == 1 and len(outs) == k and all(g.rows is None for g in groups.values()):
        # one token, every expert computed: its k products in top-k order are the [1, k, H] tensor itself
        by_pos = sorted(outs, key=lambda e: groups[e].kpos)
        prods = torch.cat([outs[e] for e in by_pos]) * w.reshape(k, 1)
        return prods.view(1, k, -1).sum(dim=1).to(x.dtype)
    dtype = torch.result_type(next(iter(outs.values())), w)  # HF: proj_out * sample_weights (promoted)
    weighted = torch.zeros(t, k, x.shape[-1], dtype=dtype, device=x.device)
    if all(groups[e].rows is not None for e in outs):  # every pair's product in one op, scattered once
        rows = torch.cat([groups[e].rows for e in outs])
        kpos = torch.cat([groups[e].kpos for e in outs])
        weighted[rows, kpos] = torch.cat(list(outs.values())) * w[rows, kpos, None]
        return weighted.sum(dim=1).to(x.dtype)
    for e, o in outs.items():
        g = groups[e]
        if g.rows is None:
            weighted[0, g.kpos] = (o * w[:, g.kpos:g.kpos + 1])[0]  # [1, 1] weight: the same promotion as HF's
        else:
            weighted[g.rows, g.kpos] = o * w[g.rows, g.kpos, None]
    return weighted.sum(dim=1).to(x.dtype)


def exact_forward(mod, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, weights_of,
                  idx_np: np.ndarray | None = None, impl: str | None = None) -> torch.Tensor:
    """A whole layer's experts with no store and no clock: ``weights_of(e)`` gives expert e's weights (a host
    copy, a fused slice, low-bit copies). What the oracle's look, the fidelity probe and op counting run.
    ``impl``: whose numerics (default: the module's own implementation, :func:`implementation_of`)."""
    impl = implementation_of(mod) if impl is None else impl
    idx_np = idx.detach().cpu().numpy() if idx_np is None else idx_np
    groups = route_groups(idx, idx_np, impl)
    outs = {e: expert_apply(mod, g.take(x), weights_of(e), impl=impl, pairs=g.pairs, at=g.at)
            for e, g in groups.items()}
    return combine(x, outs, groups, w, impl)


class _Stand:
    """``mod`` with other expert weights: what HF's implementation function runs on in :func:`implementation_gap`
    (everything but the weights and the expert count is the module's own: gate, activation, norm, flags)."""

    def __init__(self, mod, weights: dict[str, torch.Tensor]) -> None:
        self.__dict__.update(weights)
        self.__dict__["_mod"] = mod
        self.num_experts = next(iter(weights.values())).shape[0]
        self._is_expert_parallel = False

    def __getattr__(self, name):
        return getattr(self.__dict__["_mod"], name)


_GAPS: dict[tuple, float] = {}


def implementation_gap(mod, impl: str, param_names, top_k: int, device, dtype: torch.dtype) -> float:
    """Largest difference between transformers' ``impl`` and this module's math (:func:`exact_forward`) on
    ``device`` in ``dtype``, for random weights of ``mod``'s expert shapes (top-k + 2 experts), one decoding
    token and passes of 5 and 33 tokens: the per-expert calls and the sum must give what HF's one call gives. 0.0:
    bit for bit on this device. Cached per module class, shapes, device, dtype and (on the CPU) thread count."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    shapes = tuple((n, tuple(getattr(mod, n).shape[1:])) for n in param_names)
    n_exp = min(getattr(mod, param_names[0]).shape[0], top_k + 2)  # few experts: real-size shapes stay cheap
    # the thread count is part of the key: on the CPU a GEMM's split across threads changes its rounding
    threads = torch.get_num_threads() if torch.device(device).type == "cpu" else 0
    key = (type(mod), impl, shapes, n_exp, top_k, str(device), dtype, threads)
    if key in _GAPS:
        return _GAPS[key]
    fn = type(mod).forward.__wrapped__ if impl == "eager" else ALL_EXPERTS_FUNCTIONS[impl]
    g = torch.Generator().manual_seed(0)
    weights = {n: (torch.randn((n_exp,) + s, generator=g, dtype=dtype)
                   * (0.02 if n.endswith("_bias") else s[-1] ** -0.5)).to(device) for n, s in shapes}
    stand = _Stand(mod, weights)
    hidden = getattr(mod, param_names[0]).shape[1 if mod.is_transposed else -1]
    gap = 0.0
    with torch.no_grad():
        for t in (1, 5, 33):
            x = torch.randn(t, hidden, generator=g).to(device, dtype)
            idx = torch.stack([torch.randperm(n_exp, generator=g)[:top_k] for _ in range(t)]).to(device)
            w = torch.softmax(torch.randn(t, top_k, generator=g), -1).to(device, dtype)
            ref = fn(stand, x, idx, w)
            ours = exact_forward(stand, x, idx, w, lambda e: {n: v[e] for n, v in weights.items()}, impl=impl)
            gap = max(gap, (ours.float() - ref.float()).abs().max().item())
    _GAPS[key] = gap
    return gap
