#!/usr/bin/env python
"""Train the tiny Qwen2-MoE model bundled with specter_lab.

The model is trained from scratch on the Python source code of the running
interpreter's standard library, with a fixed list of modules held out for
validation (see ``HELDOUT``).  A byte-level BPE tokenizer is trained on the
training split with the ``tokenizers`` library.  Training runs on a wall-clock
budget (``--minutes``) and/or a step budget (``--steps``), whichever ends first,
with AdamW, linear warmup and cosine decay.  The Qwen2-MoE load-balancing
auxiliary loss (``router_aux_loss_coef``) keeps the routers from collapsing.

At the end it evaluates on the held-out modules (loss in nats/token, per-layer
expert usage and its normalized entropy), writes the model + tokenizer in
Hugging Face format to ``--out`` and a model card ``README.md`` next to them.

Example (the command used for ``specter_lab/assets/tiny-moe``)::

    nice -n 5 python scripts/train_tiny_moe.py --out specter_lab/assets/tiny-moe \\
        --minutes 50 --threads 2 --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shlex
import sys
import sysconfig
import time
from pathlib import Path

EOS = "<|endoftext|>"

# Modules (files or packages, relative to the stdlib root) never trained on.
HELDOUT = [
    "json/",
    "csv.py",
    "textwrap.py",
    "heapq.py",
    "fractions.py",
    "bisect.py",
    "shlex.py",
    "graphlib.py",
    "colorsys.py",
    "difflib.py",
    "statistics.py",
    "string.py",
]

# Unit tests of the held-out modules: never trained on either (they quote and
# exercise the held-out code), and not part of the validation split.
HELDOUT_TESTS = [
    "test/test_json/",
    "test/test_csv.py",
    "test/test_textwrap.py",
    "test/test_heapq.py",
    "test/test_fractions.py",
    "test/test_bisect.py",
    "test/test_shlex.py",
    "test/test_graphlib.py",
    "test/test_colorsys.py",
    "test/test_difflib.py",
    "test/test_statistics.py",
    "test/test_string.py",
]

SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "__pycache__",
    "pydoc_data",  # huge generated topics.py
}
MAX_FILE_BYTES = 300_000  # skip huge (mostly generated) files
# The charmap codecs under encodings/ are tables written by gencodec.py: about
# 13% of the library's characters, trivially predictable and unlike held-out
# code, so they took capacity and steps for nothing.
GENERATED_MARKER = "Python Character Mapping Codec"

# Two prompts from held-out modules (heapq.py, colorsys.py), used for the greedy
# samples in the card.  They end mid-line: with a byte-level BPE, a prompt ending
# in a bare "\n" splits the usual "\n" + indentation token and derails the model.
CARD_PROMPTS = [
    'def heappush(heap, item):\n    """Push item onto heap, maintaining the heap invariant."""\n    heap.append(item)',
    "def rgb_to_hls(r, g, b):\n    maxc = max(r, g, b)\n    minc = min(r, g, b)",
]

DEFAULTS = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=32,
    num_experts_per_tok=4,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=256,
    vocab_size=4096,
    max_position_embeddings=2048,
)


# --------------------------------------------------------------------------- data


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _matches(rel: str, patterns: list[str]) -> bool:
    return any(rel.startswith(h) if h.endswith("/") else rel == h for h in patterns)


def is_heldout(rel: str) -> bool:
    return _matches(rel, HELDOUT)


def is_test(rel: str) -> bool:
    parts = rel.split("/")
    return any(d in ("test", "tests", "idle_test") or d.startswith("test_") for d in parts[:-1]) or parts[
        -1
    ].startswith("test_")


def collect_files(root: Path | None = None, tests: bool = True) -> tuple[list[Path], list[Path]]:
    """Return (train_files, heldout_files), both sorted, relative order fixed.

    ``tests=True`` adds the standard library's own test suite (``test/`` and the
    packages' test directories) to the training split, but not the tests of the
    held-out modules (``HELDOUT_TESTS``): about 2.5x more code to learn from.
    """
    root = root or stdlib_root()
    train, held = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            p = Path(dirpath) / fn
            try:
                if p.stat().st_size > MAX_FILE_BYTES or p.stat().st_size == 0:
                    continue
            except OSError:
                continue
            rel = p.relative_to(root).as_posix()
            if is_heldout(rel):
                held.append(p)
            elif _matches(rel, HELDOUT_TESTS) or (is_test(rel) and not tests):
                continue
            else:
                train.append(p)
    return train, held


def read_text(p: Path) -> str | None:
    """The file's text, or None when it is not UTF-8 or is a generated codec table."""
    try:
        text = p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return None if GENERATED_MARKER in text[:2000] else text


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=None,
        model_max_length=DEFAULTS["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    return hf


def encode_files(tok, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, each followed by the EOS separator."""
    return [enc + [tok.eos_token_id] for enc in tok(texts, add_special_tokens=False)["input_ids"]]


def join_ids(files: list[list[int]]):
    import torch

    return torch.tensor([i for ids in files for i in ids], dtype=torch.long)


def encode_corpus(tok, texts: list[str]):
    return join_ids(encode_files(tok, texts))


@contextlib.contextmanager
def inference(model):
    """Eval mode and no autograd for the block; the model's train/eval mode is restored after."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


# --------------------------------------------------------------------------- eval


def evaluate(model, data, seq_len: int, max_chunks: int | None = None, batch: int = 8, return_counts: bool = False):
    """Mean next-token loss (nats/token) over non-overlapping chunks, and expert usage."""
    import torch

    n = (len(data) - 1) // seq_len
    if max_chunks is not None:
        n = min(n, max_chunks)
    layers = [l for l in model.model.layers if hasattr(l.mlp, "gate")]
    E = model.config.num_experts
    counts = [torch.zeros(E, dtype=torch.long) for _ in layers]
    handles = []
    for i, layer in enumerate(layers):

        def hook(mod, inp, out, i=i):
            idx = out[2] if isinstance(out, tuple) else out
            counts[i] += torch.bincount(idx.reshape(-1), minlength=E)

        handles.append(layer.mlp.gate.register_forward_hook(hook))
    tot_loss, tot_tok = 0.0, 0
    try:
        with inference(model):
            for s in range(0, n, batch):
                rows = [data[j * seq_len : j * seq_len + seq_len + 1] for j in range(s, min(n, s + batch))]
                x = torch.stack(rows)
                logits = model(input_ids=x[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.size(-1)).float(), x[:, 1:].reshape(-1), reduction="sum"
                )
                tot_loss += loss.item()
                tot_tok += x[:, 1:].numel()
    finally:
        for h in handles:
            h.remove()
    usage = []
    for c in counts:
        p = c.double() / c.sum().clamp(min=1)
        nz = p[p > 0]
        ent = float(-(nz * nz.log()).sum() / math.log(E))
        usage.append(
            dict(entropy=ent, used=int((c > 0).sum()), min_frac=float(p.min()), max_frac=float(p.max()))
        )
    if return_counts:
        return tot_loss / max(tot_tok, 1), tot_tok, counts
    return tot_loss / max(tot_tok, 1), tot_tok, usage


def evaluate_sliding(model, data, seq_len: int, stride: int, batch: int = 8) -> tuple[float, int]:
    """Mean next-token loss with overlapping windows: each window of ``seq_len`` tokens
    advances by ``stride`` and scores only its last ``stride`` targets (the first window
    scores all), so every scored token has at least ``seq_len - stride`` tokens of context.
    ``evaluate``'s non-overlapping chunks give the first tokens of each chunk almost none.
    """
    import torch

    n = len(data) - 1  # number of targets
    starts = list(range(0, max(n - seq_len, 0) + 1, stride))
    if starts[-1] + seq_len < n:
        starts.append(n - seq_len)
    tot_loss, tot_tok, scored_to = 0.0, 0, 0
    with inference(model):
        for b in range(0, len(starts), batch):
            group = starts[b : b + batch]
            x = torch.stack([data[w : w + seq_len + 1] for w in group])
            logits = model(input_ids=x[:, :-1]).logits.float()
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none"
            ).view(len(group), seq_len)
            for row, w in enumerate(group):
                first = max(scored_to - w, 0)  # targets w+first.. not scored yet
                tot_loss += float(nll[row, first:].sum())
                tot_tok += seq_len - first
                scored_to = w + seq_len
    return tot_loss / max(tot_tok, 1), tot_tok


def prose_mask(text: str) -> list[bool]:
    """Per character: True inside a comment or a triple-quoted string (docstrings, mostly)."""
    import io
    import tokenize

    starts = [0]  # character offset of each line, split exactly as tokenize reads them (not at form feeds)
    for line in io.StringIO(text).readlines():
        starts.append(starts[-1] + len(line))
    mask = [False] * len(text)
    try:
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            body = t.string.lstrip("rRbBuUfF")
            if t.type == tokenize.COMMENT or (t.type == tokenize.STRING and body[:3] in ('"""', "'''")):
                a = starts[t.start[0] - 1] + t.start[1]
                b = starts[t.end[0] - 1] + t.end[1]
                mask[a:b] = [True] * (b - a)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # keep what was classified before the error
    return mask


def loss_by_kind(model, tok, texts: list[str], seq_len: int) -> dict:
    """Held-out loss split into prose (comments, docstrings) and code, per file in
    non-overlapping windows: which kind of text the model finds hard."""
    import torch

    prose_nll, code_nll, n_prose, n_code = 0.0, 0.0, 0, 0
    with inference(model):
        for text in texts:
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = torch.tensor(enc["input_ids"])
            mask = prose_mask(text)
            prose = torch.tensor([a < len(mask) and mask[a] for a, _ in enc["offset_mapping"]])
            for s0 in range(0, len(ids) - 1, seq_len):
                x = ids[s0 : s0 + seq_len + 1]
                nll = torch.nn.functional.cross_entropy(model(input_ids=x[None, :-1]).logits[0].float(), x[1:],
                                                        reduction="none")
                is_prose = prose[s0 + 1 : s0 + len(x)]  # the kind of each target token
                prose_nll += float(nll[is_prose].sum())
                code_nll += float(nll[~is_prose].sum())
                n_prose += int(is_prose.sum())
                n_code += int((~is_prose).sum())
    n = n_prose + n_code
    return dict(
        prose_share=n_prose / max(n, 1),
        prose_loss=prose_nll / max(n_prose, 1),
        code_loss=code_nll / max(n_code, 1),
        loss=(prose_nll + code_nll) / max(n, 1),
    )


def greedy(model, tok, prompt: str, new_tokens: int = 48) -> str:
    import torch

    x = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **x, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
        )
    return tok.decode(out[0, x["input_ids"].shape[1] :], skip_special_tokens=True)


