#!/usr/bin/env python
"""Fuzz ``sl.load_model(folder)`` with corrupted checkpoint folders and count the outcomes.

Two small multi-shard bf16 checkpoints of one random OLMoE (per-expert, as transformers saves it, and fused) are
written to a temporary folder; each case copies one, corrupts it one way (tests/checkpoint_fuzz.py: a truncated,
bit-flipped or removed shard, an edited or deleted index, one or two config.json fields replaced by None / -1 / 0
/ 10^12 / a string / a list / a neighbouring value, or a truncated config) and loads it; an accepted folder then
generates 2 tokens with ``lru``. Outcomes: refused at load (a CheckpointError / NotEnoughMemory), accepted (loaded
and ran), refused late (loaded, then a ValueError from the run), crashed (any other exception), hung (past ``--timeout`` s, by SIGALRM in-process).
Also reported: the slowest refusal, and the largest peak-RSS growth during any refusal (VmHWM reset per case).

    python scripts/fuzz_checkpoints.py --cases 200 --report docs/measured/checkpoint_fuzz.md
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from checkpoint_fuzz import corrupt, make_checkpoint, outcome  # noqa: E402


def _rss(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="first case's seed (cases use seed, seed+1, ...)")
    ap.add_argument("--timeout", type=int, default=20)
    ap.add_argument("--report", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    base = Path(tempfile.mkdtemp(prefix="specter_fuzz_"))
    counts: collections.Counter = collections.Counter()
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad, slowest, largest = [], (0.0, ""), (0, "")
    t0 = time.perf_counter()
    try:
        src = {layout: make_checkpoint(base / layout, layout=layout) for layout in ("per-expert", "fused")}
        for i in range(a.cases):
            seed = a.seed + i
            layout = ("per-expert", "fused")[seed % 2]
            what = corrupt(src[layout], base / "case", seed)
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass
            before = _rss("VmRSS")
            t = time.perf_counter()
            result, detail = outcome(base / "case", timeout_s=a.timeout)
            dt = time.perf_counter() - t
            grew = _rss("VmHWM") - before
            counts[result] += 1
            by_kind[what.split(" ")[0].rstrip(":")][result] += 1
            if result == "refused":
                slowest = max(slowest, (dt, f"{what} ({detail[:160]})"))
                largest = max(largest, (grew, what))
            if result in ("refused late", "crashed", "hung"):
                bad.append(f"seed {seed} {layout}: {what}: {result} {detail}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines = [f"# `sl.load_model(folder)` under fuzz: {a.cases} corrupted checkpoint folders", "",
             f"Command: `python scripts/fuzz_checkpoints.py --cases {a.cases} --seed {a.seed} --timeout {a.timeout}`"
             f" ({time.perf_counter() - t0:.0f} s on this machine, torch {torch.__version__}, transformers "
             f"{transformers.__version__}). Checkpoints: a random OLMoE (3 layers, 8 experts, hidden 128) in bf16, "
             "multi-shard with an index, per-expert (odd seeds) and fused (even seeds).", "",
             "| outcome | folders |", "|---|---|"]
    kinds = ("refused", "accepted", "refused late", "crashed", "hung")
    lines += [f"| {k} | {counts.get(k, 0)} |" for k in kinds]
    lines += ["", "| corruption | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(str(c.get(o, 0)) for o in kinds) + " |" for k, c in sorted(by_kind.items())]
    lines += ["", f"Slowest refusal: {slowest[0] * 1e3:.0f} ms: {slowest[1]}",
              f"Largest peak-RSS growth during a refusal: {largest[0] / 2**20:.1f} MiB ({largest[1]})", "",
              "Accepted folders are corruptions the model survives: bits flipped inside tensor data (the values "
              "change; nothing can tell), or config fields transformers does not need for these weights "
              "(e.g. a changed `num_experts_per_tok`, `rms_norm_eps`). Every accepted folder also generated."]
    lines += [f"- {b}" for b in bad]
    text = "\n".join(lines)
    print(text)
    if a.report:
        from specter_lab.atomic import write_atomic

        write_atomic(a.report, text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
