"""Smoke test for scripts/train_tiny_moe.py: a few steps on a few files, then load + generate."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_tiny_moe.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("train_tiny_moe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heldout_split_is_disjoint():
    mod = _load_script()
    train, held = mod.collect_files()
    assert train and held
    assert not set(train) & set(held)
    root = mod.stdlib_root()
    rel_held = {p.relative_to(root).as_posix() for p in held}
    assert "heapq.py" in rel_held and "json/__init__.py" in rel_held
    rel_train = [p.relative_to(root).as_posix() for p in train]
    for rel in rel_train:
        assert not mod.is_heldout(rel)
        assert "site-packages" not in rel
        # the held-out modules' own unit tests quote their code: never trained on
        assert not mod._matches(rel, mod.HELDOUT_TESTS), rel
    if (root / "test" / "test_heapq.py").is_file():
        assert "test/test_heapq.py" not in rel_train
        assert any(r.startswith("test/") for r in rel_train)  # the rest of the suite is in
    no_tests, held2 = mod.collect_files(tests=False)
    assert held2 == held and set(no_tests) < set(train)
    assert not any(mod.is_test(p.relative_to(root).as_posix()) for p in no_tests)


def test_generated_codec_tables_are_skipped():
    mod = _load_script()
    root = mod.stdlib_root()
    table = root / "encodings" / "cp1252.py"
    if not table.is_file():
        pytest.skip("this interpreter has no encodings/cp1252.py")
    assert mod.read_text(table) is None
    assert mod.read_text(root / "heapq.py")


@pytest.mark.timeout(120)
def test_train_smoke(tmp_path):
    mod = _load_script()
    out = tmp_path / "tiny"
    threads = torch.get_num_threads()
    info = mod.main(
        [
            "--out", str(out),
            "--max-files", "6",
            "--steps", "3",
            "--minutes", "1",
            "--seed", "0",
            "--threads", str(threads),
            "--batch", "2",
            "--seq-len", "32",
            "--vocab-size", "320",
            "--hidden-size", "32",
            "--num-hidden-layers", "2",
            "--num-attention-heads", "4",
            "--num-key-value-heads", "2",
            "--num-experts", "4",
            "--num-experts-per-tok", "2",
            "--moe-intermediate-size", "16",
            "--shared-expert-intermediate-size", "32",
            "--eval-chunks", "2",
            "--log-every", "1",
        ]
    )
    assert info["steps"] == 3
    assert info["tokens_seen"] == 3 * 2 * 32
    assert info["val_loss"] > 0 and info["val_tokens"] > 0
    assert len(info["usage"]) == 2
    bk = info["by_kind"]  # the held-out file (bisect.py) has docstrings and code
    assert 0 < bk["prose_share"] < 1 and bk["prose_loss"] > 0 and bk["code_loss"] > 0

    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "README.md"):
        assert (out / name).is_file(), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_moe"
    assert cfg["output_router_logits"] is False
    gen_cfg = json.loads((out / "generation_config.json").read_text())
    assert gen_cfg["do_sample"] is False and gen_cfg["eos_token_id"] == cfg["eos_token_id"]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.num_experts == 4 and model.config.num_experts_per_tok == 2
    assert tok.eos_token == mod.EOS and tok.eos_token_id == model.config.eos_token_id
    text = "def f(x):\n    return x\n"
    ids = tok(text, return_tensors="pt")
    assert tok.decode(ids["input_ids"][0]) == text  # byte-level round trip
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]
    assert "heapq.py" in (out / "README.md").read_text()

    # Stage 2: continue from it with its tokenizer (reused, not retrained).
    out2 = tmp_path / "tiny2"
    # (with the options the bundled model was trained with: bf16 autocast, library-weighted sampling, bf16 storage)
    info2 = mod.main(["--init-from", str(out), "--out", str(out2), "--max-files", "6", "--steps", "2",
                      "--minutes", "1", "--batch", "2", "--seq-len", "32", "--eval-chunks", "2",
                      "--threads", str(threads), "--bf16", "--lib-weight", "0.5", "--save-dtype", "bfloat16"])
    assert info2["steps"] == 2 and info2["init_from"] == str(out) and info2["revived"] == []
    assert info2["val_loss_sliding"] > 0
    from safetensors import safe_open

    with safe_open(str(out2 / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    card2 = (out2 / "README.md").read_text()
    assert "stored in bfloat16" in card2 and "probability 0.5" in card2 and "bfloat16 autocast" in card2
    assert AutoTokenizer.from_pretrained(out2).get_vocab() == tok.get_vocab()
    assert "continued from" in (out2 / "README.md").read_text()

    # Expert splitting: a threshold between the least and the most used expert of layer 0 re-seeds the least
    # used one(s) from a busier expert, router row and weights alike.
    ids = mod.encode_corpus(tok, [t for t in map(mod.read_text, mod.collect_files()[0][:6]) if t])
    _, _, counts = mod.evaluate(model, ids[: 33 * 8 + 1], 32, return_counts=True)
    share = counts[0].double() / counts[0].sum()
    below = float(share.min() + share.max()) / 2
    revived = mod.revive_experts(model, ids, 32, below, seed=0, chunks=8)
    assert revived and all(s < below and d != e for _, e, d, s in revived)
    layer0, expert, donor, _ = revived[0]
    mlp = model.model.layers[layer0].mlp
    assert torch.allclose(mlp.gate.weight[expert], mlp.gate.weight[donor], rtol=0.05, atol=1e-3)
    assert torch.allclose(mlp.experts.down_proj[expert], mlp.experts.down_proj[donor], rtol=0.1, atol=1e-3)


def test_sliding_eval_matches_chunks_and_scores_every_token_once():
    mod = _load_script()
    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=32)
    model = transformers.Qwen2MoeForCausalLM(cfg)
    ids = torch.randint(0, 64, (16 * 5 + 1,))
    chunked, n_chunked, _ = mod.evaluate(model, ids, 16)
    same, n_same = mod.evaluate_sliding(model, ids, 16, 16)  # stride = window: the same chunks
    assert n_same == n_chunked == 80 and same == pytest.approx(chunked, rel=1e-5)
    for length, stride in ((100, 5), (81, 4), (17, 8)):
        loss, n = mod.evaluate_sliding(model, torch.randint(0, 64, (length,)), 16, stride)
        assert n == length - 1 and loss > 0  # every target scored exactly once


def test_prose_mask_marks_comments_and_docstrings_only():
    mod = _load_script()
    text = 'def f(x):\n    """Doc\n    string."""\n\x0c\n    # note\n    return "s" + x  # tail\n'
    marked = "".join(c for c, m in zip(text, mod.prose_mask(text)) if m)
    assert marked == '"""Doc\n    string."""# note# tail'
