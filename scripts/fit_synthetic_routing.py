"""Fit the synthetic routing's (stick, skew, drift) per family to its published LRU curve (and, where published,
a frequency-pinned hot set's held-out coverage, which fixes drift); prints the values for the table.

    python scripts/fit_synthetic_routing.py            # every family in LOCALITY

The geometry of each fit is the measured model's (experts, top-k); 4 layers x 512 tokens, cold cache per sample,
as moe-lrc samples are 512 tokens. Coarse grid, then a fine one around the best point.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from specter_lab.traces.synthetic import LOCALITY, hot_coverage, lru_hit_rate, synthetic_routing
from dataclasses import replace

SHAPES = {"qwen3_moe": (128, 8), "deepseek_v2": (64, 6), "olmoe": (64, 8), "mixtral": (8, 2), "qwen2_moe": (60, 4),
          "phimoe": (16, 2), "gpt_oss": (32, 4)}


def error(loc, experts, k, layers=4, tokens=512) -> float:
    r = synthetic_routing(layers, experts, k, tokens, loc, seed=1)
    lru = sum((lru_hit_rate(r, max(1, round(f * experts))) - h) ** 2 for f, h in loc.lru_points.items())
    return lru + sum((hot_coverage(r, max(1, round(f * experts))) - c) ** 2 for f, c in loc.hot_points.items())


def fit(key: str, drift: float | None = None):
    """(stick, skew, drift): with hot-set data, skew x drift at stick 0; else stick x skew at the given drift."""
    loc = LOCALITY[key]
    experts, k = SHAPES[key]
    if loc.hot_points:
        err = lambda z, d: error(replace(loc, stick=0.0, skew=z, drift=d), experts, k)
        _, z0, d0 = min((err(z, d), z, d) for z, d in itertools.product(np.arange(1.2, 2.41, 0.2),
                                                                         (0.0, 0.002, 0.005, 0.01, 0.02)))
        e, z, d = min((err(z, d), z, d) for z, d in itertools.product(np.arange(z0 - 0.1, z0 + 0.11, 0.05),
                                                                       (d0 * 0.7, d0, d0 * 1.4)))
        return 0.0, round(float(z), 3), round(float(d), 4), e
    err = lambda s, z: error(replace(loc, stick=s, skew=z, drift=drift), experts, k)
    _, s0, z0 = min((err(s, z), s, z) for s, z in itertools.product(np.arange(0.0, 0.96, 0.1),
                                                                     np.arange(0.0, 2.41, 0.3)))
    sticks = np.clip(np.arange(s0 - 0.08, s0 + 0.09, 0.04), 0, 0.97)
    skews = np.clip(np.arange(z0 - 0.2, z0 + 0.21, 0.1), 0, 3)
    e, s, z = min((err(s, z), s, z) for s, z in itertools.product(sticks, skews))
    return round(float(s), 3), round(float(z), 3), drift, e


if __name__ == "__main__":
    keys = sys.argv[1:] or list(LOCALITY)
    # the families with hot-set data first: their drift is carried to the others
    drift = LOCALITY["qwen3_moe"].drift
    for key in sorted(keys, key=lambda k: not LOCALITY[k].hot_points):
        s, z, d, e = fit(key, drift)
        drift = d if LOCALITY[key].hot_points else drift
        print(f"{key}: stick={s}, skew={z}, drift={d}  (sum sq. err {e:.4f})", flush=True)
