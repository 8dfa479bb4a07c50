"""Bad input: every public entry point (sl.load_model, sl.Engine, engine.generate, sl.QuantSpec, the CLI) rejects a
bad argument before doing any work, with an error that names the argument, the value and what is accepted; and
after any such error the model is still a plain HF model that generates exactly what HF generates."""

import re

import pytest
import torch
import transformers as tf

import specter_lab as sl
from conftest import hf_greedy
from specter_lab.cli import main as cli_main

IDS = [5, 6, 7, 8, 9]
N = 8
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present: hardware='cuda' is valid here")


@pytest.fixture(scope="module")
def dense_model():
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory, dense_model):
    d = tmp_path_factory.mktemp("dense")
    dense_model.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, model):
    d = tmp_path_factory.mktemp("moe")
    model.save_pretrained(d)
    return d


def assert_intact(model, ref, impl_before):
    """The model is a plain HF model again and both HF and a fresh Engine generate the reference."""
    assert model.config._experts_implementation == impl_before
    assert model.get_experts_implementation()[""] == impl_before
    for layer in sl.inspect_model(model).layers:
        assert "_specter_runtime" not in layer.experts.__dict__
    assert hf_greedy(model, IDS, N) == ref
    assert sl.Engine(model, None, "specter", cache_slots=3).generate(IDS, max_new_tokens=N).token_ids == ref


# --------------------------------------------------------------------------------------------- sl.Engine

ENGINE_CASES = [
    (dict(strategy="bogus"), ValueError, r"strategy='bogus'.*use one of.*'specter'"),
    (dict(strategy=3), ValueError, r"strategy=3"),
    (dict(hardware="pcie9"), ValueError, r"hardware='pcie9'.*rtx4090-pcie4"),
    (dict(hardware=3), TypeError, r"hardware="),
    (dict(cost_shape="gpt-5"), ValueError, r"cost_shape='gpt-5'.*mixtral-8x7b"),
    (dict(cache_slots=0), ValueError, r"cache_slots=0.*at least 1"),
    (dict(cache_slots=-2), ValueError, r"cache_slots=-2.*at least 1"),
    (dict(cache_slots=2.5), ValueError, r"cache_slots=2.5.*integer"),
    (dict(cache_slots=True), ValueError, r"cache_slots=True"),
    (dict(cache_slots=2, expert_budget=0.5), ValueError, r"expert_budget=.*cache_slots="),
    (dict(expert_budget=0.01), ValueError, r"expert_budget=0.01.*too small.*'specter'.*at least [\d,]+ B"),
    (dict(strategy="lru", expert_budget=0.01), ValueError, r"expert_budget=0.01.*too small.*'lru'.*at least"),
    (dict(expert_budget=0.0), ValueError, r"expert_budget=0.0.*\(0, 1\]"),
    (dict(expert_budget=-3), ValueError, r"expert_budget=-3"),
    (dict(expert_budget=float("nan")), ValueError, r"expert_budget=nan"),
    (dict(expert_budget="lots"), ValueError, r"expert_budget='lots'.*2GiB"),
    (dict(expert_budget="0GiB"), ValueError, r"expert_budget='0GiB'.*positive"),
    (dict(expert_budget=[0.5]), ValueError, r"expert_budget=\[0.5\]"),
    (dict(k=0), ValueError, r"k=0.*>= 1 or 'auto'"),
    (dict(k=-1), ValueError, r"k=-1"),
    (dict(k=2.5), ValueError, r"k=2.5"),
    (dict(k="8"), ValueError, r"k='8'"),
    (dict(k=True), ValueError, r"k=True"),
    (dict(eviction="fifo"), ValueError, r"eviction='fifo'.*'lru'"),
    (dict(prefetch="psychic"), ValueError, r"prefetch='psychic'.*'draft'"),
    (dict(chunking=(1.5,)), ValueError, r"chunking=\(1.5,\).*\[0, 1\]"),
    (dict(chunking=(0.2, "x")), ValueError, r"chunking=\(0.2, 'x'\)"),
    (dict(chunking=()), ValueError, r"chunking=\(\)"),
    (dict(chunking="sometimes"), ValueError, r"chunking='sometimes'.*'adaptive'"),
    (dict(draft=42), TypeError, r"draft=42.*QuantSpec"),
    pytest.param(dict(hardware="cuda"), ValueError, r"hardware='cuda'.*CUDA.*rtx4090-pcie4", marks=NO_CUDA),
]


