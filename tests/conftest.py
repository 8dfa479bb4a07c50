import warnings

import pytest
import torch

# One intra-op thread: the test models are tiny, and on 2 shared cores extra threads fight each other
# (measured ~20x slower per run under load).
torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=FutureWarning)

FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"]


@pytest.fixture(scope="session")
def family_models():
    from specter_lab import tiny_random_model

    return {f: tiny_random_model(f, seed=1) for f in FAMILIES}


# Copy-bound: a copy outlasts two layers (a100 compiled, DeepSeek-V2-Lite at full depth), a quarter of the experts
COPY_BOUND = dict(expert_budget=0.25, hardware="a100-40g-pcie4@compiled", cost_shape="deepseek-v2-lite@full")


def bundled_routing(prompts: int, tokens: int):
    """The bundled model's greedy routing of ``prompts`` held-out prompts: (rows [T, L, k], config, segments), as
    ``sl.import_routing`` takes them (each prompt's prefill rows, then its decode rows)."""
    import specter_lab as sl

    model, tok = sl.load_model("tiny")
    rec = sl.record(model, tok, sl.heldout_prompts(prompts), max_new_tokens=tokens, k_max=0, progress=False)
    rows, segs = rec.target_rows()
    return rows, rec.config, segs


def hf_greedy(model, ids, n):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def model():
    """A fresh tiny Qwen2-MoE per test module, so modules that break and repair it stay isolated."""
    from specter_lab import tiny_random_model

    return tiny_random_model("qwen2_moe", seed=1)


@pytest.fixture(scope="module")
def ref(model, request):
    """The lossless reference: HF greedy continuation of the module's ``IDS`` for ``N`` tokens."""
    return hf_greedy(model, request.module.IDS, request.module.N)
