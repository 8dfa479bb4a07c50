"""Specter's headline comparison as data: the paper's claim, the artifact's protocol and its cases.

Specter (arXiv 2511.14102) reports 1.50× mean and 1.88× max lower TPOT than the state of the art, batch 1, one
A100-40GB. The artifact (``wwwwwf/specter_asplos@c0325dc``) compares under its own protocol: fixed resident
counts per method, its own baselines (Mixtral-Offloading as upstream runs it, a SpecMoEOff re-implementation)
and its own TPOT (``tpot_ms_artifact``, see :mod:`specter_lab.records.metrics`). Each case below is read from
``benchmarks/run_ae.py``, ``benchmarks/protocol.json``, ``baselines/README.md`` and ``baselines/run.py`` there;
:func:`specter_lab.studies.bench.reproduce_paper` runs them and ``docs/paper.md`` explains them.

Resident counts are the real model's, per MoE layer. A run on a model with another number of experts (the
bundled one: 32) keeps each method's *fraction* of experts resident (:meth:`MethodSetup.slots_on`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PaperClaim", "Protocol", "MethodSetup", "PaperCase", "PAPER_CLAIM", "PROTOCOL", "PAPER_CASES",
           "PAPER_PROFILE", "PAPER_EXECUTIONS", "ARTIFACT", "get_case"]

ARTIFACT = "wwwwwf/specter_asplos@c0325dc"
PAPER_PROFILE = "a100-40g-pcie4"  # the paper's GPU: one A100-40GB, PCIe 4.0 x16
PAPER_EXECUTIONS = ("eager", "compiled")  # the artifact runs eager PyTorch; compiled is the graphs what-if


@dataclass(frozen=True)
class PaperClaim:
    """The paper's headline: speedup in TPOT over the strongest baseline, mean and max over its settings."""

    mean: float
    max: float
    source: str
    note: str


PAPER_CLAIM = PaperClaim(
    1.50, 1.88, "arXiv 2511.14102 (v2+ abstract); v1 reported up to 2.34x on Phi-MoE",
    "No per-model number is published (paper text, artifact and model card searched): which settings average to "
    "1.50x is unknown. Only SpecMoEOff appears in all three models' comparisons, so a cross-model mean can only "
    "be against it.")


@dataclass(frozen=True)
class Protocol:
    """How the artifact measures (``baselines/README.md``, ``benchmarks/token_timing.py``)."""

    prompt_tokens: int  # prompts are cut to their first tokens
    new_tokens: int
    greedy: bool
    datasets: tuple[str, ...]
    inputs_per_dataset: int
    repeats: int
    metric: str  # the metric column that reproduces the artifact's TPOT


PROTOCOL = Protocol(prompt_tokens=16, new_tokens=128, greedy=True, datasets=("GK", "WT", "HE", "GP", "C4"),
                    inputs_per_dataset=5, repeats=3, metric="tpot_ms_artifact")


@dataclass(frozen=True)
class MethodSetup:
    """One method in one case, as the artifact configures it.

    ``residents``: full-precision experts resident per MoE layer of the real model (None: set by the case's
    memory rule, see :attr:`PaperCase.memory_rule`). ``buffers``: the artifact's staging buffers (global, for
    copies in flight); they hold no cached expert, so they are reported, not modelled as cache capacity.
    ``draft``: what the method keeps on the device for drafting (None: autoregressive)."""

    method: str  # the strategy name in specter_lab
    artifact_name: str
    residents: int | None
    k: int | None
    buffers: int = 0
    draft: str | None = None
    note: str = ""

    def slots_on(self, num_experts: int, case_experts: int) -> int | None:
        """Resident slots per layer on a model with ``num_experts`` experts: the same fraction of its experts
        as ``residents`` of the real model's ``case_experts`` (at least one). None when the memory rule sets it."""
        if self.residents is None:
            return None
        return max(1, round(self.residents * num_experts / case_experts))


