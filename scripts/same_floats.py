"""Same floats before and after a refactor: every strategy's tokens and metrics on the bundled model (live) and on a
trace recorded from it (replayed), computed by two versions of the package and compared exactly.

    python scripts/same_floats.py --before b82424b        # a git commit; checked out into a temporary worktree
    python scripts/same_floats.py --before b82424b --keep /tmp/floats   # the commit's JSON kept for the next call

Each version runs in its own interpreter (PYTHONPATH at its tree), writes JSON, and the two are compared key by key
(NaN equals NaN). Exit status 1 on any difference, with the first few printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run inside each version's interpreter: only the public API (sl.*), which the refactor kept.
PROBE = r"""
import json, sys, torch
torch.set_num_threads(1)
import specter_lab as sl
model, tok = sl.load_model("tiny")
names = [s for s in sl.STRATEGIES if s != "auto"]
out = {"live": {}, "replay": {}}
for s in names:
    r = sl.Engine(model, tok, s, expert_budget=0.5).generate("def fib(n):", max_new_tokens=16)
    out["live"][s] = {"tokens": r.token_ids, "metrics": r.metrics}
trace = sl.record(model, tok, ["def fib(n):", "class Stack:"], max_new_tokens=16, k_max=8, progress=False)
for s in names:
    try:
        rs = sl.replay(trace, s, expert_budget=0.5, **({"k": 8} if s in ("specter", "oracle") else {}))
    except ValueError as e:
        out["replay"][s] = {"refused": str(e)}
        continue
    out["replay"][s] = [{"tokens": r.token_ids, "metrics": r.metrics} for r in rs]
json.dump(out, open(sys.argv[1], "w"), default=str)
"""


def run_version(tree: Path, dest: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", PROBE, str(dest)], check=True, env=env, cwd=tempfile.gettempdir())
    return json.loads(dest.read_text())


# Where the package was loaded from (a trace's routing_source names its model's folder): not a result.
IGNORED = {"routing_source"}


def diffs(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        a, b = ({k: v for k, v in d.items() if k not in IGNORED} for d in (a, b))
        out = [f"{path}/{k}: only {'before' if k in a else 'after'}" for k in set(a) ^ set(b)]
        for k in sorted(set(a) & set(b)):
            out += diffs(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diffs(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{path}: before {a!r}, after {b!r}"]


def _run_commit(commit: str, tmp: Path) -> dict:
    """The probe's results at ``commit``, from a temporary worktree of it."""
    old = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), commit], check=True,
                   capture_output=True)
    try:
        return run_version(old, tmp / "before.json")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a git commit of this repository")
    ap.add_argument("--keep", default=None, help="a folder where the commit's results are kept (and read back: the "
                                                 "old version runs once)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", a.before], check=True, capture_output=True,
                                text=True).stdout.strip()
        kept = Path(a.keep) / f"{commit}.json" if a.keep else None
        if kept is not None and kept.is_file():
            before = json.loads(kept.read_text())
        else:
            before = _run_commit(commit, Path(tmp))
            if kept is not None:
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(json.dumps(before))
        after = run_version(ROOT, Path(tmp) / "after.json")
    found = diffs(before, after)
    live, replayed = len(after["live"]), len(after["replay"])
    print(f"{live} strategies live on the bundled model, {replayed} replayed on a recorded trace (2 sequences): "
          f"{len(found)} differences in tokens or metrics against {a.before}")
    for d in found[:20]:
        print("  ", d)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
