"""Weight precision as a cost input: how many bytes a weight costs on the link, in VRAM and in DRAM, and how much of
a GPU's memory bandwidth a decode kernel of that format reaches.

A format's ``bits`` are bits per weight *including* its block scales (GGUF ``Q4_K`` stores 144 bytes per 256
weights: 4.5 bits). The ``_M`` / ``_S`` GGUF mixes and ``Q2_K`` put some tensors in a wider type; their ``bits`` is
the mix's average over the routed experts' tensors (stated per row). ``gpu_efficiency`` is the fraction of the
datasheet VRAM bandwidth batch-1 decode reaches in that format: quantprobe measured it per format on a GTX 1060
(``docs/HARDWARE.md``: Q4_0 0.619, Q4_K_M 0.553, Q2_K 0.340); the others are assumptions, said so in ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WeightFormat", "WeightPrecision", "FORMATS", "get_precision"]

_QP = "FedericoTs/quantprobe docs/HARDWARE.md (decode eta by format, GTX 1060, same session)"


@dataclass(frozen=True)
class WeightFormat:
    """One storage format of a weight tensor."""

    name: str
    bits: float  # bits per weight, block scales included
    gpu_efficiency: float  # fraction of datasheet VRAM bandwidth a batch-1 decode kernel reaches in this format
    source: str

    @property
    def bytes_per_weight(self) -> float:
        return self.bits / 8.0


FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in [
        WeightFormat(name="bf16", bits=16.0, gpu_efficiency=0.80,
                     source="2 bytes; efficiency = the profiles' effective/datasheet ratio for fp16 streaming"),
        WeightFormat(name="fp16", bits=16.0, gpu_efficiency=0.80, source="as bf16"),
        WeightFormat(name="int8", bits=8.0, gpu_efficiency=0.62,
                     source="1 byte + per-channel scales (negligible); efficiency assumed as q4_0 (simple blocks)"),
        WeightFormat(name="q8_0", bits=8.5, gpu_efficiency=0.62,
                     source="GGUF Q8_0: 34 bytes / 32 weights; efficiency assumed as q4_0 (same block layout)"),
        WeightFormat(name="q6_k", bits=6.5625, gpu_efficiency=0.553,
                     source="GGUF Q6_K: 210 bytes / 256; efficiency assumed as q4_k_m (k-quant unpacking)"),
        WeightFormat(name="q5_k_m", bits=5.6, gpu_efficiency=0.553,
                     source="GGUF Q5_K 5.5 bits, _M mix puts half the down projections in Q6_K; efficiency as q4_k_m"),
        WeightFormat(name="q5_k", bits=5.5, gpu_efficiency=0.553,
                     source="GGUF Q5_K: 176 bytes / 256; efficiency assumed as q4_k_m (k-quant unpacking)"),
        WeightFormat(name="iq4_xs", bits=4.25, gpu_efficiency=0.553,
                     source="GGUF IQ4_XS: 136 bytes / 256 (non-linear 4-bit + 6-bit scales); efficiency assumed as "
                            "q4_k_m (a lookup per weight, like k-quant unpacking)"),
        WeightFormat(name="q4_k_m", bits=4.85, gpu_efficiency=0.553,
                     source=f"GGUF Q4_K 4.5 bits, _M mix puts half the down projections in Q6_K; efficiency {_QP}"),
        WeightFormat(name="q4_0", bits=4.5, gpu_efficiency=0.619, source=f"GGUF Q4_0: 18 bytes / 32; efficiency {_QP}"),
        WeightFormat(name="q3_k_m", bits=3.9, gpu_efficiency=0.45,
                     source="GGUF Q3_K 3.4375 bits, _M mix: down projections in Q4_K/Q5_K; efficiency assumed "
                            "between q4_k_m and q2_k"),
        WeightFormat(name="q2_k", bits=2.9, gpu_efficiency=0.340,
                     source=f"GGUF Q2_K mix: gate/up in Q2_K (2.625 bits), down in Q3_K (3.4375); efficiency {_QP}"),
        WeightFormat(name="mxfp4", bits=4.25, gpu_efficiency=0.619,
                     source="OCP MXFP4: 32 fp4 values + one 8-bit scale per block (17 bytes / 32); efficiency "
                            "assumed as q4_0 (same block size, one scale)"),
    ]
}

# What the dense (non-expert) tensors are stored in when a spec names one format. A GGUF mix keeps the dense
# tensors near its own width; the MXFP4 checkpoints (gpt-oss) keep attention, router, embeddings and head in bf16
# (config.json quantization_config.modules_to_not_convert), and ggml-org's gpt-oss GGUF stores them in q8_0.
_DENSE_OF = {"mxfp4": "bf16", "int8": "bf16"}


@dataclass(frozen=True)
class WeightPrecision:
    """The formats of a model's routed experts and of everything else (attention, router, shared experts, head)."""

    experts: WeightFormat
    dense: WeightFormat

    @property
    def label(self) -> str:
        if self.experts.name == self.dense.name:
            return self.experts.name
        return f"{self.experts.name}+{self.dense.name} (experts {self.experts.name}, the rest {self.dense.name})"

    @property
    def key(self) -> str:
        return self.experts.name if self.experts.name == self.dense.name else f"{self.experts.name}+{self.dense.name}"


def _format(name: str, arg: str) -> WeightFormat:
    key = name.strip().lower().replace("-", "_")
    if key not in FORMATS:
        raise ValueError(f"{arg}={name!r} is not a known weight format: use one of {sorted(FORMATS)}, or "
                         "'<experts>+<dense>' (e.g. 'mxfp4+q8_0').")
    return FORMATS[key]


def get_precision(weights: "str | WeightPrecision | None", arg: str = "weights") -> WeightPrecision:
    """Resolve ``weights=``: None (bf16), a format name (``"q4_k_m"``: the whole model in it; ``"mxfp4"``: experts
    in MXFP4, the rest bf16 as the checkpoint ships) or ``"<experts>+<dense>"`` (``"mxfp4+q8_0"``)."""
    if weights is None:
        return WeightPrecision(FORMATS["bf16"], FORMATS["bf16"])
    if isinstance(weights, WeightPrecision):
        return weights
    if not isinstance(weights, str):
        raise TypeError(f"{arg}= must be a format name or WeightPrecision, got {type(weights).__name__}")
    experts, _, dense = weights.partition("+")
    e = _format(experts, arg)
    d = _format(dense, arg) if dense else FORMATS[_DENSE_OF.get(e.name, e.name)]
    return WeightPrecision(e, d)