@pytest.mark.parametrize("kwargs,exc,match", ENGINE_CASES, ids=lambda v: repr(v) if isinstance(v, dict) else None)
def test_engine_rejects_bad_arguments(model, ref, kwargs, exc, match):
    before = model.config._experts_implementation
    with pytest.raises(exc, match=match):
        sl.Engine(model, None, **kwargs)
    assert model.config._experts_implementation == before


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(k=0), ValueError, r"k=0.*>= 1 or 'auto'"),
    (dict(eviction="fifo"), ValueError, r"eviction='fifo'"),
    (dict(prefetch="psychic"), ValueError, r"prefetch='psychic'"),
    (dict(chunking=(2.0,)), ValueError, r"chunking=\(2.0,\)"),
    (dict(draft=42), TypeError, r"draft=42"),
    (dict(expert_budget="lots"), ValueError, r"expert_budget='lots' is not a size"),
    (dict(hardware="pcie9"), ValueError, r"hardware='pcie9'"),
    (dict(cost_shape="gpt-5"), ValueError, r"cost_shape='gpt-5'"),
    (dict(cache_slots=2), ValueError, r"strategy='auto'.*expert_budget=, not cache_slots="),
])
def test_auto_strategy_rejects_bad_arguments_before_planning(model, monkeypatch, kwargs, exc, match):
    """strategy='auto' runs a planner (calibration runs on the model): a bad argument must fail before it."""
    import specter_lab.run.engine as engine

    def no_planning(*a, **k):
        raise AssertionError("the planner ran before the arguments were checked")

    monkeypatch.setattr(engine, "_AUTO_PLANNER", [no_planning])
    with pytest.raises(exc, match=match):
        sl.Engine(model, None, "auto", **kwargs)


def test_engine_rejects_models_without_moe_layers(dense_model):
    with pytest.raises(ValueError, match=r"model LlamaForCausalLM has no MoE layers.*Mixtral"):
        sl.Engine(dense_model)
    qwen2 = tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match=r"model Qwen2ForCausalLM has no MoE layers"):
        sl.Engine(qwen2)
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module.*got str"):
        sl.Engine("Qwen/Qwen1.5-MoE-A2.7B")


@pytest.mark.parametrize("strategy", ["lru", "specter"])
def test_budget_minimum_in_the_message_is_exact(model, strategy):
    """The minimum the error states is accepted, one byte less is not."""
    with pytest.raises(ValueError, match=r"at least ([\d,]+) B") as err:
        sl.Engine(model, None, strategy, expert_budget=0.01)
    need = int(re.search(r"at least ([\d,]+) B", str(err.value)).group(1).replace(",", ""))
    engine = sl.Engine(model, None, strategy, expert_budget=need)
    assert min(engine.split.slots_per_layer) == 1
    with pytest.raises(ValueError, match=rf"expert_budget={need - 1}.*at least {need:,} B"):
        sl.Engine(model, None, strategy, expert_budget=need - 1)


def test_model_intact_after_engine_errors(model, ref):
    before = model.config._experts_implementation
    for kwargs, exc, _ in [c for c in ENGINE_CASES if not hasattr(c, "marks")]:
        with pytest.raises(exc):
            sl.Engine(model, None, **kwargs)
    assert_intact(model, ref, before)


# --------------------------------------------------------------------------------------------- engine.generate

GENERATE_CASES = [
    (dict(max_new_tokens=-1), r"max_new_tokens=-1.*integer >= 1"),
    (dict(max_new_tokens=0), r"max_new_tokens=0.*>= 1"),
    (dict(max_new_tokens=2.5), r"max_new_tokens=2.5"),
    (dict(max_new_tokens=True), r"max_new_tokens=True"),
    (dict(max_new_tokens="8"), r"max_new_tokens='8'"),
    (dict(prompt=""), r"prompt is empty"),
    (dict(prompt=[]), r"prompt is empty.*at least one token id"),
    (dict(prompt=torch.tensor([], dtype=torch.long)), r"prompt is empty"),
    (dict(prompt=[5, 256]), r"prompt has token ids outside the vocabulary \[0, 256\): \[256\]"),
    (dict(prompt=[-1, 5]), r"prompt has token ids outside the vocabulary \[0, 256\): \[-1\]"),
    (dict(prompt=torch.tensor([[5, 10**6]])), r"prompt has token ids outside the vocabulary.*1000000"),
    (dict(prompt=[5, 1.5]), r"prompt list must hold integer token ids"),
    (dict(prompt=[5, True]), r"prompt list must hold integer token ids"),
    (dict(prompt=torch.tensor([[5, 6], [7, 8]])), r"prompt tensor has batch 2"),
    (dict(prompt=torch.tensor([5.0, 6.0])), r"prompt tensor must hold integer token ids"),
    (dict(prompt="def f():"), r"prompt is a string but the Engine has no tokenizer"),
    (dict(do_sample=True, temperature=0), r"temperature=0.*> 0"),
    (dict(do_sample=True, top_p=0.0), r"top_p=0.0.*\(0, 1\]"),
    (dict(do_sample=True, top_p=1.5), r"top_p=1.5"),
    # checked in greedy runs too (they ignore the value, not the typo; the fuzz of every argument found these)
    (dict(temperature="x"), r"temperature='x'.*number > 0"),
    (dict(temperature=None), r"temperature=None"),
    (dict(top_p=float("nan")), r"top_p=nan.*\(0, 1\]"),
    (dict(top_p=[1]), r"top_p=\[1\]"),
    (dict(do_sample="yes"), r"do_sample='yes'.*True or False"),
    # past the model's context (512 positions): refused before the run grows a KV cache for 2**31 tokens
    (dict(max_new_tokens=2**31), r"max_new_tokens=2147483648.*max_position_embeddings=512.*<= 507"),
    (dict(max_new_tokens=508), r"max_new_tokens=508.*exceed the model's context"),
]


