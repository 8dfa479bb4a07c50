"""Prompt data: held-out code prompts for benchmarks, and the planner's calibration prompts (never the same ones)."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np

__all__ = ["heldout_prompts", "calibration_prompts"]


def heldout_prompts(n: int | None = None) -> list[str]:
    """Code prompts from standard-library modules the bundled model never trained on (the first ``n``)."""
    text = resources.files("specter_lab").joinpath("data/heldout_prompts.json").read_text()
    prompts = json.loads(text)
    return prompts[:n] if n else prompts


def calibration_prompts(tokenizer, n: int = 2, vocab: int = 256) -> list:
    """Prompts for the planner's calibration runs: the last ``n`` held-out prompts (benchmarks take the first
    ones), or random token ids below ``vocab`` when there is no tokenizer."""
    if tokenizer is None:
        rng = np.random.default_rng(0)
        return [rng.integers(3, vocab, size=12).tolist() for _ in range(n)]
    return heldout_prompts()[-n:]