def revive_experts(model, train_ids, seq_len: int, below: float, seed: int, chunks: int = 48) -> list:
    """Expert splitting: an expert the router (almost) never picks gets the weights and router row of its
    layer's busiest expert, plus a little noise, so the two share that load and then drift apart in training.
    Usage is measured on *training* tokens (the held-out split decides nothing here)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(train_ids) - seq_len - 1, (chunks,), generator=g).tolist()
    sample = torch.cat([train_ids[s : s + seq_len + 1] for s in starts])
    _, _, usage_counts = evaluate(model, sample, seq_len, return_counts=True)
    revived = []
    with torch.no_grad():
        for li, (layer, counts) in enumerate(zip([l for l in model.model.layers if hasattr(l.mlp, "gate")], usage_counts)):
            share = counts.double() / counts.sum()
            order = [d for d in torch.argsort(share, descending=True).tolist() if share[d] >= below]
            if not order:  # nothing healthy to copy from: leave the layer as it is
                continue
            for n, e in enumerate(int(i) for i in torch.nonzero(share < below).flatten()):
                d = order[n % len(order)]  # busiest first; a donor serves twice only if the layer runs out
                gate, ex = layer.mlp.gate.weight, layer.mlp.experts
                gate[e] = gate[d] + 1e-3 * gate[d].abs().mean() * torch.randn(gate.shape[1], generator=g)
                for name in ("gate_up_proj", "down_proj"):
                    w = getattr(ex, name)
                    w[e] = w[d] * (1 + 1e-2 * torch.randn(w[d].shape, generator=g))
                revived.append((li, e, d, float(share[e])))
    for li, e, d, sh in revived:
        print(f"[revive] layer {li}: expert {e} (share {sh:.5f}) re-seeded from expert {d}", flush=True)
    return revived


# --------------------------------------------------------------------------- card


def write_card(out: Path, info: dict) -> None:
    cfg = info["config"]
    lines = [
        "---",
        "library_name: transformers",
        "license: apache-2.0",
        "pipeline_tag: text-generation",
        "tags: [qwen2_moe, moe, tiny, code]",
        "---",
        "",
        "# tiny-moe: a really trained tiny Qwen2-MoE for specter_lab",
        "",
        "A tiny causal mixture-of-experts language model (transformers' `Qwen2MoeForCausalLM`), "
        "trained from scratch on CPU on Python standard-library source code. It exists so that "
        "specter_lab's expert offloading, caching and speculative decoding can be exercised and "
        "benchmarked on a real (non-random) router without downloading anything. It is *not* a "
        "useful code model.",
        "",
        "## Architecture",
        "",
        f"- Qwen2-MoE, {cfg['num_hidden_layers']} decoder layers, all MoE "
        f"(`decoder_sparse_step=1`), hidden size {cfg['hidden_size']}, "
        f"{cfg['num_attention_heads']} attention heads ({cfg['num_key_value_heads']} KV heads)",
        f"- {cfg['num_experts']} routed experts per layer, top-{cfg['num_experts_per_tok']} routing "
        f"(`norm_topk_prob={cfg['norm_topk_prob']}`), `moe_intermediate_size={cfg['moe_intermediate_size']}`",
        f"- one gated shared expert per layer, `shared_expert_intermediate_size={cfg['shared_expert_intermediate_size']}`",
        f"- vocabulary {cfg['vocab_size']} (byte-level BPE), tied input/output embeddings, "
        f"`max_position_embeddings={cfg['max_position_embeddings']}`",
        f"- {info['n_params']:,} parameters, stored in {info.get('save_dtype', 'float32')}"
        + (" (trained in float32; the reported losses are those of the stored weights, and "
           "`sl.load_model` computes in float32)" if info.get("save_dtype", "float32") != "float32" else ""),
        "",
        "## Data",
        "",
        f"Python source files (`*.py`) of the CPython {info['python']} standard library "
        f"(`sysconfig.get_paths()['stdlib']`), "
        + ("including its own test suite (`test/` and the packages' test directories) except the "
           "tests of the held-out modules, " if info.get("tests", True) else "without its test suites, ")
        + f"skipping `site-packages`, `pydoc_data`, the generated charmap codec tables under "
        f"`encodings/` and files over {MAX_FILE_BYTES // 1000} kB. "
        f"Documents are separated by `{EOS}` (also the EOS/pad token; there is no BOS).",
        "",
        f"- training split: {info['n_train_files']} files, {info['n_train_tokens']:,} tokens",
        f"- held-out split: {info['n_held_files']} files, {info['n_held_tokens']:,} tokens. "
        "Held-out modules (never seen by the tokenizer or the model):",
        "",
    ]
    lines += [f"  - `{h}`" for h in HELDOUT]
    lines += ["", "Their unit tests are left out of training as well:", ""]
    lines += [f"  - `{h}`" for h in HELDOUT_TESTS]
    lines += [
        "",
        "## Training",
        "",
        ("- from scratch" if not info.get("init_from") else f"- continued from the model in `{info['init_from']}`")
        + f", seed {info['seed']}, sequence length {info['seq_len']}, batch "
        f"{info['batch']} sequences, AdamW (lr {info['lr']}, betas (0.9, 0.95), weight decay "
        f"{info['weight_decay']}), {info['warmup']} warmup steps then cosine decay over the "
        "wall-clock budget, gradient clipping 1.0"
        + (", bfloat16 autocast for the forward and backward passes (float32 weights, optimizer state and loss)"
           if info.get("bf16") else ""),
    ]
    if info.get("lib_weight") is not None:
        lines.append(f"- each training sequence is drawn from library code with probability {info['lib_weight']} "
                     "and from the test suite otherwise (the held-out modules are library code)")
    lines += [
        f"- load-balancing auxiliary loss with `router_aux_loss_coef={cfg['router_aux_loss_coef']}` "
        "(`output_router_logits=True` during training only; the saved config has it off)",
        f"- {info['steps']} steps, {info['tokens_seen']:,} training tokens seen, "
        f"{info['train_seconds'] / 60:.1f} minutes of training on {info['threads']} CPU threads "
        f"(total script time {info['total_seconds'] / 60:.1f} minutes incl. tokenizer and eval), "
        f"torch {info['torch']}, transformers {info['transformers']}",
        "",
    ]
    if info.get("note"):
        lines += [f"- {info['note']}", ""]
    lines += [
        "Exact command:",
        "",
        "```",
        info["command"],
        "```",
        "",
        "## Evaluation (held-out modules)",
        "",
        f"- validation loss: **{info['val_loss']:.3f} nats/token** "
        f"(perplexity {math.exp(info['val_loss']):.1f}) over {info['val_tokens']:,} held-out tokens",
        f"  in non-overlapping {info['seq_len']}-token chunks (a token has {info['seq_len'] // 2} tokens of context on "
        f"average); with sliding windows (stride {info['seq_len'] // 2}, each token scored with at least "
        f"{info['seq_len'] // 2} tokens of context): {info['val_loss_sliding']:.3f} nats/token",
        f"- by kind of text (each file in its own {info['seq_len']}-token windows, {info['by_kind']['loss']:.3f} "
        f"overall): comments and docstrings are {info['by_kind']['prose_share']:.0%} of the held-out tokens at "
        f"{info['by_kind']['prose_loss']:.3f} nats/token, code is at {info['by_kind']['code_loss']:.3f}",
        f"- final training loss (LM part, mean of the last steps): {info['train_loss']:.3f} nats/token",
        "",
    ]
    if info.get("curve"):
        lines += ["Held-out loss during training:", "", "| training minutes | tokens seen | held-out loss |", "|---|---|---|"]
        lines += [f"| {m:.1f} | {t:,} | {v:.3f} |" for m, t, v in info["curve"]]
        lines += [f"| {info['train_seconds'] / 60:.1f} (end) | {info['tokens_seen']:,} | {info['val_loss']:.3f} |", ""]
    lines += [
        "Expert usage on held-out code (fraction of top-k assignments per routed expert; "
        "normalized entropy = entropy / log(num_experts)):",
        "",
        "| layer | experts used | normalized entropy | min share | max share |",
        "|---|---|---|---|---|",
    ]
    for i, u in enumerate(info["usage"]):
        lines.append(
            f"| {i} | {u['used']}/{cfg['num_experts']} | {u['entropy']:.3f} | "
            f"{u['min_frac']:.2e} | {u['max_frac']:.4f} |"
        )
    lines += ["", "## Greedy continuations", ""]
    for p, c in info["samples"]:
        lines += ["Prompt:", "", "```python", p.rstrip("\n"), "```", "", "Greedy continuation (48 new tokens):", "", "```python", (p + c).rstrip("\n"), "```", ""]
    lines += [
        "## Usage",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "path = 'specter_lab/assets/tiny-moe'",
        "model = AutoModelForCausalLM.from_pretrained(path)",
        "tok = AutoTokenizer.from_pretrained(path)",
        "```",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (HF format)")
    ap.add_argument("--minutes", type=float, default=50.0, help="training wall-clock budget")
    ap.add_argument("--steps", type=int, default=None, help="max optimizer steps (optional)")
    ap.add_argument("--max-files", type=int, default=None, help="use only N evenly spaced train files (smoke)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--aux-coef", type=float, default=0.02)
    ap.add_argument("--eval-chunks", type=int, default=None, help="cap held-out eval chunks")
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--norm-topk-prob", type=int, default=1)
    # grouped_mm trains 1.3x faster than eager on this CPU (7.5k vs 5.7k tokens/s, 2 threads)
    ap.add_argument("--experts-impl", default="grouped_mm", help="experts implementation while training")
    ap.add_argument("--no-tests", action="store_true", help="leave the stdlib test suite out of training")
    ap.add_argument("--eval-every", type=float, default=10.0, help="minutes between held-out evals (0: off)")
    ap.add_argument("--init-from", default=None,
                    help="continue from a model saved by this script (its tokenizer is reused, not retrained)")
    ap.add_argument("--revive-below", type=float, default=0.0,
                    help="with --init-from: experts whose share of top-k picks on training tokens is below this are "
                         "re-seeded as a noisy copy of the busiest expert of their layer (expert splitting)")
    ap.add_argument("--bf16", action="store_true",
                    help="bfloat16 autocast for the training forward/backward (weights stay float32); "
                         "1.25x faster at hidden size 256 on this CPU, 1.1x at 128")
    ap.add_argument("--lib-weight", type=float, default=None,
                    help="share of training sequences drawn from library code rather than the test suite "
                         "(default: uniform over all training tokens)")
    ap.add_argument("--save-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="dtype of the saved weights; the reported held-out loss is that of the saved weights")
    ap.add_argument("--note", default="", help="an extra line for the model card's Training section")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--no-card", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.time()
    import numpy as np
    import torch
    import transformers
    from transformers import GenerationConfig, Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # ---- data
    train_files, held_files = collect_files(tests=not args.no_tests)
    if args.max_files is not None:
        # evenly spaced, so a smoke run sees library code and the test suite alike
        train_files = train_files[:: max(1, len(train_files) // args.max_files)][: args.max_files]
        held_files = held_files[: max(1, args.max_files // 4)]
    root = stdlib_root()
    pairs = [(f, t) for f, t in zip(train_files, map(read_text, train_files)) if t]
    train_texts = [t for _, t in pairs]
    # Library code vs the test suite, for --lib-weight (held-out modules are library code).
    lib_mask = [not is_test(f.relative_to(root).as_posix()) for f, _ in pairs]
    held_texts = [t for t in map(read_text, held_files) if t]
    print(f"[data] {len(train_texts)} train files, {len(held_texts)} held-out files", flush=True)

    t0 = time.time()
    if args.init_from:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.init_from)
        print(f"[tokenizer] vocab {len(tok)} from {args.init_from}", flush=True)
    else:
        tok = train_tokenizer(train_texts, args.vocab_size)
        print(f"[tokenizer] vocab {len(tok)} trained in {time.time() - t0:.1f}s", flush=True)
    train_files_ids = encode_files(tok, train_texts)
    train_ids = join_ids(train_files_ids)
    if args.lib_weight is not None:
        lib_ids = join_ids([f for f, m in zip(train_files_ids, lib_mask) if m])
        test_ids = join_ids([f for f, m in zip(train_files_ids, lib_mask) if not m])
        print(f"[data] --lib-weight {args.lib_weight}: {len(lib_ids):,} library tokens, "
              f"{len(test_ids):,} test-suite tokens", flush=True)
    held_ids = encode_corpus(tok, held_texts)
    print(f"[data] {len(train_ids):,} train tokens, {len(held_ids):,} held-out tokens", flush=True)

    # ---- model
    cfg = Qwen2MoeConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.shared_expert_intermediate_size,  # dense MLP size (unused: all layers MoE)
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        num_key_value_heads=args.num_key_value_heads,
        max_position_embeddings=args.max_position_embeddings,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_experts=args.num_experts,
        num_experts_per_tok=args.num_experts_per_tok,
        moe_intermediate_size=args.moe_intermediate_size,
        shared_expert_intermediate_size=args.shared_expert_intermediate_size,
        norm_topk_prob=bool(args.norm_topk_prob),
        router_aux_loss_coef=args.aux_coef,
        output_router_logits=False,
        tie_word_embeddings=True,
        use_sliding_window=False,
        rope_theta=10000.0,
        attention_dropout=0.0,
        initializer_range=0.02,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    revived: list = []
    model = Qwen2MoeForCausalLM(cfg) if not args.init_from else Qwen2MoeForCausalLM.from_pretrained(args.init_from)
    if args.init_from:
        model.config.router_aux_loss_coef = args.aux_coef
        cfg = model.config
        if args.revive_below > 0:
            revived = revive_experts(model, train_ids, args.seq_len, args.revive_below, args.seed)
    try:
        model.set_experts_implementation(args.experts_impl)
    except Exception as e:  # pragma: no cover - older transformers
        print(f"[model] experts implementation {args.experts_impl!r} unavailable ({e}); eager", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[model] {n_params:,} parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=args.weight_decay), dict(params=no_decay, weight_decay=0.0)],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    budget = args.minutes * 60.0
    max_steps = args.steps
    gen = torch.Generator().manual_seed(args.seed)
    L = args.seq_len
    n_starts = len(train_ids) - L - 1
    streams = [train_ids] if args.lib_weight is None else [lib_ids, test_ids]
    if any(len(st) - L - 1 <= 0 for st in streams):
        raise SystemExit("training corpus (or, with --lib-weight, its library or test-suite part) too small "
                         "for --seq-len")

    def batch_rows():
        if args.lib_weight is None:
            starts = torch.randint(0, n_starts, (args.batch,), generator=gen).tolist()
            return [train_ids[s : s + L + 1] for s in starts]
        rows = []
        for _ in range(args.batch):
            st = streams[0] if torch.rand((), generator=gen).item() < args.lib_weight else streams[1]
            s0 = int(torch.randint(0, len(st) - L - 1, (), generator=gen))
            rows.append(st[s0 : s0 + L + 1])
        return rows

    model.train()
    t_train = time.time()
    step, tokens_seen = 0, 0
    recent_lm, recent_aux = [], []
    # Held-out loss along the way: (training minutes, tokens seen, loss).  Eval time
    # is kept off the training clock so the schedule sees training time only.
    curve: list[tuple[float, int, float]] = []
    eval_seconds, next_eval = 0.0, args.eval_every * 60.0
    while True:
        elapsed = time.time() - t_train - eval_seconds
        if args.eval_every > 0 and elapsed >= next_eval:
            t_ev = time.time()
            vl, _, _ = evaluate(model, held_ids, L, max_chunks=args.eval_chunks)  # restores train mode
            curve.append((elapsed / 60, tokens_seen, vl))
            print(f"[eval] {elapsed / 60:.1f} min, {tokens_seen:,} tokens: held-out loss {vl:.4f}", flush=True)
            eval_seconds += time.time() - t_ev
            next_eval += args.eval_every * 60.0
            continue
        frac_t = elapsed / budget if budget > 0 else 1.0
        frac_s = step / max_steps if max_steps else 0.0
        progress = max(frac_t, frac_s)
        if progress >= 1.0:
            break
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            lr = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        for g in opt.param_groups:
            g["lr"] = lr
        x = torch.stack(batch_rows())
        # Mixed precision: float32 weights and optimizer state, bfloat16 matmuls (AMX on
        # recent Xeons); the loss itself is taken in float32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            outp = model(input_ids=x[:, :-1], output_router_logits=True)
        lm = torch.nn.functional.cross_entropy(
            outp.logits.float().reshape(-1, outp.logits.size(-1)), x[:, 1:].reshape(-1)
        )
        aux = outp.aux_loss.float() if outp.aux_loss is not None else torch.zeros(())
        loss = lm + args.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x[:, 1:].numel()
        recent_lm.append(lm.item())
        recent_aux.append(float(aux.detach()))
        recent_lm, recent_aux = recent_lm[-50:], recent_aux[-50:]
        if step % args.log_every == 0 or step == 1:
            el = time.time() - t_train - eval_seconds
            print(
                f"[train] step {step} lm {sum(recent_lm) / len(recent_lm):.3f} "
                f"aux {sum(recent_aux) / len(recent_aux):.3f} lr {lr:.2e} "
                f"tok {tokens_seen:,} {tokens_seen / max(el, 1e-9):.0f} tok/s {el / 60:.1f} min",
                flush=True,
            )
    train_seconds = time.time() - t_train - eval_seconds
    train_loss = sum(recent_lm) / max(len(recent_lm), 1)
    print(
        f"[train] done: {step} steps, {tokens_seen:,} tokens, {train_seconds:.0f}s "
        f"({train_seconds / 60:.1f} min), {tokens_seen / max(train_seconds, 1e-9):.0f} tok/s",
        flush=True,
    )

    # ---- eval + save (default experts implementation in the saved model)
    try:
        model.set_experts_implementation("eager")
    except Exception:
        pass
    save_dtype = getattr(torch, args.save_dtype)
    if save_dtype != torch.float32:
        # Evaluate exactly the weights that will be stored: round them to the saved dtype
        # (compute stays float32, as sl.load_model does when it loads them).
        with torch.no_grad():
            for prm in model.parameters():
                prm.copy_(prm.to(save_dtype).float())
    t0 = time.time()
    val_loss, val_tokens, usage = evaluate(model, held_ids, L, max_chunks=args.eval_chunks)
    print(f"[eval] held-out loss {val_loss:.4f} nats/token over {val_tokens:,} tokens ({time.time() - t0:.0f}s)", flush=True)
    t0 = time.time()
    val_loss_sliding, _ = evaluate_sliding(model, held_ids, L, L // 2)
    print(f"[eval] held-out loss, sliding windows (stride {L // 2}): {val_loss_sliding:.4f} nats/token "
          f"({time.time() - t0:.0f}s)", flush=True)
    by_kind = loss_by_kind(model, tok, held_texts, L)
    print(f"[eval] prose (comments, docstrings) {by_kind['prose_share']:.0%} of held-out tokens at "
          f"{by_kind['prose_loss']:.3f} nats/token, code {by_kind['code_loss']:.3f} (per-file windows: "
          f"{by_kind['loss']:.3f} overall)", flush=True)
    for i, u in enumerate(usage):
        print(
            f"[eval] layer {i}: experts used {u['used']}/{cfg.num_experts} normalized entropy "
            f"{u['entropy']:.4f} share min {u['min_frac']:.4f} max {u['max_frac']:.4f}",
            flush=True,
        )

    model.config.output_router_logits = False
    model.config.use_cache = True
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, do_sample=False
    )
    model.to(save_dtype).save_pretrained(out)
    model.float()
    tok.save_pretrained(out)
    # Keep the saved config free of a pinned experts implementation.
    cpath = out / "config.json"
    c = json.loads(cpath.read_text())
    if c.pop("experts_implementation", None) is not None or c.pop("_experts_implementation", None) is not None:
        cpath.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")

    samples = []
    for p in CARD_PROMPTS:
        s = greedy(model, tok, p)
        samples.append((p, s))
        print(f"[sample] {p!r} -> {s!r}", flush=True)

    total_seconds = time.time() - t_start
    info = dict(
        config=model.config.to_dict(),
        n_params=n_params,
        python=".".join(map(str, sys.version_info[:3])),
        n_train_files=len(train_texts),
        n_held_files=len(held_texts),
        n_train_tokens=len(train_ids),
        n_held_tokens=len(held_ids),
        seed=args.seed,
        seq_len=L,
        batch=args.batch,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup=args.warmup,
        steps=step,
        tokens_seen=tokens_seen,
        train_seconds=train_seconds,
        total_seconds=total_seconds,
        threads=args.threads,
        torch=torch.__version__,
        transformers=transformers.__version__,
        command="python " + " ".join(shlex.quote(a) for a in ([sys.argv[0]] + list(argv if argv is not None else sys.argv[1:]))),
        val_loss=val_loss,
        val_tokens=val_tokens,
        val_loss_sliding=val_loss_sliding,
        by_kind=by_kind,
        curve=curve,
        tests=not args.no_tests,
        note=args.note,
        lib_weight=args.lib_weight,
        bf16=args.bf16,
        save_dtype=args.save_dtype,
        init_from=args.init_from,
        revived=revived,
        train_loss=train_loss,
        usage=usage,
        samples=samples,
    )
    if not args.no_card:
        write_card(out, info)
    print(f"[done] total time {total_seconds:.0f}s ({total_seconds / 60:.1f} min); saved to {out}", flush=True)
    return info


if __name__ == "__main__":
    main()
