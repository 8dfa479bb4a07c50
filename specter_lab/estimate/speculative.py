"""Speculative strategies from a config alone, with the modelled draft the routing import uses: labelled modelled.

A speculative strategy keeps a low-bit copy of every routed expert on the GPU as its draft (RTN, group 64: 4, 3 or
2 bits + 0.25 for the scales, the widest that fits and is narrower than the experts; the draft shares the target's
dense weights) and fills what VRAM is left with full-precision
expert slots (a per-layer LRU). A window drafts ``K`` tokens with the resident draft, then verifies ``K + 1``
tokens in one target forward, which reads each expert the window routes once (the union over the window).

* ``spec_lru``: a miss of the union is copied when the verify forward needs it;
* ``specter``: the draft's forecast names a miss with probability ``recall``; those are copied while the draft
  runs (hidden behind the ``K`` draft forwards), the rest on demand;
* ``specter_host``: forecast misses the window routes at least twice are prefetched as in ``specter``; the rest
  are computed on the host CPU during verification.

Tokens per window = 1 + sum_{i=1..K} acceptance^i (each draft position accepted independently, the target's own
token at the first rejection). ``recall`` and ``acceptance`` are the draft fidelity measured at the draft's bits on
the bundled model (:data:`specter_lab.traces.importing.MEASURED_DRAFT`): a small model whose draft is unusually
faithful, so the band spans ``ACCEPTANCE_RANGE`` (an assumption). Everything here is modelled, not measured;
``sl.plan`` measures these strategies on a loaded model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from ..model.geometry import ModelGeometry
from ..pricing.precision import WeightFormat, WeightPrecision
from ..traces.importing import MEASURED_DRAFT
from .bands import Scenario
from .budget import VramBudget
from .pricing import TokenTime, price_token
from .replay import Counts

__all__ = ["SPECULATIVE", "DraftModel", "draft_model", "speculative_rows", "ACCEPTANCE_RANGE", "K"]

SPECULATIVE = ("spec_lru", "specter", "specter_host")
K = 8  # the strategies' default draft length
ACCEPTANCE_RANGE = (0.60, 0.95)  # assumption: larger models' drafts are less faithful than the bundled model's
_DRAFT_FORMAT = WeightFormat("int4_g64", 4.25, 0.619, "RTN, group 64 (a 16-bit scale per 64 weights); efficiency "
                             "assumed as q4_0")


@dataclass(frozen=True)
class DraftModel:
    """The modelled draft: its fidelity and what it costs in VRAM."""

    recall: float
    acceptance: float
    bits: int
    bytes: float  # every routed expert at the draft's width

    def tokens_per_window(self, k: int = K, acceptance: float | None = None) -> float:
        a = self.acceptance if acceptance is None else acceptance
        return 1.0 + sum(a ** i for i in range(1, k + 1))

    def describe(self) -> str:
        return (f"modelled draft int{self.bits}-g64 resident ({self.bytes / 2**30:.2f} GiB), forecast recall "
                f"{self.recall:.3f}, per-token acceptance {self.acceptance:.3f} (measured on the bundled model: "
                f"routing/importing.MEASURED_DRAFT; band {ACCEPTANCE_RANGE[0]}-{ACCEPTANCE_RANGE[1]}), K={K}")


def _draft_format(bits: int) -> WeightFormat:
    return replace(_DRAFT_FORMAT, name=f"int{bits}_g64", bits=bits + 0.25)


def draft_model(geom: ModelGeometry, budget: VramBudget, expert_bits: float) -> DraftModel | None:
    """The widest measured draft (4, 3 or 2 bits) narrower than the experts that fits beside one full-precision
    slot per layer; None when none does."""
    for bits in (4, 3, 2):
        f = MEASURED_DRAFT[bits]
        size = geom.routed_params * _draft_format(bits).bytes_per_weight
        if bits + 0.25 < expert_bits and budget.experts - size >= geom.moe_layers * budget.expert_bytes:
            return DraftModel(f.recall, f.acceptance, bits, size)
    return None


def _window_counts(routing: np.ndarray, slots: int, warmup: int, strategy: str, recall: float,
                   seed: int = 0) -> tuple[Counts, float]:
    """Per layer, mean per verify window: experts read from resident slots, copied, computed on the host; and
    the mean number of those copies the draft prefetched (hidden behind drafting)."""
    rng = np.random.default_rng(seed)
    tokens, layers, _ = routing.shape
    w = K + 1
    starts = range(warmup, tokens - w + 1, w)
    dev, cop, host, trips = (np.zeros(layers) for _ in range(4))
    prefetched = 0.0
    caches = [OrderedDict() for _ in range(layers)]
    for s in range(0, warmup, w):  # warm the slots with the prompt's routing
        for l in range(layers):
            for e in np.unique(routing[s:s + w, l]):
                caches[l][int(e)] = None
                caches[l].move_to_end(int(e))
                while len(caches[l]) > slots:
                    caches[l].popitem(last=False)
    n = 0
    for s in starts:
        n += 1
        for l in range(layers):
            ids, uses = np.unique(routing[s:s + w, l], return_counts=True)
            cache = caches[l]
            h = 0
            for e, u in zip(ids.tolist(), uses.tolist()):
                if e in cache:
                    dev[l] += 1
                    cache.move_to_end(e)
                    continue
                forecast = strategy != "spec_lru" and rng.random() < recall
                if strategy == "specter_host" and not (forecast and u >= 2):
                    host[l] += 1
                    h += 1
                    continue
                cop[l] += 1
                prefetched += forecast
                cache[e] = None
                while len(cache) > slots:
                    cache.popitem(last=False)
            trips[l] += h > 0
    n = max(1, n)
    return Counts(dev / n, cop / n, host / n, trips / n), prefetched / n


def speculative_rows(geom: ModelGeometry, budget: VramBudget, routing: np.ndarray, warmup: int,
                     expert_bits: float):
    """(draft, [(strategy, window counts, prefetched copies per window, parameters)]) for each speculative
    strategy the VRAM allows: a draft narrower than the experts must fit beside one full-precision slot per
    layer (none when every expert fits: nothing to speculate about)."""
    d = None if budget.all_fit else draft_model(geom, budget, expert_bits)
    if d is None:
        return None, []
    per_layer = min(geom.num_experts, int((budget.experts - d.bytes) // budget.expert_bytes) // geom.moe_layers)
    out = []
    for name in SPECULATIVE:
        counts, pre = _window_counts(routing, per_layer, warmup, name, d.recall)
        out.append((name, counts, pre, {"slots_per_layer": per_layer, "k": K, "draft_bits": d.bits,
                                        "draft_gib": d.bytes / 2**30, "acceptance": d.acceptance,
                                        "recall": d.recall}))
    return d, out


def window_time(geom: ModelGeometry, sc: Scenario, counts: Counts, prefetched: float, d: DraftModel,
                acceptance: float | None = None) -> TokenTime:
    """ms of one committed token, by lane, at scenario ``sc``: ``K`` draft forwards (every expert resident at the
    draft's width) plus one verify forward over the window's union, less the prefetched copies hidden behind
    drafting, over the tokens a window commits."""
    from .replay import resident

    scale = sc.precision.experts.gpu_efficiency / max(1e-9, _experts_central(sc.precision))
    fmt = _draft_format(d.bits)
    draft_prec = WeightPrecision(replace(fmt, gpu_efficiency=fmt.gpu_efficiency * scale), sc.precision.dense)
    draft = price_token(geom, draft_prec, sc.machine, resident(geom.moe_layers, geom.top_k), sc.depth, sc.eta)
    verify = price_token(geom, sc.precision, sc.machine, counts, sc.depth, sc.eta)
    per_copy = verify.link_ms / max(1e-9, counts.copies_per_token)
    hidden = min(prefetched * per_copy, K * draft.total_ms)
    t = d.tokens_per_window(K, acceptance)
    lanes = (K * draft.total_ms + verify.device_ms, verify.link_ms - hidden, verify.host_ms, verify.trips_ms,
             verify.disk_ms)
    lanes = tuple(x / t for x in lanes)
    return TokenTime(*lanes[:4], sum(lanes), lanes[4])


def _experts_central(p: WeightPrecision) -> float:
    """The central efficiency of the experts' format (a band scenario scales it; the draft's follows)."""
    from ..pricing.precision import FORMATS

    return FORMATS.get(p.experts.name, p.experts).gpu_efficiency
