"""Tiny randomly initialised MoE models of real transformers families, for tests, notebooks and walkthroughs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["tiny_random_model"]


def tiny_random_model(family: str = "qwen2_moe", seed: int = 0, **overrides: Any) -> nn.Module:
    """A tiny randomly initialised MoE model of one transformers family (for tests, notebooks, bring-your-own
    walkthroughs). Families: mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, gpt_oss."""
    import transformers as tf

    common = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    families: dict[str, tuple[str, str, dict]] = {
        "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                    dict(num_hidden_layers=2, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2)),
        "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                      dict(num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                           num_experts_per_tok=2, shared_expert_intermediate_size=64, decoder_sparse_step=1)),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      dict(num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                           num_experts_per_tok=2, head_dim=16, decoder_sparse_step=1)),
        "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
                  dict(num_hidden_layers=2, intermediate_size=32, num_experts=8, num_experts_per_tok=2)),
        "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                        dict(num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
                             n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                             n_group=2, topk_group=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                             qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4)),
        "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                    dict(num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                         head_dim=16, sliding_window=64, layer_types=["sliding_attention", "full_attention"])),
    }
    if family not in families:
        raise ValueError(f"family={family!r} is unknown; use one of {sorted(families)}.")
    cfg_name, model_name, extra = families[family]
    kwargs = {**common, **extra, **overrides}
    if family == "gpt_oss" and "rope_parameters" not in overrides:
        # GPT-OSS's YaRN extends an original 4096 positions 32-fold; with 512 positions that ratio no longer
        # holds and transformers warns. Keep the YaRN path, scaled to the tiny length.
        rope = dict(getattr(tf, cfg_name)().rope_parameters)
        rope["original_max_position_embeddings"] = kwargs["max_position_embeddings"] // int(rope["factor"])
        kwargs["rope_parameters"] = rope
    cfg = getattr(tf, cfg_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(tf, model_name)(cfg)
    # Random init leaves gpt-oss router biases and expert biases at zero/empty; give every tensor real values so
    # a wrong slot or a wrong bias shows in the output.
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "bias" in name or "sinks" in name or "e_score_correction" in name:
                p.copy_(torch.randn(p.shape, generator=g, device="cpu") * 0.02)  # CPU generator, any device
        for n, b in model.named_buffers():
            if "e_score_correction_bias" in n:
                b.copy_(torch.randn(b.shape, generator=g, device="cpu") * 0.02)
    return model.eval()
