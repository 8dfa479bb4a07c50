"""Checkpoint folders: the memory a load and a run will hold is known from headers alone and equals what a loaded
model holds; every bad checkpoint is refused with a CheckpointError before any weight is read; a corrupted folder
(Hypothesis, fixed seeds) is refused at load or loads and runs, never a crash or a hang."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specter_lab as sl
from specter_lab.errors import CheckpointError, NotEnoughMemory
from specter_lab.model import BUNDLED, loading
from specter_lab.model.checkpoint_check import check_checkpoint
from specter_lab.model.memory import plan_memory
from specter_lab.run.quant import DraftExperts

sys.path.insert(0, str(Path(__file__).parent))
from checkpoint_fuzz import MUTATIONS, SIZES, corrupt, make_checkpoint, outcome  # noqa: E402

IDS = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Two small multi-shard bf16 checkpoints of the same random OLMoE: per-expert (as transformers saves it) and
    fused (the model's own [E, ...] tensors)."""
    base = tmp_path_factory.mktemp("ckpt")
    out = {layout: make_checkpoint(base / layout, layout=layout) for layout in ("per-expert", "fused")}
    yield out
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def no_weights_read(monkeypatch):
    """Fail the test if transformers is asked to load weights (a refusal must come before)."""
    import transformers

    def refuse(*a, **k):
        raise AssertionError("from_pretrained was called: the refusal came after work started")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(loading, "_load_per_expert", refuse)  # the per-expert reader reads weights too


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _file_backed(t: torch.Tensor, folder: Path) -> bool:
    """Whether ``t``'s storage lies in a memory mapping of a file in ``folder`` (Linux /proc/self/maps)."""
    ptr = t.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= ptr < hi:
            return len(parts) >= 6 and Path(parts[5]).parent == folder.resolve()
    return False


# ------------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("layout", ["per-expert", "fused"])
@pytest.mark.parametrize("dtype", [None, "float32"])
def test_memory_plan_equals_the_loaded_bytes(ckpts, layout, dtype):
    """Dense and routed-expert bytes from headers alone equal what the loaded model's parameters hold, at the
    checkpoint's dtype (kept by default: bf16 stays bf16) or the asked one."""
    path = ckpts[layout]
    plan = plan_memory(path, dtype=dtype)
    model, tok = sl.load_model(path, dtype=dtype)
    assert tok is None
    assert model.dtype == (torch.bfloat16 if dtype is None else torch.float32)
    assert plan.dtype == str(model.dtype).replace("torch.", "")
    info = sl.inspect_model(model)
    routed = [getattr(l.experts, n) for l in info.layers for n in l.param_names]
    assert plan.expert_bytes == _bytes(routed)
    assert plan.dense_bytes + plan.expert_bytes == _bytes(model.parameters())
    assert plan.experts_mapped == (layout == "fused" and dtype is None)
    if sys.platform.startswith("linux"):  # the plan's "mapped" is what the OS really did
        assert all(_file_backed(t, path) for t in routed) == plan.experts_mapped
    assert plan.required == plan.dense_bytes + (0 if plan.experts_mapped else plan.expert_bytes)


def test_kv_draft_and_slots_terms_equal_what_a_run_holds(ckpts):
    """The KV cache term equals a real cache's bytes after a forward of ``context`` tokens; the draft term equals
    DraftExperts' stored bytes on the CPU (dequantized once) and its packed bytes on a device; the slots term is
    the budget."""
    path = ckpts["fused"]
    model, _ = sl.load_model(path)
    spec = sl.QuantSpec(4, 64)
    plan = plan_memory(path, context=40, draft=spec, expert_budget=0.5)
    out = model(torch.arange(40).unsqueeze(0) % SIZES["vocab_size"], use_cache=True)
    cache = out.past_key_values
    assert plan.kv_bytes == _bytes([t for layer in cache.layers for t in (layer.keys, layer.values)])
    draft = DraftExperts(sl.inspect_model(model), spec, device="cpu")
    assert plan.draft_bytes == draft.stored_bytes()
    assert plan_memory(path, draft=spec, device="cuda").draft_bytes == draft.packed_bytes
    assert plan.slot_bytes == plan.expert_bytes // 2
    assert plan.quantizer_bytes > 0
    assert plan.required == sum(b for _, b, _ in plan.terms) - plan.expert_bytes  # fused + own dtype: mapped
    text = str(plan)
    for term in ("dense weights", "routed experts", "draft", "KV cache (40 tokens)", "store slots", "fits"):
        assert term in text
    assert "<table>" in plan._repr_html_()


