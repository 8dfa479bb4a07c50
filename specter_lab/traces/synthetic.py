"""Synthetic routing matched to published locality: what an estimate uses when no routing trace of the model exists.

Each layer routes by a three-parameter process: a token keeps each of the previous token's experts with
probability ``stick``, and draws the rest without replacement from a Zipf popularity with exponent ``skew`` over a
permutation of the experts (a per-layer hot set) that ``drift`` changes as decoding goes on (each token swaps
about ``drift x E`` pairs of ranks: what is hot now is not what was hot 100 tokens ago). LRU curves alone cannot
tell a static hot set (which pinned experts serve) from a moving one (which only a cache serves): ``drift`` is
fitted, for the Qwen family, to the one published held-out coverage of a frequency-pinned hot set, and carried to
the other families. ``stick`` and ``skew`` are fitted per family (``scripts/fit_synthetic_routing.py``) so that an
LRU over this routing reproduces the family's published hit-rate curve: moe-lrc (Liang et al., arXiv 2505.16056,
``plot/mchr.pdf`` LRU panel, read in ``../shared/research/routing_locality.md`` Table 1a).
``tests/test_estimate.py`` checks the fit still holds.

Every output that uses it says ``synthetic routing matched to <source>``; a recorded trace replaces it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..caching.simulate import simulate

__all__ = ["Locality", "LOCALITY", "locality_for", "synthetic_routing", "lru_hit_rate", "hot_coverage"]

_MOE_LRC = "moe-lrc LRU curve (arXiv 2505.16056, plot/mchr.pdf; routing_locality.md Table 1a)"


@dataclass(frozen=True)
class Locality:
    """A family's published locality and the synthetic process fitted to it."""

    key: str
    model: str  # the model the curve was measured on
    source: str
    lru_points: dict[float, float]  # fraction of experts cached per layer -> LRU hit rate
    stick: float  # P(a token keeps one of the previous token's experts), fitted
    skew: float  # Zipf exponent of per-layer popularity, fitted
    drift: float = 0.0  # rank swaps per token per expert: how fast a layer's hot set moves
    transferred: str = ""  # set when the curve is another model's, carried over (said in the label)
    # fraction of experts pinned by a frequency profile -> share of held-out routing they serve. LRU curves alone do
    # not tell popularity (a static hot set serves it) from recency (only a cache serves it): this pins the split.
    hot_points: dict[float, float] = field(default_factory=dict)
    hot_source: str = ""

    @property
    def label(self) -> str:
        base = f"synthetic routing matched to {self.source} for {self.model}"
        base += f" ({self.transferred})" if self.transferred else ""
        moving = (f"hot-set drift matched to {self.hot_source}" if self.hot_points else
                  "hot-set drift carried over from the Qwen3 fit (no static hot-set measurement of this family)")
        return f"{base}; {moving}"


# Fitted by scripts/fit_synthetic_routing.py (512-token samples, cold cache each). _DRIFT: Qwen3's, the one family
# with a hot-set measurement, carried to the others (their static hot sets are unmeasured).
_DRIFT = 0.007  # fitted on qwen3_moe together with its skew
LOCALITY: dict[str, Locality] = {
    loc.key: loc
    for loc in [
        Locality("qwen3_moe", "Qwen3-30B-A3B", _MOE_LRC,
                 {0.0625: 0.47, 0.125: 0.65, 0.25: 0.83, 0.344: 0.91, 0.5: 0.97}, stick=0.0, skew=1.7, drift=_DRIFT,
                 hot_points={0.0625: 0.10},
                 hot_source="a frequency-pinned top 6.25 % serves ~10 % of held-out routing on Qwen3.8-Flash-Next "
                            "(ggml-org/llama.cpp PR #27861; the only static hot-set measurement of a Qwen MoE)"),
        Locality("deepseek_v2", "DeepSeek-V2-Lite", _MOE_LRC,
                 {0.0625: 0.19, 0.125: 0.33, 0.25: 0.50, 0.344: 0.59, 0.5: 0.73}, stick=0.1, skew=0.8, drift=_DRIFT),
        Locality("olmoe", "OLMoE-1B-7B", _MOE_LRC,
                 {0.0625: 0.22, 0.125: 0.43, 0.25: 0.61, 0.344: 0.71, 0.5: 0.83}, stick=0.14, skew=1.2, drift=_DRIFT),
        Locality("mixtral", "Mixtral-8x7B", _MOE_LRC,
                 {0.125: 0.19, 0.25: 0.36, 0.344: 0.46, 0.5: 0.61}, stick=0.14, skew=0.4, drift=_DRIFT),
        Locality("qwen2_moe", "Qwen1.5-MoE-A2.7B", _MOE_LRC,
                 {0.0667: 0.19, 0.125: 0.27, 0.25: 0.41, 0.344: 0.51, 0.5: 0.65}, stick=0.1, skew=0.5, drift=_DRIFT),
        Locality("phimoe", "Phi-3.5-MoE", _MOE_LRC,
                 {0.0625: 0.23, 0.125: 0.43, 0.25: 0.63, 0.344: 0.73, 0.5: 0.85}, stick=0.1, skew=1.4, drift=_DRIFT),
        # No locality measurement of gpt-oss-20b exists (routing_locality.md §2). The one gpt-oss number is
        # gpt-oss-120b's previous-token reuse, 0.18 at 128 experts top-4 (Helldez/BigMoeOnEdge PR #101): carried
        # to 32/4 as the same excess over chance, (0.18 - 4/128) / (1 - 4/128) = 0.154 -> 0.125 + 0.154 * 0.875.
        Locality("gpt_oss", "gpt-oss-120b", "previous-token reuse 0.18 (Helldez/BigMoeOnEdge PR #101)",
                 {0.125: 0.26}, stick=0.0, skew=0.9, drift=_DRIFT,
                 transferred="no gpt-oss-20b measurement: carried to 32 experts top-4 as excess over chance"),
    ]
}
# Families without a published curve get the median excess-over-chance of the measured ones (OLMoE's curve is the
# median of the six): said in the label.
_ALIASES = {"deepseek_v3": "deepseek_v2", "qwen3_next": "qwen3_moe", "qwen3_5_moe": "qwen3_moe",
            "qwen3_vl_moe": "qwen3_moe", "mixtral": "mixtral", "minimax": "mixtral", "olmoe": "olmoe",
            "flex_olmo": "olmoe", "qwen2_moe": "qwen2_moe", "phimoe": "phimoe"}


