"""Fit the synthetic routing's (stick, skew) per family to its published LRU curve; prints the table rows.

    python scripts/fit_synthetic_routing.py            # every family in LOCALITY

The geometry of each fit is the measured model's (experts, top-k); 4 layers x 512 tokens, cold cache per sample,
as moe-lrc samples are 512 tokens. Coarse grid, then a fine one around the best point.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from specter_lab.offload.synthetic_routing import LOCALITY, lru_hit_rate, synthetic_routing
from dataclasses import replace

SHAPES = {"qwen3_moe": (128, 8), "deepseek_v2": (64, 6), "olmoe": (64, 8), "mixtral": (8, 2), "qwen2_moe": (60, 4),
          "phimoe": (16, 2), "gpt_oss": (32, 4)}


def error(loc, experts, k, layers=4, tokens=512) -> float:
    r = synthetic_routing(layers, experts, k, tokens, loc, seed=1)
    return sum((lru_hit_rate(r, max(1, round(f * experts))) - h) ** 2 for f, h in loc.lru_points.items())


def fit(key: str):
    loc = LOCALITY[key]
    experts, k = SHAPES[key]
    grid = lambda sticks, skews: min(((error(replace(loc, stick=s, skew=z), experts, k), s, z)
                                      for s, z in itertools.product(sticks, skews)))
    _, s0, z0 = grid(np.arange(0.0, 0.96, 0.1), np.arange(0.0, 2.01, 0.25))
    e, s, z = grid(np.clip(np.arange(s0 - 0.08, s0 + 0.09, 0.04), 0, 0.97), np.clip(np.arange(z0 - 0.2, z0 + 0.21, 0.1), 0, 3))
    return round(float(s), 3), round(float(z), 3), e


if __name__ == "__main__":
    for key in (sys.argv[1:] or LOCALITY):
        s, z, e = fit(key)
        print(f"{key}: stick={s}, skew={z}  (sum sq. err {e:.4f})", flush=True)