def test_too_big_is_refused_before_loading_with_the_numbers(ckpts, no_weights_read):
    plan = plan_memory(ckpts["per-expert"], dtype="float32")
    with pytest.raises(NotEnoughMemory) as e:
        sl.load_model(ckpts["per-expert"], dtype="float32", memory_limit=plan.required - 1)
    msg = str(e.value)
    assert e.value.plan.required == plan.required
    assert "routed experts" in msg and "DOES NOT FIT" in msg
    assert "load in the checkpoint's own dtype" in msg and "experts read from disk" in msg
    assert isinstance(e.value, ValueError)


def test_a_limit_that_fits_loads(ckpts):
    """An allowance smaller than the weights: the fused checkpoint's experts stay mapped (paged in from disk on
    use), so it loads and runs lossless; the per-expert one would copy them, so it is refused before loading."""
    plan = plan_memory(ckpts["fused"])
    assert plan.required < plan.dense_bytes + plan.expert_bytes
    with pytest.raises(NotEnoughMemory, match="experts read from disk"):
        sl.load_model(ckpts["per-expert"], memory_limit=plan.required)
    model, _ = sl.load_model(ckpts["fused"], memory_limit=plan.required)
    ref = model.generate(torch.tensor([IDS]), max_new_tokens=4, do_sample=False)[0, len(IDS):].tolist()
    assert sl.Engine(model, None, "lru", cache_slots=2).generate(IDS, max_new_tokens=4).token_ids == ref


def test_bundled_tiny_model_is_float32_and_stays_float32():
    """The bundled checkpoint is stored in float32: the default keeps it (the lossless tests' precision)."""
    assert check_checkpoint(BUNDLED["tiny"]).dtype == torch.float32
    model, _ = sl.load_model("tiny")
    assert model.dtype == torch.float32


