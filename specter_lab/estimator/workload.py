"""What an estimate replays: a routing trace at the target model's geometry, with a modelled draft and a modelled
next-layer router, so every strategy row can be replayed on it.

* **Routing**: synthetic, matched to the family's published locality (:mod:`specter_lab.traces.synthetic`), or a
  recorded trace (``trace=``: a :class:`~specter_lab.traces.trace_file.RoutingTrace`, its path, or an array of
  expert ids ``[tokens, MoE layers, top_k]``). A prompt of ``PROMPT`` tokens is one prefill forward (it warms the
  caches, as a prompt does), then ``TOKENS`` decode forwards are priced.
* **The draft** (speculative rows): modelled as :func:`specter_lab.traces.importing.import_routing` models it:
  forecast recall and per-token acceptance measured at the draft's bits on the bundled model
  (:data:`~specter_lab.traces.importing.MEASURED_DRAFT`), the widest RTN-g64 draft of 4, 3 or 2 bits narrower than
  the experts that fits beside one full-precision slot per layer. MODELLED, and said so.
* **The next layer's router** (pre-gated rows): modelled with the bundled model's measured gate recall
  (:data:`~specter_lab.traces.importing.MEASURED_GATE_RECALL`). MODELLED, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.geometry import ModelGeometry
from ..traces.importing import MEASURED_DRAFT, MEASURED_GATE_RECALL, import_routing
from ..traces.synthetic import locality_for, synthetic_routing
from ..traces.trace_file import RoutingTrace, load_trace

__all__ = ["Workload", "workload", "draft_bits", "PROMPT", "TOKENS", "K_MAX"]

PROMPT, TOKENS = 64, 256  # the prompt that warms the caches (one prefill forward), and the decode tokens priced
K_MAX = 16  # draft chains as long as the K governor drafts


@dataclass(frozen=True)
class Workload:
    """The trace an estimate replays and what it says about itself."""

    trace: RoutingTrace
    label: str  # where the routing came from
    draft_bits: int | None  # the modelled draft's bits (None: no draft fits, or the trace has none)


def draft_bits(geom: ModelGeometry, expert_bits: float, experts_budget: float, expert_bytes: float) -> int | None:
    """The widest measured draft (4, 3 or 2 bits + 0.25 for the group-64 scales) narrower than the experts that fits
    beside one full-precision slot per layer of ``experts_budget`` bytes; None when none does."""
    for bits in (4, 3, 2):
        size = geom.routed_params * (bits + 0.25) / 8
        if bits + 0.25 < expert_bits and experts_budget - size >= geom.moe_layers * expert_bytes:
            return bits
    return None


def workload(geom: ModelGeometry, config: dict, bits: int | None, trace=None, seed: int = 0,
             prompt: int = PROMPT, tokens: int = TOKENS) -> Workload:
    """The trace to replay for ``geom``'s model (``config``: its config.json as a dict), with a modelled draft of
    ``bits`` (None: no draft chains). ``trace``: a recorded trace (or its path) replayed as recorded, or an array of
    expert ids imported as one prompt of ``prompt`` rows then decode; None: synthetic routing."""
    if isinstance(trace, (str, Path)):
        trace = load_trace(trace)
    if isinstance(trace, RoutingTrace):
        _check_geometry(trace, geom)
        label = f"recorded routing trace ({trace.source or trace.config.get('model_type', '?')}, {trace.tokens} tokens)"
        d = trace.draft or {}
        return Workload(trace, label, d.get("bits"))
    if trace is None:
        loc = locality_for(geom.model_type)
        ids = synthetic_routing(geom.moe_layers, geom.num_experts, geom.top_k, prompt + tokens, loc, seed)
        label = loc.label
    else:
        ids = np.asarray(trace)
        want = (geom.moe_layers, geom.top_k)
        if ids.ndim != 3 or ids.shape[1:] != want or ids.shape[0] <= prompt + 1:
            raise ValueError(f"trace: expected expert ids shaped [tokens > {prompt + 1}, {want[0]} MoE layers, "
                             f"top-{want[1]}] for {geom.name}, got {tuple(ids.shape)}. Record it on this model, or "
                             "pass trace=None.")
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= geom.num_experts:
            raise ValueError(f"trace: expert ids must be integers in [0, {geom.num_experts}) for {geom.name}.")
        label = f"an imported routing array ({len(ids)} tokens)"
    segments = [(0, prompt, "prefill"), (prompt, len(ids) - prompt, "decode")]
    fidelity = MEASURED_DRAFT[bits] if bits else None
    imported = import_routing(ids.astype(np.int64), config, segments, k_max=K_MAX if bits else 0,
                              draft_bits=bits or 4, seed=seed, gate_recall=MEASURED_GATE_RECALL,
                              **({"recall": fidelity.recall, "acceptance": fidelity.acceptance} if fidelity else {}))
    return Workload(imported, label, bits)


def _check_geometry(trace: RoutingTrace, geom: ModelGeometry) -> None:
    if trace.num_layers != geom.moe_layers or trace.top_k != geom.top_k:
        raise ValueError(f"trace: {trace.num_layers} MoE layers top-{trace.top_k}, but {geom.name} has "
                         f"{geom.moe_layers} top-{geom.top_k}: record it on this model, or pass trace=None.")