@pytest.mark.parametrize("strategy", ["lru", "specter"])
def test_generate_rejects_bad_arguments_then_works(model, ref, strategy):
    before = model.config._experts_implementation
    engine = sl.Engine(model, None, strategy, cache_slots=3)
    for kwargs, match in GENERATE_CASES:
        kw = dict(kwargs)
        prompt = kw.pop("prompt", IDS)
        with pytest.raises(ValueError, match=match):
            engine.generate(prompt, **{"max_new_tokens": N, **kw})
    with pytest.raises(TypeError, match=r"prompt must be a string, a list of token ids or a tensor, got NoneType"):
        engine.generate(None, max_new_tokens=N)
    # the same engine is fine afterwards, and so is the model
    assert engine.generate(IDS, max_new_tokens=N).token_ids == ref
    assert_intact(model, ref, before)


# --------------------------------------------------------------------------------------------- sl.QuantSpec

@pytest.mark.parametrize("kwargs,match", [
    (dict(bits=5), r"bits=5.*\(2, 3, 4, 8\)"),
    (dict(bits=1), r"bits=1.*\(2, 3, 4, 8\)"),
    (dict(bits=16), r"bits=16"),
    (dict(bits="4"), r"bits='4'"),
    (dict(bits=True), r"bits=True"),
    (dict(bits=4.0), None),  # 4.0 == 4: accepted as the number it is
    (dict(group_size=7), r"group_size=7.*\[8, 4096\]"),
    (dict(group_size=0), r"group_size=0"),
    (dict(group_size=-64), r"group_size=-64"),
    (dict(group_size=64.5), r"group_size=64.5"),
    (dict(group_size=8192), r"group_size=8192.*\[8, 4096\]"),
    (dict(group_size=True), r"group_size=True"),
    (dict(method="gptq"), r"method='gptq'.*'rtn', 'hqq'"),
])
def test_quantspec_rejects_unsupported(kwargs, match):
    if match is None:
        assert sl.QuantSpec(**kwargs).bits == 4
        return
    with pytest.raises(ValueError, match=match):
        sl.QuantSpec(**kwargs)


# --------------------------------------------------------------------------------------------- sl.load_model

def test_load_model_rejects_bad_arguments(tmp_path, dense_dir, model, ref):
    before = model.config._experts_implementation
    with pytest.raises(ValueError, match=r"name_or_path='/no/such/dir'.*no such folder.*'org/name'.*\['tiny'\]"):
        sl.load_model("/no/such/dir")
    with pytest.raises(ValueError, match=r"name_or_path='not-a-model'.*no such folder.*Bundled models"):
        sl.load_model("not-a-model")
    with pytest.raises(ValueError, match=r"name_or_path=''"):
        sl.load_model("")
    with pytest.raises(ValueError, match=r"name_or_path=42"):
        sl.load_model(42)
    with pytest.raises(ValueError, match=r"name_or_path=.*not a Hugging Face model folder \(no config.json\)"):
        sl.load_model(tmp_path)
    with pytest.raises(ValueError, match=r"model LlamaForCausalLM has no MoE layers"):
        sl.load_model(dense_dir)
    with pytest.raises(ValueError, match=r"dtype='float33'.*floating torch dtype"):
        sl.load_model(dense_dir, dtype="float33")
    with pytest.raises(ValueError, match=r"dtype=torch.int8.*floating"):
        sl.load_model(dense_dir, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"device='gpu0'.*torch device"):
        sl.load_model(dense_dir, device="gpu0")
    with pytest.raises(ValueError, match=r"trust_remote_code='yes'.*True or False"):
        sl.load_model(dense_dir, trust_remote_code="yes")
    assert_intact(model, ref, before)