@dataclass(frozen=True)
class PaperCase:
    """One of the artifact's comparisons: a model (its cost shape at full depth), each method's setup and how
    memory is set (``fixed``: the artifact's resident counts; ``matched``: a baseline gets the device bytes the
    artifact measured for Specter, here our budget rule at Specter's bytes)."""

    name: str
    model: str  # the Hugging Face model id
    cost_shape: str  # name in sl.COST_SHAPES, at full depth
    num_experts: int  # routed experts per layer of the real model
    top_k: int
    memory_rule: str  # fixed | matched
    methods: tuple[MethodSetup, ...]
    source: str
    note: str = ""

    def method(self, name: str) -> MethodSetup:
        for m in self.methods:
            if m.method == name:
                return m
        raise KeyError(f"case {self.name!r} has no method {name!r}; it has {[m.method for m in self.methods]}.")

    @property
    def baselines(self) -> tuple[str, ...]:
        return tuple(m.method for m in self.methods if m.method != "specter")


_INT4 = "INT4 copy of every routed expert (the quantized draft)"
_SPECTER_BUF = 32  # "Specter and SpecMoEOff each use 32 global buffers; Mixtral-Offloading uses 4"


def _specter(residents: int, k: int) -> MethodSetup:
    return MethodSetup("specter", "Specter", residents, k, _SPECTER_BUF, _INT4)


def _sme(residents: int | None, note: str = "") -> MethodSetup:
    return MethodSetup("specmoeoff", "SpecMoEOff (re-implementation)", residents, 3, _SPECTER_BUF,
                       "its own INT4 draft model (own weights and KV)", note)


def _mo(residents: int) -> MethodSetup:
    return MethodSetup("mixtral_offloading", "Mixtral-Offloading", residents, None, 4, None,
                       "upstream ExpertCache (write-back swap, one stream), the author's DeepSeek dispatch")


PAPER_CASES: dict[str, PaperCase] = {
    c.name: c
    for c in [
        PaperCase("deepseek-v2-lite-high", "deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite@full", 64, 6, "fixed",
                  (_specter(16, 16), _sme(12), _mo(32)),
                  f"{ARTIFACT}: baselines/README.md (High), benchmarks/protocol.json (K 16)",
                  "Fixed counts chosen so device memory is about equal by construction: MO's 16 extra fp slots "
                  "per layer ~ Specter's INT4 draft of all 64 experts."),
        PaperCase("deepseek-v2-lite-low", "deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite@full", 64, 6, "fixed",
                  (_specter(4, 16), _sme(2), _mo(20)),
                  f"{ARTIFACT}: baselines/README.md (Low; --memory low = ds_low4)"),
        PaperCase("qwen1.5-moe", "Qwen/Qwen1.5-MoE-A2.7B", "qwen1.5-moe-a2.7b@full", 60, 4, "fixed",
                  (_specter(15, 8), _sme(6, "fixed by '--specmoeoff-resident-per-layer 6' (not equal memory)")),
                  f"{ARTIFACT}: benchmarks/run_ae.py (speedup, qwen), protocol.json (K 8)",
                  "Against SpecMoEOff only (the Mixtral-Offloading adapter is DeepSeek-only); checkpoints not "
                  "bundled with the artifact."),
        PaperCase("phi-3.5-moe", "microsoft/Phi-3.5-MoE-instruct", "phi-3.5-moe@full", 16, 2, "matched",
                  (_specter(2, 16), _sme(None, "'--memory-policy matched': the largest count whose measured peak "
                                               "does not exceed Specter's")),
                  f"{ARTIFACT}: benchmarks/run_ae.py (speedup, phi), baselines/memory.py",
                  "Against SpecMoEOff only; checkpoints not bundled with the artifact."),
        PaperCase("phi-3.5-moe-low", "microsoft/Phi-3.5-MoE-instruct", "phi-3.5-moe@full", 16, 2, "matched",
                  (_specter(1, 16), _sme(None, "matched to Specter's measured peak")),
                  f"{ARTIFACT}: benchmarks/protocol.json (phi low: 1 resident)"),
    ]
}


def get_case(name: "str | PaperCase") -> PaperCase:
    """A case by name (``sl.paper.PAPER_CASES``), or the case itself."""
    if isinstance(name, PaperCase):
        return name
    if name not in PAPER_CASES:
        raise ValueError(f"case {name!r} is unknown; use one of {list(PAPER_CASES)}.")
    return PAPER_CASES[name]
