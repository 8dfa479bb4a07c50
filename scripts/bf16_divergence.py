"""How often speculative decoding's default verification (one target pass over the K+1 positions) departs from
token-by-token decoding in bfloat16, and how close the target's top two logits were where it did.

For every model and held-out prompt, in bfloat16: HF ``generate`` (greedy, its logits kept), the ``lru`` strategy
(the runtime decoding one token per forward), ``specter`` with ``verify="batched"`` (the default) and with
``verify="exact"``. A divergence is the first position where a run's token differs from HF's; its margin is HF's
top-1 minus top-2 logit at that position, in bf16 steps (units in the last place of the top-1 logit). Also the
cost of ``verify="exact"`` against the default: simulated TPOT (the Engine's default profile: a simulated clock,
priced from the model's own sizes) and CPU wall time of the whole run on this machine.

    python scripts/bf16_divergence.py [--prompts 14] [--tokens 24] [--models tiny,mixtral,...]

Models: ``tiny`` (the bundled model and its tokenizer), the tiny random families of ``sl.tiny_random_model``
(their prompt ids are the bundled tokenizer's, modulo their 256-token vocabulary), and ``olmoe-512``: a random
OLMoE-shaped model with hidden 512, expert FFN 256, 32 experts, top-8 (the size where reduction order starts to
matter). Prints a markdown report (docs/measured/bf16_divergence.md is its output).
"""

from __future__ import annotations

import argparse
import time

import torch

import specter_lab as sl
from specter_lab.decode.exactness import tie_steps

RANDOM = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")
OLMOE_512 = dict(hidden_size=512, intermediate_size=256, num_experts=32, num_experts_per_tok=8,
                 num_attention_heads=8, num_key_value_heads=8)


def load(name: str):
    if name == "tiny":
        return sl.load_model("tiny", dtype="bfloat16")
    if name == "olmoe-512":
        return sl.tiny_random_model("olmoe", seed=1, **OLMOE_512).to(torch.bfloat16), None
    return sl.tiny_random_model(name, seed=1).to(torch.bfloat16), None


def first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def run_model(name: str, prompts: list[list[int]], tokens: int) -> dict:
    model, tok = load(name)
    vocab = model.config.get_text_config().vocab_size
    slots = sl.inspect_model(model).top_k + 1  # the lossless suite's budget: evictions all the time
    row = dict(model=name, impl=model.config._experts_implementation, runs=0, lru_diff=0, batched_diff=0,
               exact_diff=0, margins=[], second=0, tpot=[0.0, 0.0], wall=[0.0, 0.0], cpu=[0.0, 0.0])
    for ids in prompts:
        ids = [t % vocab for t in ids]
        out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        ref = out.sequences[0, len(ids):].tolist()
        lru = sl.Engine(model, tok, "lru", cache_slots=slots).generate(ids, max_new_tokens=tokens).token_ids
        row["runs"] += 1
        row["lru_diff"] += first_diff(lru, ref) is not None
        for j, mode in enumerate(("batched", "exact")):
            t0, c0 = time.perf_counter(), time.process_time()
            r = sl.Engine(model, tok, "specter", cache_slots=slots, verify=mode).generate(ids, max_new_tokens=tokens)
            row["wall"][j] += time.perf_counter() - t0
            row["cpu"][j] += time.process_time() - c0
            row["tpot"][j] += r.metrics["tpot_ms"]
            i = first_diff(r.token_ids, ref)
            if i is None:
                continue
            row[f"{mode}_diff"] += 1
            if mode == "batched" and i < len(out.logits):
                # generate hands its logits over as float32; they are the model's bf16 values, upcast
                row["margins"].append(tie_steps(out.logits[i][0].to(torch.bfloat16)))
                row["second"] += r.token_ids[i] == int(out.logits[i][0].float().topk(2).indices[1])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=None, help="the last N held-out prompts (default: all)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=48, help="prompts cut to their first N tokens")
    ap.add_argument("--models", default="tiny,mixtral,qwen2_moe,deepseek_v3,gpt_oss,olmoe-512")
    a = ap.parse_args()
    torch.set_num_threads(1)
    _, tok = sl.load_model("tiny")
    prompts = [tok(p)["input_ids"][: a.prompt_tokens] for p in sl.heldout_prompts(a.prompts)]
    t_all, c_all = time.perf_counter(), time.process_time()
    rows = [run_model(m, prompts, a.tokens) for m in a.models.split(",")]
    print(f"bfloat16, {len(prompts)} held-out prompts (first {a.prompt_tokens} tokens), {a.tokens} new tokens, "
          "specter K=4, top-k + 1 slots per layer; reference: HF generate (greedy, token by token).\n")
    print("| model | experts impl | runs | lru ≠ HF | specter batched ≠ HF | margins at divergence (bf16 steps) "
          "| picked HF's 2nd | specter exact ≠ HF |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = ", ".join(f"{x:.0f}" for x in sorted(r["margins"])) or "–"
        print(f"| {r['model']} | {r['impl']} | {r['runs']} | {r['lru_diff']} | {r['batched_diff']} | {m} | "
              f"{r['second']}/{len(r['margins'])} | {r['exact_diff']} |")
    runs = sum(r["runs"] for r in rows)
    div = sum(r["batched_diff"] for r in rows)
    margins = [x for r in rows for x in r["margins"]]
    print(f"\nDefault (batched) verification: {div}/{runs} runs diverge from token-by-token decoding "
          f"({100 * div / max(1, runs):.1f} %); largest margin at a divergence: "
          f"{max(margins) if margins else 0:.0f} bf16 steps. lru ≠ HF: {sum(r['lru_diff'] for r in rows)}; "
          f"exact verification ≠ HF: {sum(r['exact_diff'] for r in rows)}.\n")
    print("Cost of verify='exact': TPOT is simulated (the default profile; mean over the prompts); wall and CPU are "
          "the measured seconds of the whole Engine.generate calls on this machine (sums over the prompts, 1 thread; "
          "CPU = this process's CPU time, which a shared machine does not inflate):\n")
    print("| model | TPOT batched ms | TPOT exact ms | exact / batched | wall batched s | wall exact s "
          "| CPU batched s | CPU exact s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        n = max(1, r["runs"])
        tb, te = r["tpot"][0] / n, r["tpot"][1] / n
        print(f"| {r['model']} | {tb:.3f} | {te:.3f} | {te / tb:.2f} | {r['wall'][0]:.1f} | {r['wall'][1]:.1f} "
              f"| {r['cpu'][0]:.1f} | {r['cpu'][1]:.1f} |")
    print(f"\nTotal run time {time.perf_counter() - t_all:.0f} s wall, {time.process_time() - c_all:.0f} s CPU.")


if __name__ == "__main__":
    main()
