"""Decode loops over the unmodified HF model: :func:`autoregressive` and :func:`speculative` (draft K / verify
K+1), with the decoder plumbing (:mod:`.decoder`), token choice and verification (:mod:`.sampling`) and the
sequence cache (:mod:`.kv`)."""

from .decoder import Decoder, StepInfo, StopGeneration, autoregressive, reference_greedy
from .sampling import Sampling, verify_greedy, verify_sampling
from .speculative import DraftWindow, Speculation, Verdict, speculative

__all__ = ["Decoder", "StepInfo", "StopGeneration", "autoregressive", "reference_greedy", "Sampling", "verify_greedy",
           "verify_sampling", "Speculation", "DraftWindow", "Verdict", "speculative"]
