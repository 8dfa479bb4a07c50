"""Sweep every causal-LM family of the installed transformers whose experts use the experts interface.

For each family: build a tiny random model from transformers' own config class, generate 40 greedy tokens with HF
``generate``, then with a plain strategy (``lru``) and a speculative one (``specter``, int4 draft, K=3) at top-k + 1
slots per layer (evictions all the time), and compare token for token. A family the engine refuses (``NotExact``)
counts as refused, with the engine's reason; anything else that fails is reported with its error.

    python scripts/check_families.py [--families a,b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

import specter_lab as sl
from specter_lab.atomic import write_atomic
from specter_lab.errors import NotExact
from specter_lab.model.families import UNBUILDABLE, VARIANTS, experts_interface_families, tiny_family_model

STRATEGIES = ("lru", "specter")
NEW_TOKENS = 40


def _prompt(model) -> list[int]:
    vocab = model.config.get_text_config().vocab_size
    return [(7 * i + 5) % vocab for i in range(6)]


def check_family(name: str) -> dict:
    """One family's row: status 'pass' | 'diverged' | 'refused' | 'unbuildable' | 'error', with details."""
    row: dict = {"family": name}
    try:
        model = tiny_family_model(name, seed=1)
        ids = _prompt(model)
        ref = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
        top_k = sl.inspect_model(model).top_k
    except Exception as exc:  # noqa: BLE001 - a sweep reports every failure, it does not stop at one
        return {**row, "status": "unbuildable", "why": f"{type(exc).__name__}: {exc}"[:300]}
    row["new_tokens"] = len(ref)
    row["top_k"], row["slots"] = top_k, top_k + 1
    for strategy in STRATEGIES:
        try:
            engine = sl.Engine(model, None, strategy, cache_slots=top_k + 1, k=3)
            got = engine.generate(ids, max_new_tokens=NEW_TOKENS).token_ids
        except NotExact as exc:
            row[strategy] = f"refused: {exc}"[:300]
            continue
        except Exception as exc:  # noqa: BLE001
            row[strategy] = "error: " + "".join(traceback.format_exception_only(exc)).strip()[:300]
            continue
        row[strategy] = "pass" if got == ref else f"diverged at token {_first_diff(got, ref)}"
    row["status"] = _status(row)
    return row


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _status(row: dict) -> str:
    results = [row[s] for s in STRATEGIES]
    if any(r.startswith("diverged") for r in results):
        return "diverged"
    if any(r.startswith("error") for r in results):
        return "error"
    if any(r.startswith("refused") for r in results):
        return "refused"
    return "pass"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", help="comma-separated model types (default: every one found, plus variants)")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    names = a.families.split(",") if a.families else [t for t, _ in experts_interface_families()] + list(VARIANTS)
    rows = []
    for name in names:
        t0 = time.perf_counter()
        row = check_family(name) if name not in UNBUILDABLE else {"family": name, "status": "unbuildable",
                                                                   "why": UNBUILDABLE[name]}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "refused", "unbuildable", "error", "diverged")}
    print(f"families tried {len(rows)}: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    if a.json:
        write_atomic(a.json, json.dumps({"rows": rows, "counts": counts}, indent=1))
    return 1 if counts["diverged"] or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
