"""Safe loading: sl.load_model reads safetensors only (a pickle checkpoint is refused, never unpickled) and runs a
folder's custom code only when the caller passes trust_remote_code=True; a model saved with save_pretrained loads
back and generates exactly like the original."""

import json

import pytest
import torch

import specter_lab as sl
from conftest import hf_greedy

IDS = [5, 6, 7, 8, 9]
N = 8


@pytest.fixture(scope="module")
def model():
    return sl.tiny_random_model("qwen2_moe", seed=3)


@pytest.fixture
def no_unpickling(monkeypatch):
    """Fail the test if anything calls torch.load (i.e. unpickles a checkpoint)."""

    def refuse(*a, **k):
        raise AssertionError("torch.load was called: a pickle checkpoint was unpickled")

    monkeypatch.setattr(torch, "load", refuse)


def _tiny_tokenizer(vocab_size=256):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>")


def test_pickle_only_folder_is_refused(tmp_path, model, no_unpickling):
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"has no \.safetensors weights \(found pickle checkpoints "
                                         r"\['pytorch_model.bin'\]\).*safetensors only.*arbitrary code"):
        sl.load_model(tmp_path)
    # same for other pickle suffixes, and for a folder with nothing but a config
    (tmp_path / "pytorch_model.bin").rename(tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"pickle checkpoints \['model.pt'\]"):
        sl.load_model(str(tmp_path))
    (tmp_path / "model.pt").unlink()
    with pytest.raises(ValueError, match=r"has no \.safetensors weights\. specter_lab loads safetensors only"):
        sl.load_model(tmp_path)


def test_safetensors_folder_loads_and_generates_like_the_original(tmp_path, model, no_unpickling):
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded, tok = sl.load_model(tmp_path)
    assert tok is None  # no tokenizer files: prompts are token ids
    assert not loaded.training
    for name, p in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name
    ref = hf_greedy(model, IDS, N)
    assert hf_greedy(loaded, IDS, N) == ref
    for strategy in ("lru", "specter"):
        assert sl.Engine(loaded, None, strategy, cache_slots=3).generate(IDS, max_new_tokens=N).token_ids == ref


def test_safetensors_wins_over_a_pickle_next_to_it(tmp_path, model, no_unpickling):
    """A folder with both: the safetensors weights are used and the pickle is never opened (it holds other
    weights, so using it would change the output)."""
    model.save_pretrained(tmp_path)
    other = sl.tiny_random_model("qwen2_moe", seed=99)
    torch.save(other.state_dict(), tmp_path / "pytorch_model.bin")
    loaded, _ = sl.load_model(tmp_path)
    assert hf_greedy(loaded, IDS, N) == hf_greedy(model, IDS, N)


def test_folder_with_tokenizer_loads_it(tmp_path, model):
    model.save_pretrained(tmp_path)
    _tiny_tokenizer().save_pretrained(tmp_path)
    loaded, tok = sl.load_model(tmp_path)
    assert tok is not None
    prompt = "w5 w6 w7 w8 w9"
    ids = tok(prompt)["input_ids"]
    assert ids[-5:] == IDS
    r = sl.Engine(loaded, tok, "specter", cache_slots=3).generate(prompt, max_new_tokens=N)
    assert r.token_ids == hf_greedy(model, ids, N)
    assert isinstance(r.text, str)


def _remote_code_folder(path):
    """A folder whose config asks for custom code; importing that code would leave a marker file."""
    (path / "evil.py").write_text("import pathlib\npathlib.Path(__file__).with_name('EXECUTED').write_text('x')\n")
    (path / "config.json").write_text(json.dumps({
        "model_type": "evil_moe", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_custom_code_is_not_run_without_trust_remote_code(tmp_path):
    _remote_code_folder(tmp_path)
    with pytest.raises(ValueError, match=r"(?s)custom code.*trust_remote_code=True"):
        sl.load_model(tmp_path)
    assert not (tmp_path / "EXECUTED").exists()


def test_trust_remote_code_is_passed_only_when_given(tmp_path, model, monkeypatch):
    """Spy on what load_model hands to transformers: False by default, True only when the caller says so."""
    import transformers

    model.save_pretrained(tmp_path)
    _tiny_tokenizer().save_pretrained(tmp_path)
    seen = []
    real_model = transformers.AutoModelForCausalLM.from_pretrained
    real_tok = transformers.AutoTokenizer.from_pretrained

    def spy_model(*a, **k):
        seen.append(("model", k.get("trust_remote_code"), k.get("use_safetensors")))
        return real_model(*a, **k)

    def spy_tok(*a, **k):
        seen.append(("tokenizer", k.get("trust_remote_code")))
        return real_tok(*a, **k)

    from specter_lab.model import loading

    real_reader = loading._load_per_expert

    def spy_reader(ck, dtype, trust_remote_code, kwargs):  # the per-expert reader: safetensors, own read
        out = real_reader(ck, dtype, trust_remote_code, kwargs)
        if out is not None:
            seen.append(("model", trust_remote_code, True))
        return out

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy_tok)
    monkeypatch.setattr(loading, "_load_per_expert", spy_reader)
    sl.load_model(tmp_path)
    assert seen == [("model", False, True), ("tokenizer", False)]
    seen.clear()
    sl.load_model(tmp_path, trust_remote_code=True)
    assert seen == [("model", True, True), ("tokenizer", True)]


def test_a_bf16_checkpoint_stays_bf16_unless_asked(tmp_path):
    """Never a silent upcast: the checkpoint's own dtype is the default on the CPU too; another is asked for."""
    sl.tiny_random_model("qwen2_moe", seed=3).to(torch.bfloat16).save_pretrained(tmp_path)
    loaded, _ = sl.load_model(tmp_path)
    assert loaded.dtype == torch.bfloat16
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert sl.load_model(tmp_path, dtype="float32")[0].dtype == torch.float32
    ref = hf_greedy(loaded, IDS, N)
    assert sl.Engine(loaded, None, "lru", cache_slots=3).generate(IDS, max_new_tokens=N).token_ids == ref