def locality_for(model_type: str) -> Locality:
    """The published locality that stands for ``model_type`` (its own family's, else the median family's)."""
    key = model_type if model_type in LOCALITY else _ALIASES.get(model_type)
    if key is not None:
        return LOCALITY[key]
    med = LOCALITY["olmoe"]
    return Locality(model_type, med.model, med.source, med.lru_points, med.stick, med.skew,
                    transferred=f"no published curve for {model_type}: OLMoE's, the median of the measured families")


def synthetic_routing(num_layers: int, num_experts: int, top_k: int, tokens: int, loc: Locality,
                      seed: int = 0) -> np.ndarray:
    """``[tokens, num_layers, top_k]`` expert ids drawn by ``loc``'s process (distinct within a token). Drawn once
    per process for each set of arguments (an estimate explorer asks again for every GPU, VRAM or host it
    prices, and the draw was 2.5 of an estimate's 3.4 s here); each call gets its own copy."""
    return _drawn(num_layers, num_experts, top_k, tokens, loc.stick, loc.skew, loc.drift, seed).copy()


@functools.lru_cache(maxsize=8)  # about 1 MB each at the estimate's size (320 tokens × 48 layers × top-8)
def _drawn(num_layers: int, num_experts: int, top_k: int, tokens: int, stick: float, skew: float, drift: float,
           seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((tokens, num_layers, top_k), dtype=np.int64)
    base = (np.arange(num_experts) + 1.0) ** -skew
    base = base / base.sum()
    for layer in range(num_layers):
        rank = rng.permutation(num_experts)  # rank[e]: popularity rank of expert e
        prev: list[int] = []
        for t in range(tokens):
            for _ in range(rng.binomial(num_experts, drift)):  # the hot set moves
                i, j = rng.integers(num_experts, size=2)
                rank[i], rank[j] = rank[j], rank[i]
            keep = [e for e, u in zip(prev, rng.random(len(prev)).tolist()) if u < stick]  # one draw each, in order
            w = base[rank]
            w[keep] = 0.0
            prev = keep + _choice(rng, w / w.sum(), top_k - len(keep))
            out[t, layer] = prev
    out.flags.writeable = False  # the cached draw itself: only copies leave this module
    return out


def _choice(rng: np.random.Generator, p: np.ndarray, size: int) -> list[int]:
    """``rng.choice(len(p), size, replace=False, p=p)`` as ids, the same draws from the same stream (numpy's
    sampler without its argument checks, and first occurrences kept without ``np.unique``): the synthetic draw asks
    for one per token and layer, ~60 % of its time in the checks. ``p`` is overwritten."""
    found: list[int] = []
    while len(found) < size:
        x = rng.random(size - len(found))
        if found:
            p[found] = 0
        cdf = np.cumsum(p)
        cdf /= cdf[-1]
        found += dict.fromkeys(cdf.searchsorted(x, side="right").tolist())  # first occurrences, in order
    return found


def lru_hit_rate(routing: np.ndarray, slots: int) -> float:
    """Per-layer LRU hit rate over ``routing`` with ``slots`` experts a layer, counted as moe-lrc counts it (all of
    a token's lookups before the update; while a layer's cache has room at a token's start, that token's
    first-time accesses count as hits): :func:`~.cachesim.simulate` with ``rule="moe-lrc"``."""
    stats = simulate(routing, slots, rule="moe-lrc")
    return int(stats.hits.sum() + stats.roomy.sum()) / int(stats.lookups.sum())


def hot_coverage(routing: np.ndarray, pinned: int) -> float:
    """Share of the second half's routed experts served by each layer's ``pinned`` most routed experts of the first
    half (a static hot set chosen by a frequency profile, judged on held-out tokens): the simulator's ``static``
    pool, counted from the second half on."""
    tokens, layers, _ = routing.shape
    half = tokens // 2
    hot = {}
    for layer in range(layers):
        freq = np.bincount(routing[:half, layer].ravel(), minlength=int(routing.max()) + 1)
        hot[layer] = np.argsort(-freq, kind="stable")[:pinned].tolist()
    stats = simulate(routing, pinned, policy="static", initial=hot, warmup=half)
    served = 0.0
    for h, n in zip(stats.hits.tolist(), stats.lookups.tolist()):
        served += h / n
    return served / layers
