"""Record a routing trace with DeepSeek-V2-Lite's geometry (26 MoE layers after one dense layer, 64 routed
experts, top-6, 2 shared) from a random model, for the replay-speed goal (no checkpoint comes from a hub here).

    python scripts/geometry_trace.py --out dsv2geom.npz [--prompts 2] [--tokens 48]
    specter-lab bench --trace dsv2geom.npz --budgets 0.35 --hardware rtx4090-pcie4 --cost-shape deepseek-v2-lite@full

Hidden sizes are tiny (64) so recording takes seconds; the replay only reads the routing and the config (layers,
experts, top-k), and the cost shape prices it at DeepSeek-V2-Lite's real sizes. The routers' weights are scaled
×8 so routing is decisive (a random router at initialisation scale is near-uniform), which makes the draft agree
with the target most of the time, as a trained model's int4 draft does. This is a speed fixture, not a model of
DeepSeek-V2-Lite's routing: for its locality import published routing (docs/traces.md).
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import specter_lab as sl


def geometry_model(seed: int = 0) -> transformers.PreTrainedModel:
    cfg = transformers.DeepseekV2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=27,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, topk_method="greedy", n_group=1, topk_group=1, max_position_embeddings=512, eos_token_id=1,
        bos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.DeepseekV2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate.weight" in name:
                p.mul_(8.0)  # decisive routing (see the module docstring)
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="dsv2geom.npz")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = geometry_model()
    prompts = [[5 + 7 * i + j for j in range(8)] for i in range(a.prompts)]
    t0 = time.perf_counter()
    trace = sl.record(model, None, prompts, max_new_tokens=a.tokens, k_max=16, progress=False)
    trace.save(a.out)
    print(f"{trace!r}\nrecorded in {time.perf_counter() - t0:.1f} s → {a.out}")


if __name__ == "__main__":
    main()
