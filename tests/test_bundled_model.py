"""The bundled, really trained tiny Qwen2-MoE in specter_lab/assets/tiny-moe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
ASSET = ROOT / "specter_lab" / "assets" / "tiny-moe"
PROMPTS = ROOT / "specter_lab" / "data" / "heldout_prompts.json"
MAX_BYTES = 24 * 1024 * 1024

pytestmark = pytest.mark.skipif(
    not (ASSET / "model.safetensors").is_file(), reason="bundled tiny-moe weights not present"
)


@pytest.fixture(scope="module")
def bundled():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ASSET)
    tok = AutoTokenizer.from_pretrained(ASSET)
    model.eval()
    return model, tok


@pytest.fixture(scope="module")
def prompts():
    return json.loads(PROMPTS.read_text())


def test_asset_files_and_size():
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "README.md"):
        assert (ASSET / name).is_file(), name
    total = sum(p.stat().st_size for p in ASSET.rglob("*") if p.is_file())
    assert total <= MAX_BYTES, total
    assert not any(p.name == "__pycache__" for p in ASSET.rglob("*"))
    cfg = json.loads((ASSET / "config.json").read_text())
    assert cfg["output_router_logits"] is False
    gen = json.loads((ASSET / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["eos_token_id"] == cfg["eos_token_id"]
    card = (ASSET / "README.md").read_text()
    for needle in ("Held-out", "json/", "heapq.py", "nats/token", "normalized entropy", "train_tiny_moe.py"):
        assert needle in card, needle


def test_heldout_prompts_file(prompts):
    assert isinstance(prompts, list) and 10 <= len(prompts) <= 20
    for p in prompts:
        assert isinstance(p, str) and p.strip()
        assert 1 <= len(p.strip("\n").splitlines()) <= 6
        compile_ok = p.lstrip().startswith(("def ", "class ", "import ", "from ", "@"))
        assert compile_ok, p


def test_architecture(bundled):
    model, tok = bundled
    cfg = model.config
    assert cfg.model_type == "qwen2_moe"
    moe_layers = [layer for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    assert len(moe_layers) >= 4
    assert cfg.num_experts >= 16
    assert cfg.num_experts_per_tok >= 2
    assert cfg.shared_expert_intermediate_size > 0
    for layer in moe_layers:
        mlp = layer.mlp
        assert mlp.gate.weight.shape == (cfg.num_experts, cfg.hidden_size)
        assert mlp.experts.gate_up_proj.shape[0] == cfg.num_experts
        assert hasattr(mlp, "shared_expert") and hasattr(mlp, "shared_expert_gate")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert tok.eos_token_id == cfg.eos_token_id
    assert len(tok) <= cfg.vocab_size


def test_routers_spread_over_experts(bundled, prompts):
    model, tok = bundled
    cfg = model.config
    moe_layers = [layer for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    seen: dict[int, list] = {i: [] for i in range(len(moe_layers))}
    handles = []
    for i, layer in enumerate(moe_layers):

        def hook(mod, inp, out, i=i):
            # transformers 5: the Qwen2Moe router returns (router_logits, top_k_weights, top_k_index)
            assert isinstance(out, tuple) and len(out) == 3
            idx = out[2]
            assert idx.shape[-1] == cfg.num_experts_per_tok
            seen[i].append(idx.reshape(-1))

        handles.append(layer.mlp.gate.register_forward_hook(hook))
    try:
        ids = tok(prompts[0], return_tensors="pt")
        with torch.no_grad():
            model(**ids)
    finally:
        for h in handles:
            h.remove()
    for i, chunks in seen.items():
        used = torch.cat(chunks).unique()
        assert used.numel() > cfg.num_experts_per_tok, (i, used.tolist())

    # Over all held-out prompts every layer's top-k assignments spread widely.
    counts = [torch.zeros(cfg.num_experts) for _ in moe_layers]
    def count_hook(i):
        def hook(mod, inp, out):
            counts[i].add_(torch.bincount(out[2].reshape(-1), minlength=cfg.num_experts))  # returns None

        return hook

    handles = [layer.mlp.gate.register_forward_hook(count_hook(i)) for i, layer in enumerate(moe_layers)]
    try:
        with torch.no_grad():
            for p in prompts:
                model(**tok(p, return_tensors="pt"))
    finally:
        for h in handles:
            h.remove()
    for i, c in enumerate(counts):
        frac = c / c.sum()
        nz = frac[frac > 0]
        ent = float(-(nz * nz.log()).sum() / torch.log(torch.tensor(float(cfg.num_experts))))
        assert ent > 0.7, (i, ent)
        assert int((c > 0).sum()) >= cfg.num_experts // 2, (i, c.tolist())


def test_greedy_generation(bundled, prompts):
    model, tok = bundled
    ids = tok(prompts[0], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    new = out[0, ids["input_ids"].shape[1]:]
    assert new.numel() > 0
    text = tok.decode(new, skip_special_tokens=True)
    assert text.strip()
    with torch.no_grad():
        again = model.generate(**ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(out, again)  # greedy is deterministic


def test_model_is_trained(bundled, prompts):
    """Held-out prompt loss is far below the uniform baseline log(vocab)."""
    model, tok = bundled
    text = "\n".join(prompts)
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < 0.6 * torch.log(torch.tensor(float(model.config.vocab_size))).item(), loss


def test_specter_lab_load_model(bundled, prompts):
    import specter_lab as sl

    if not hasattr(sl, "load_model"):
        pytest.skip("specter_lab.load_model not available")
    model, tok = sl.load_model("tiny")
    ref_model, ref_tok = bundled
    assert model.config.num_experts == ref_model.config.num_experts
    assert model.config.num_experts_per_tok == ref_model.config.num_experts_per_tok
    assert model.config.num_hidden_layers == ref_model.config.num_hidden_layers
    ids = tok(prompts[1], return_tensors="pt")
    ref_ids = ref_tok(prompts[1], return_tensors="pt")
    assert torch.equal(ids["input_ids"], ref_ids["input_ids"])
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=ids["input_ids"].to(device)).logits.float().cpu()
        ref_logits = ref_model(**ref_ids).logits.float()
    agree = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
