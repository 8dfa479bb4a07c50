"""Cost shapes: per-layer dimensions of real MoE models (from their public config.json), used to price a tiny
model's run as if its layers had these sizes. Routing still comes from the model actually run: a *projection*."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["CostShape", "COST_SHAPES", "get_cost_shape", "PROJECTIONS"]

PROJECTIONS = ("layers", "full")


@dataclass(frozen=True)
class CostShape:
    """Per-layer dimensions of a real MoE model, from its public config.json, used to price a tiny model's run
    as if its layers had these sizes (routing still comes from the model actually run: a *projection*)."""

    name: str
    hidden: int
    expert_params: int  # one routed expert: gate+up+down
    dense_params: int  # per MoE layer, excluding routed experts: attention, router, shared experts, norms
    vocab: int
    kv_bytes_per_token_per_layer: int  # KV cache bytes read per context token per layer (fp16)
    num_experts: int
    top_k: int
    num_layers: int  # decoder layers of the real model, dense ones included
    family: str = "qwen2_moe"  # transformers model_type whose aten op counts price host dispatch
    dense_layers: int = 0  # dense (non-MoE) first layers of the real model
    dense_layer_params: int = 0  # params of one such layer (attention + dense MLP + norms)
    projection: str = "layers"  # layers | full (see the module docstring)

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers

    @property
    def label(self) -> str:
        """Which projection, in words: stated in every output that uses this shape."""
        if self.projection == "full":
            dense = f" + {self.dense_layers} dense" if self.dense_layers else ""
            return f"{self.name}@full ({self.moe_layers} MoE{dense} layers, full LM head)"
        return f"{self.name} (the run's layers at this size, LM head pro rata)"

    @property
    def key(self) -> str:
        return self.name + ("@full" if self.projection == "full" else "")


def _shape(name, hidden, moe_inter, n_experts, top_k, layers, attn_params, shared_inter, vocab, kv_dim,
           family="qwen2_moe", dense_layers=0, dense_inter=0):
    return CostShape(
        name=name,
        hidden=hidden,
        expert_params=3 * hidden * moe_inter,
        dense_params=attn_params + 3 * hidden * shared_inter + n_experts * hidden + 2 * hidden,
        vocab=vocab,
        kv_bytes_per_token_per_layer=2 * kv_dim * 2,
        num_experts=n_experts,
        top_k=top_k,
        num_layers=layers,
        family=family,
        dense_layers=dense_layers,
        dense_layer_params=(attn_params + 3 * hidden * dense_inter + 2 * hidden) if dense_layers else 0,
    )


# One table, from each model's public config.json (hidden_size, moe/intermediate size, experts, top-k, layers,
# attention projections, shared-expert width, vocabulary, KV width).
COST_SHAPES: dict[str, CostShape] = {
    s.name: s
    for s in [
        # Mixtral-8x7B: H 4096, I 14336, 8 experts top-2, 32 layers, 32 q / 8 kv heads × 128, vocab 32000
        _shape("mixtral-8x7b", 4096, 14336, 8, 2, 32, 2 * 4096 * 4096 + 2 * 4096 * 1024, 0, 32000, 1024),
        # DeepSeek-V2-Lite: H 2048, moe I 1408, 64 experts top-6, 2 shared (2816), 27 layers, MLA (kv_lora 512 +
        # rope 64 cached), vocab 102400. Attention: q 2048·16·192, kv_a 2048·576, kv_b 512·16·256, o 2048·2048.
        # First layer dense (first_k_dense_replace 1, intermediate 10944): 26 MoE layers.
        _shape("deepseek-v2-lite", 2048, 1408, 64, 6, 27,
               2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048, 2816, 102400, 288,
               family="deepseek_v2", dense_layers=1, dense_inter=10944),
        # Qwen1.5-MoE-A2.7B: H 2048, moe I 1408, 60 experts top-4, shared 5632, 24 layers, 16 heads, vocab 151936
        _shape("qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, 24, 4 * 2048 * 2048, 5632, 151936, 2048),
        # Phi-3.5-MoE: H 4096, I 6400, 16 experts top-2, 32 layers, 32 q / 8 kv heads, vocab 32064
        _shape("phi-3.5-moe", 4096, 6400, 16, 2, 32, 2 * 4096 * 4096 + 2 * 4096 * 1024, 0, 32064, 1024),
        # OLMoE-1B-7B: H 2048, I 1024, 64 experts top-8, 16 layers, 16 heads, vocab 50304
        _shape("olmoe-1b-7b", 2048, 1024, 64, 8, 16, 4 * 2048 * 2048, 0, 50304, 2048),
        # Qwen3-30B-A3B: H 2048, moe I 768, 128 experts top-8, 48 layers, 32 q / 4 kv heads × 128, vocab 151936
        _shape("qwen3-30b-a3b", 2048, 768, 128, 8, 48, 2048 * 4096 * 2 + 2 * 2048 * 512, 0, 151936, 512),
    ]
}


def get_cost_shape(cost_shape: "str | CostShape | None") -> CostShape | None:
    """Resolve ``cost_shape=``: None, a CostShape, a name in COST_SHAPES (the ``layers`` projection) or a name
    followed by ``@full`` (the real depth) or ``@layers``."""
    if cost_shape is None or isinstance(cost_shape, CostShape):
        return cost_shape
    name, _, projection = str(cost_shape).partition("@")
    if name not in COST_SHAPES:
        raise ValueError(f"cost_shape={cost_shape!r} is unknown. Use None (price the model as it is) or one of "
                         f"{sorted(COST_SHAPES)}, optionally followed by '@full' (real depth).")
    if projection and projection not in PROJECTIONS:
        raise ValueError(f"cost_shape={cost_shape!r}: projection {projection!r} is unknown; use one of "
                         f"{list(PROJECTIONS)} after the '@'.")
    return replace(COST_SHAPES[name], projection=projection or "layers")

