"""Resident memory kept to what a run touches (issue 33's 1.3× goal), checked on small checkpoints: a per-expert
checkpoint's experts are read into the model's fused parameters without mapping (and load to the same weights as
transformers' own path, in every family it saves per expert); a mapped tensor's file pages are handed back without
changing a value; the draft's quantizer hands a fused checkpoint's expert pages back and builds the same draft.
The real-size figures are ``scripts/real_checkpoint.py``'s (docs/measured/real_checkpoint_olmoe.md)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

import specter_lab as sl
from specter_lab.model.memory import QUANT_CHUNK_BYTES, plan_memory
from specter_lab.model.pages import file_backed, release_file_pages
from specter_lab.run import quant
from specter_lab.run.quant import DraftExperts, QuantSpec

sys.path.insert(0, str(Path(__file__).parent))
from checkpoint_fuzz import make_checkpoint  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self (Linux)")

# experts large enough to tell from the dense part: 2 layers x 16 experts x 3 x 256 x 512 bf16 = 25 MiB
SIZES = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_experts=16, num_experts_per_tok=2,
             vocab_size=512)


def _rss_file() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stored(w) -> tuple:
    """The tensors a draft weight holds, whatever its layout (int4 kernel, packed codes, dense)."""
    if hasattr(w, "scales_zeros"):
        return w.packed, w.scales_zeros
    if hasattr(w, "qt"):
        return (w.qt.dequantize(w.index),)
    return (w,)


def _experts(model):
    info = sl.inspect_model(model)
    return [getattr(l.experts, n) for l in info.layers for n in l.param_names]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("peak")
    out = {layout: make_checkpoint(base / layout, layout=layout, shard_bytes=8_000_000, **SIZES)
           for layout in ("per-expert", "fused")}
    for f in base.rglob("*.safetensors"):  # written back: dirty page-cache pages cannot be handed back yet
        _fsync(f)
    yield out
    shutil.rmtree(base, ignore_errors=True)


def test_per_expert_experts_are_read_without_mapping(ckpts):
    """The experts are anonymous copies (not views of the files), the load maps no expert page (file pages resident
    grow by less than the experts' bytes), and the weights and outputs equal transformers' own load."""
    from transformers import AutoModelForCausalLM

    path = ckpts["per-expert"]
    before = _rss_file()
    model, _ = sl.load_model(path)
    grown = _rss_file() - before
    experts = _experts(model)
    expert_bytes = sum(t.nbytes for t in experts)
    assert all(file_backed(t) is None for t in experts)
    assert grown < expert_bytes / 4, f"file pages grew {grown:,} B at load; experts are {expert_bytes:,} B"
    assert file_backed(model.get_input_embeddings().weight) is not None  # the dense part stays mapped
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    a, b = model.state_dict(), ref.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False),
                       ref.generate(ids, max_new_tokens=4, do_sample=False))
    plan = plan_memory(path)
    assert not plan.experts_mapped and "read once into RAM" in dict((t, n) for t, _, n in plan.terms)["routed experts"]


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"])
def test_per_expert_reader_equals_transformers_in_every_family(tmp_path, family):
    """Each family transformers saves per expert (its own names, renamings and gate/up order) loads to the same
    weights through the reader as through transformers' concatenation."""
    from transformers import AutoModelForCausalLM

    model = sl.tiny_random_model(family, seed=1).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size=200_000)
    ours, _ = sl.load_model(tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    a, b = ours.state_dict(), ref.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), family
    assert all(file_backed(t) is None for t in _experts(ours))


def test_released_pages_come_back_with_the_same_values(tmp_path):
    """A mapped tensor's pages leave the resident set and read back the same; anonymous memory is never advised."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    save_file({"w": torch.randn(8, 1024, 1024, dtype=torch.bfloat16)}, str(tmp_path / "w.safetensors"))
    _fsync(tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        t = f.get_tensor("w")
    assert file_backed(t) == str((tmp_path / "w.safetensors").resolve())
    total = float(t.float().sum())  # touches every page
    held = _rss_file()
    assert release_file_pages(t) >= t.nbytes
    assert held - _rss_file() > t.nbytes * 3 // 4
    assert float(t.float().sum()) == total
    anon = torch.randn(1024, 1024)
    copy = anon.clone()
    assert file_backed(anon) is None and release_file_pages(anon) == 0 and torch.equal(anon, copy)


def test_the_quantizer_hands_mapped_expert_pages_back(ckpts, monkeypatch):
    """Quantizing a fused (mapped) checkpoint's experts in several chunks per tensor releases every expert's pages
    (file pages resident drop by most of the experts' bytes), and the draft is the same as one quantized from
    an anonymous copy; a specter run on it still equals HF generate."""
    monkeypatch.setattr(quant, "QUANT_CHUNK_BYTES", 1 << 20)  # several chunks per fused tensor
    model, _ = sl.load_model(ckpts["fused"])
    experts = _experts(model)
    expert_bytes = sum(t.nbytes for t in experts)
    assert all(file_backed(t) is not None for t in experts)
    assert quant._chunk_experts(experts[0]) < experts[0].shape[0]
    info = sl.inspect_model(model)
    spec = QuantSpec()
    for t in experts:
        float(t.detach().float().sum())  # every expert page resident, as after a full pass
    held = _rss_file()
    draft = DraftExperts(info, spec, pack=True)
    assert draft.released >= expert_bytes
    assert held - _rss_file() > expert_bytes * 3 // 4
    copy, _ = sl.load_model(ckpts["per-expert"])
    ref = DraftExperts(sl.inspect_model(copy), spec, pack=True)
    assert ref.released == 0
    for layer in range(len(info.layers)):
        for e in (0, 7, 15):
            for name, w in draft.weights(layer, e).items():
                got, want = _stored(w), _stored(ref.weights(layer, e)[name])
                assert all(torch.equal(a, b) for a, b in zip(got, want)), (layer, e, name)
    ids = [5, 6, 7, 8]
    want = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)[0, len(ids):].tolist()
    got = sl.Engine(model, None, "specter", expert_budget=0.5).generate(ids, max_new_tokens=4).token_ids
    assert got == want


def test_the_plan_counts_the_quantizer_chunks_it_uses(ckpts):
    plan = plan_memory(ckpts["fused"], draft=QuantSpec())
    assert 0 < plan.quantizer_bytes <= 4 * QUANT_CHUNK_BYTES