# ------------------------------------------------------------------------------------------- bad checkpoints
def _edit_json(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _first_shard(p: Path) -> Path:
    return sorted(p.glob("*.safetensors"))[0]


def _dense(p: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    for f in p.iterdir():
        f.unlink()
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(p)


def _drop_a_tensor(p: Path) -> None:
    """Rewrite the shard holding one norm weight without it, and the index without its entry."""
    from safetensors.torch import load_file, save_file

    name = "model.layers.0.input_layernorm.weight"
    index = p / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    shard = p / doc["weight_map"].pop(name)
    tensors = load_file(str(shard))
    del tensors[name]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index.write_text(json.dumps(doc))


def _cut_last_byte(p: Path) -> None:
    f = _first_shard(p)
    with f.open("r+b") as h:
        h.truncate(f.stat().st_size - 1)


def _corrupt_header(p: Path) -> None:
    f = _first_shard(p)
    data = bytearray(f.read_bytes())
    data[9] = 0xFF  # inside the JSON header: not UTF-8 any more
    f.write_bytes(bytes(data))


BAD = {
    "missing shard": (lambda p: _first_shard(p).unlink(), r"weight_map names 'model-00001-of-\d+.safetensors'.*no "
                      r"such file"),
    "truncated shard": (_cut_last_byte, r"truncated safetensors file: its tensors need [\d,]+ bytes of data but the "
                        r"file holds [\d,]+"),
    "empty shard": (lambda p: _first_shard(p).write_bytes(b""), r"corrupt or truncated safetensors file \(0 bytes"),
    "index names a missing file": (lambda p: _edit_json(
        p / "model.safetensors.index.json",
        lambda d: d["weight_map"].update({next(iter(d["weight_map"])): "model-00042-of-00099.safetensors"})),
        r"weight_map names 'model-00042-of-00099.safetensors' \(1 tensors\)"),
    "shards without their index": (lambda p: (p / "model.safetensors.index.json").unlink(),
                                   r"\.safetensors files .* but no model.safetensors.index.json"),
    "shape disagrees with config": (lambda p: _edit_json(p / "config.json", lambda d: d.update(intermediate_size=512)),
                                    r"has shape \[\d+, \d+\] but config.json implies \[\d+, \d+\]"),
    "fewer experts in config": (lambda p: _edit_json(p / "config.json", lambda d: d.update(num_experts=4)),
                                r"is expert [4-7], but config.json gives 4 experts per layer"),
    "more experts in config": (lambda p: _edit_json(p / "config.json", lambda d: d.update(num_experts=16)),
                               r"'model.layers.0.mlp.gate.weight' has shape \[8, 128\] but config.json implies "
                               r"\[16, 128\]"),
    "a tensor missing": (_drop_a_tensor, r"no shard holds 'model.layers.0.input_layernorm.weight'"),
    "top-k beyond experts": (lambda p: _edit_json(p / "config.json", lambda d: d.update(num_experts_per_tok=9)),
                             r"num_experts_per_tok = 9; expected an integer in \[1, 8\]"),
    "config not MoE": (_dense, r"model LlamaForCausalLM has no MoE layers"),
    "corrupt header": (_corrupt_header, r"corrupt safetensors header \(not valid JSON"),
    "config not JSON": (lambda p: (p / "config.json").write_text("{\"model_type\": "), r"config.json: not valid JSON"),
    "config field of the wrong type": (lambda p: _edit_json(p / "config.json", lambda d: d.update(hidden_act=None)),
                                       r"config.json: transformers cannot build model_type 'olmoe'.*hidden_act"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_is_refused_before_any_weight_is_read(ckpts, tmp_path, case, no_weights_read):
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["per-expert"], bad)
    mutate, match = BAD[case]
    mutate(bad)
    with pytest.raises(CheckpointError, match=match) as e:
        sl.load_model(bad)
    assert e.value.path is not None and str(bad) in e.value.path  # names the file at fault
    with pytest.raises(CheckpointError):  # the same from the accounting alone
        plan_memory(bad)


def test_a_refusal_leaves_no_open_file(ckpts, tmp_path):
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd")
    before = len(os.listdir("/proc/self/fd"))
    for i, case in enumerate(sorted(BAD)):
        bad = tmp_path / f"bad{i}"
        shutil.copytree(ckpts["per-expert"], bad)
        BAD[case][0](bad)
        with pytest.raises(CheckpointError):
            sl.load_model(bad)
    assert len(os.listdir("/proc/self/fd")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"bad{i}" for i in range(len(BAD)))  # no temp files


# ------------------------------------------------------------------------------------------- fuzz
FUZZ_EXAMPLES = int(os.environ.get("SPECTER_FUZZ_EXAMPLES", "30"))


@settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(sorted(MUTATIONS)),
       layout=st.sampled_from(["per-expert", "fused"]))
def test_a_corrupted_folder_is_refused_or_runs(ckpts, tmp_path, seed, kind, layout):
    """Each corruption (a truncated, flipped or removed shard, an edited index, edited config fields): refused with
    a project error at load, or loaded and run; never refused only by the run, never another exception, never past
    30 s."""
    what = corrupt(ckpts[layout], tmp_path / "x", seed, kind)
    result, detail = outcome(tmp_path / "x", timeout_s=30)
    assert result in ("refused", "accepted"), f"{what}: {result} {detail}"


def test_fuse_experts_turns_a_published_layout_into_a_mapped_one(ckpts, tmp_path):
    """A per-expert checkpoint rewritten with fused experts (one layer at a time) loads to the same weights and
    output, and its experts are then mapped from the files instead of copied."""
    fused = sl.fuse_experts(ckpts["per-expert"], tmp_path / "fused")
    assert check_checkpoint(fused).layout == "fused"
    plan = plan_memory(fused)
    assert plan.experts_mapped and plan.expert_bytes == plan_memory(ckpts["per-expert"]).expert_bytes
    a, _ = sl.load_model(ckpts["per-expert"])
    b, _ = sl.load_model(fused)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    if sys.platform.startswith("linux"):
        info = sl.inspect_model(b)
        assert all(_file_backed(getattr(l.experts, n), fused) for l in info.layers for n in l.param_names)
    ref = a.generate(torch.tensor([IDS]), max_new_tokens=4, do_sample=False)[0, len(IDS):].tolist()
    assert sl.Engine(b, None, "specter", cache_slots=2).generate(IDS, max_new_tokens=4).token_ids == ref
    with pytest.raises(CheckpointError, match="already fused"):
        sl.fuse_experts(fused, tmp_path / "again")
    assert not (tmp_path / "again").exists()


# ------------------------------------------------------------------------------------------- pinned staging
def test_staging_ring_copies_every_expert_exactly_and_stays_bounded():
    """The ring that carries unpinned (mapped) experts to the device: each copy lands exactly, buffers are reused
    round-robin, and what it holds is ``buffers`` experts whatever the number copied (unpinned here: the CPU)."""
    from specter_lab.model.placement import PinnedStaging

    ring = PinnedStaging(buffers=2, pin=False)
    g = torch.Generator().manual_seed(0)
    host = {"gate_up_proj": torch.randn(6, 8, 4, generator=g), "down_proj": torch.randn(6, 4, 4, generator=g)}
    for e in range(6):
        dst = {n: torch.empty_like(t[0]) for n, t in host.items()}
        ring.copy_into({n: t[e] for n, t in host.items()}, dst)
        assert all(torch.equal(dst[n], host[n][e]) for n in host)
    assert ring.copies == 6
    assert ring.nbytes == 2 * sum(t[0].numel() * t.element_size() for t in host.values())
    with pytest.raises(ValueError, match="buffers=0"):
        PinnedStaging(buffers=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only: pinned staging on a real copy stream")
def test_unpinned_experts_run_through_the_staging_ring_on_cuda(ckpts):
    """Experts too big to pin (pin_limit=0) stay unpinned where they lie; the CUDA run copies them through the
    bounded ring and stays lossless."""
    from specter_lab.model.placement import place_for_offload

    cpu, _ = sl.load_model(ckpts["fused"])
    ref = cpu.generate(torch.tensor([IDS]), max_new_tokens=6, do_sample=False)[0, len(IDS):].tolist()
    model, _ = sl.load_model(ckpts["fused"])
    place_for_offload(model, pin_limit=0)
    info = sl.inspect_model(model)
    assert not any(getattr(l.experts, n).is_pinned() for l in info.layers for n in l.param_names)
    for strategy in ("lru", "specter"):
        r = sl.Engine(model, None, strategy, cache_slots=2, hardware="cuda").generate(IDS, max_new_tokens=6)
        assert r.token_ids == ref, strategy


def test_a_gpu_plan_splits_device_and_host_memory(ckpts):
    """With device='cuda' (no GPU needed: nothing is allocated) the dense weights, packed draft, KV cache and
    slots count against the GPU allowance and the experts against host RAM; either short is refused, naming it."""
    from specter_lab.model.memory import check_fits

    spec = sl.QuantSpec(4, 64)
    cpu = plan_memory(ckpts["fused"], draft=spec, context=40, expert_budget=0.5)
    gpu = plan_memory(ckpts["fused"], device="cuda", draft=spec, context=40, expert_budget=0.5, device_limit="1GiB")
    assert gpu.device_required == gpu.dense_bytes + gpu.draft_bytes + gpu.kv_bytes + gpu.slot_bytes
    assert gpu.draft_bytes < cpu.draft_bytes  # packed on the device, dequantized on the CPU
    assert gpu.required == gpu.expert_bytes + gpu.quantizer_bytes and not gpu.experts_mapped  # pinned: it fits
    assert gpu.fits
    small = plan_memory(ckpts["fused"], device="cuda", draft=spec, context=40, expert_budget=0.5,
                        device_limit=gpu.device_required - 1)
    with pytest.raises(NotEnoughMemory, match=r"of GPU memory but .* is allowed \(device_limit\)") as e:
        check_fits(small)
    assert "fuse_experts" not in str(e.value)  # host RAM fits: only the GPU's fixes
    big = plan_memory(ckpts["fused"], device="cuda", device_limit="1GiB", memory_limit=gpu.expert_bytes)
    assert big.experts_mapped and big.required < big.expert_bytes  # too big to pin: mapped, staged


def test_a_quantized_checkpoint_is_sized_at_the_dtype_it_loads_in(ckpts, tmp_path):
    """Packed weights (a quantization_config) are dequantized at load: the plan counts the model's parameters at the
    run's dtype, not the file's bytes, and never calls them mapped."""
    q = tmp_path / "q"
    shutil.copytree(ckpts["fused"], q)
    _edit_json(q / "config.json", lambda d: d.update(quantization_config={"quant_method": "mxfp4"}))
    plain, packed = plan_memory(ckpts["fused"]), plan_memory(q)
    assert packed.expert_bytes == plain.expert_bytes and packed.dense_bytes == plain.dense_bytes  # bf16 files here
    assert not packed.experts_mapped and plain.experts_mapped


def test_specter_lab_run_prints_the_plan_before_loading(tmp_path, capsys):
    from specter_lab.cli import main

    folder = make_checkpoint(tmp_path / "m", layout="fused", vocab_size=4096)  # the bundled tokenizer's vocabulary
    for f in BUNDLED["tiny"].glob("tokenizer*"):
        shutil.copy(f, folder / f.name)
    assert main(["run", "--model", str(folder), "--strategy", "lru", "--max-new-tokens", "2", "--cache-slots",
                 "2"]) == 0
    out = capsys.readouterr().out
    assert out.index("memory plan for") < out.index("strategy lru")
    assert "mapped from the files" in out and "store slots" in out


@pytest.mark.parametrize("part, fused, want", [
    ("gate_proj.weight", ("gate_up_proj", "down_proj"), ("gate_up_proj", 0, 2)),
    ("up_proj.weight", ("gate_up_proj", "down_proj"), ("gate_up_proj", 1, 2)),
    ("down_proj.weight", ("gate_up_proj", "down_proj"), ("down_proj", 0, 1)),
    ("w1.weight", ("gate_up_proj", "down_proj"), ("gate_up_proj", 0, 2)),  # Mixtral's names
    ("w3.weight", ("gate_up_proj", "down_proj"), ("gate_up_proj", 1, 2)),
    ("w2.weight", ("gate_up_proj", "down_proj"), ("down_proj", 0, 1)),
    ("up_proj.weight", ("up_proj", "down_proj"), ("up_proj", 0, 1)),  # experts without a gate
    ("gate_proj.weight", ("up_proj",), ("up_proj", 0, 1)),
    ("down_proj.weight", ("gate_up_proj",), None),  # the model has no parameter for it
    ("router.weight", ("gate_up_proj", "down_proj"), None),
])
def test_expert_part_is_the_one_reading_of_per_expert_names(part, fused, want):
    """The check, the per-expert load and the disk tier place a per-expert tensor by this one function."""
    from specter_lab.model.checkpoint_check import expert_part

    assert expert_part(part, fused) == want
