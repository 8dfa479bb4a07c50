"""The package's layout in numbers: top-level modules, folders, rooms (a top-level module or a folder), arrows
between rooms, floors (the longest chain of arrows + 1) and cycles, from the static import graph that
``tests/test_layers.py`` checks (function-local imports count).

    python scripts/layout_stats.py                 # this checkout
    python scripts/layout_stats.py --at b82424b    # any commit, read with git show (nothing checked out)
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def files_at(commit: str | None) -> dict[str, str]:
    """Package-relative path → source, of this checkout or of a commit."""
    if commit is None:
        pkg = ROOT / "specter_lab"
        return {str(p.relative_to(pkg)): p.read_text() for p in pkg.rglob("*.py") if "assets" not in p.parts}
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", commit, "specter_lab"],
                           check=True, capture_output=True, text=True).stdout.split()
    return {n[len("specter_lab/"):]: subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{n}"], check=True,
                                                    capture_output=True, text=True).stdout
            for n in names if n.endswith(".py") and "/assets/" not in n}


def module_of(rel: str) -> str:
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imports(rel: str, src: str, modules: set[str]) -> set[str]:
    mod = module_of(rel)
    pkg = mod.split(".") if rel.endswith("__init__.py") else mod.split(".")[:-1]
    if mod == "__init__":
        pkg = []
    out = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            names = [".".join(base + [node.module])] if node.module else [".".join(base + [a.name]) for a in node.names]
            out.update(names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specter_lab."):
            out.add(node.module[len("specter_lab."):])
    resolved = set()
    for n in out:
        while n and n not in modules:
            n = n.rpartition(".")[0]
        if n and n != mod:
            resolved.add(n)
    return resolved


# The one upward import made on purpose (tests/test_layers.py's ALLOWED): a result renders itself with the views,
# on request only. Counted apart, as the reviews count it.
ALLOWED = {("engine", "viz.report"), ("run.setup", "viz.report")}


def stats(files: dict[str, str]) -> dict[str, int]:
    modules = {module_of(r) for r in files}
    room = lambda m: m.split(".")[0]  # noqa: E731 - a folder is one room
    edges = {(module_of(r), d) for r, s in files.items() for d in imports(r, s, modules)}
    upward = {e for e in edges if e in ALLOWED}
    arrows = {(room(a), room(b)) for a, b in edges - upward}
    arrows = {(a, b) for a, b in arrows if a != b}
    rooms = {room(m) for m in modules}
    succ = {r: {b for a, b in arrows if a == r} for r in rooms}

    @lru_cache(maxsize=None)
    def height(r: str, seen: frozenset = frozenset()) -> int:
        if r in seen:
            return 0  # a cycle: counted below
        return 1 + max((height(s, seen | {r}) for s in succ[r]), default=0)

    cycles = sum(1 for a, b in arrows if (b, a) in arrows) // 2
    top = [r for r in files if "/" not in r]
    return {"top-level modules": len(top), "folders": len({r.split("/")[0] for r in files if "/" in r}),
            "rooms": len(rooms), "arrows": len(arrows), "floors": max(height(r) for r in rooms),
            "two-room cycles": cycles, "allowed upward arrows": len(upward), "modules": len(modules)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--at", default=None, help="a git commit (default: this checkout)")
    a = ap.parse_args()
    for k, v in stats(files_at(a.at)).items():
        print(f"{k:>18}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