@NO_CUDA
def test_load_model_cuda_without_cuda(moe_dir):
    with pytest.raises(ValueError, match=r"device='cuda'.*CUDA is not available.*'cpu'"):
        sl.load_model(moe_dir, device="cuda")


# --------------------------------------------------------------------------------------------- CLI


def run_cli(argv):
    """The CLI's exit code; argparse's own usage errors exit via SystemExit(2)."""
    try:
        return cli_main(argv)
    except SystemExit as e:
        return e.code


# Checked before the model is loaded: the model path does not even exist, and the error is still about the flag.
PRE_LOAD = [
    (["--strategy", "bogus"], r"strategy='bogus'.*use one of"),
    (["--hardware", "pcie9"], r"hardware='pcie9'.*rtx4090-pcie4"),
    (["--cost-shape", "gpt-5"], r"cost_shape='gpt-5'.*mixtral-8x7b"),
    (["--bits", "5"], r"bits=5.*\(2, 3, 4, 8\)"),
    (["--group-size", "7"], r"group_size=7"),
    (["--method", "gptq"], r"method='gptq'"),
    (["--k", "0"], r"--k 0.*>= 1"),
    (["--cache-slots", "0"], r"--cache-slots 0.*>= 1"),
    (["--max-new-tokens", "-1"], r"--max-new-tokens -1.*>= 1"),
    (["--k", "abc"], r"--k.*invalid.*'abc'"),
    (["--max-new-tokens", "many"], r"--max-new-tokens.*invalid int value: 'many'"),
    pytest.param(["--hardware", "cuda"], r"hardware='cuda'.*CUDA", marks=NO_CUDA),
]


@pytest.mark.parametrize("argv,match", PRE_LOAD)
def test_cli_rejects_before_loading(capsys, argv, match):
    assert run_cli(["run", "--model", "/no/such/dir", *argv]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert "no such folder" not in err  # the flag was checked before the model path


def test_cli_rejects_after_loading(capsys, moe_dir, dense_dir):
    for argv, match in [
        (["--model", "/no/such/dir"], r"run: error: load_model\(name_or_path='/no/such/dir'\): no such folder"),
        (["--model", str(dense_dir)], r"no MoE layers"),
        (["--model", str(moe_dir), "--expert-budget", "0.01"], r"expert_budget=0.01.*too small.*at least"),
        (["--model", str(moe_dir), "--expert-budget", "lots"], r"expert_budget='lots'"),
        (["--model", str(moe_dir), "--prompt", ""], r"prompt is empty"),
    ]:
        assert run_cli(["run", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert re.search(match, err), err


def test_load_model_hub_id_fails_fast_when_offline(monkeypatch):
    """A hub id that is not cached and cannot be fetched fails in well under the hub client's ~20 s of retries."""
    import socket
    import time

    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)

    def no_route(*args, **kwargs):
        raise OSError("no route to host (test)")

    monkeypatch.setattr(socket, "create_connection", no_route)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"'specter-test/not-cached'.*not in the local Hugging Face cache.*cannot be "
                                         r"reached.*local model folder"):
        sl.load_model("specter-test/not-cached")
    assert time.perf_counter() - t < 5
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"HF_HUB_OFFLINE is set.*not in the local"):
        sl.load_model("specter-test/not-cached")


def test_every_error_with_fields_pickles_whole():
    """A refusal raised in a worker of a process pool (the estimate's rows, a sweep's cells) reaches the parent as
    itself, its fields intact: an error that does not pickle breaks the pool instead (the estimate's rows with
    ram= once did)."""
    import pickle

    from specter_lab import errors
    from specter_lab.estimator.flags import PlacementError

    made = [errors.BudgetTooSmall("small", 10, 0.25), errors.CheckpointError("bad", "x.safetensors", "shape"),
            errors.NotEnoughMemory("short", plan=None), errors.HostBudgetTooSmall("host", 1, 2),
            errors.ConfigError("cfg", "num_experts", -1), errors.OptionError("opt", "k", 0, (1, 2)),
            errors.DiskFull("full", "/tmp/x", 100, 5, None, True, 28),
            errors.ResumeMismatch("other", "t.npz", "prompts", [1], [2]), errors.ResultsFileError("line", "c.jsonl", 3),
            PlacementError("flag")]
    for exc in made:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert {k: v for k, v in vars(back).items()} == {k: v for k, v in vars(exc).items()}, type(exc).__name__
    full = pickle.loads(pickle.dumps(made[6]))
    assert (full.errno, full.filename, full.needed_bytes, full.free_bytes) == (28, "/tmp/x", 100, 5)
