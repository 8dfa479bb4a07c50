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
