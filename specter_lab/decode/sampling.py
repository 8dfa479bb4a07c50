"""Choosing tokens: greedy or sampled from the target's distribution, and verifying a draft against it.

Greedy verification accepts while the target's argmax equals the draft token; sampling uses standard speculative
rejection sampling (Leviathan et al. 2023; Chen et al. 2023), so the output distribution is the target's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Sampling", "verify_greedy", "verify_sampling"]


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = 0

    def generator(self) -> torch.Generator | None:
        if not self.do_sample:
            return None
        gen = torch.Generator(device="cpu")
        gen.manual_seed(0 if self.seed is None else self.seed)
        return gen

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution the target samples from: softmax(logits / T), nucleus-filtered (HF's order)."""
        logits = logits.float() / self.temperature
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            remove_sorted = cum <= (1 - self.top_p)
            remove_sorted[..., -1:] = False  # keep at least one token
            remove = remove_sorted.scatter(-1, order, remove_sorted)
            logits = logits.masked_fill(remove, -math.inf)
        return logits.softmax(-1)

    def pick(self, logits: torch.Tensor, gen: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
        """(token, the distribution it was drawn from or None for greedy) for one row of logits."""
        if not self.do_sample:
            return int(torch.argmax(logits, dim=-1)), None  # argmax on the device; one id crosses (a sync)
        p = self.probs(logits.float().cpu())  # the seeded generator lives on the host
        return int(torch.multinomial(p, 1, generator=gen)), p


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int, str]:
    """(accepted drafts, the target's next token, 'corrected' | 'bonus') for logits over [last, d1..dK]."""
    target = torch.argmax(logits, dim=-1).tolist()  # K+1 ids cross to the host in one readback
    for i, d in enumerate(drafts):
        if target[i] != d:
            return i, target[i], "corrected"
    return len(drafts), target[len(drafts)], "bonus"


def verify_sampling(sampling: Sampling, gen: torch.Generator | None, logits: torch.Tensor, drafts: list[int],
                    q: list[torch.Tensor]) -> tuple[int, int, str]:
    """Speculative rejection sampling: accept d_i with probability min(1, p/q), else resample from (p − q)+."""
    logits = logits.float().cpu()  # one readback; the seeded generator and the draft's q live on the host
    for i, d in enumerate(drafts):
        p = sampling.probs(logits[i])
        r = float(torch.rand(1, generator=gen))
        if q[i][d] <= 0 or r < min(1.0, float(p[d] / q[i][d])):
            continue
        residual = torch.clamp(p - q[i], min=0)
        total = residual.sum()
        residual = residual / total if total > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=gen)), "corrected"
    p = sampling.probs(logits[len(drafts)])
    return len(drafts), int(torch.multinomial(p, 1, generator=gen)), "bonus"
