"""Run tutorial notebooks and store what nbval compares: the printed output of each ``# NBVAL_CHECK_OUTPUT`` cell
(with its execution count), and nothing else (notebooks/README.md, "Editing a notebook").

The prose of a notebook may quote a number only where a checked cell prints it (tests/test_notebooks_meta.py), so
after a change that moves a number (the cost model, the planner, an estimate), run this on the notebooks it
touches, read the new checked lines against the prose, fix the prose, and commit both:

    python scripts/notebook_outputs.py notebooks/06_reproducing_specter.ipynb [more.ipynb ...]

It runs each notebook top to bottom in its own folder (as nbval does), one at a time, and prints the checked
lines it stored.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHECK = "# NBVAL_CHECK_OUTPUT"


def refresh(path: Path, timeout: int = 600) -> list[str]:
    """Execute ``path`` and rewrite it with only its checked cells' stdout; returns those cells' text."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    printed = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        checked = c.source.lstrip().startswith(CHECK)
        c.outputs = [o for o in c.outputs if checked and o.output_type == "stream" and o.name == "stdout"]
        c.metadata = {}
        if checked:  # nbval needs the execution count of a checked cell, or it calls it unrun
            printed.append("".join(o.text for o in c.outputs))
        else:
            c.execution_count = None
    nbformat.write(nb, path)
    return printed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args(argv)
    for path in args.notebooks:
        print(f"== {path}")
        for text in refresh(path, args.timeout):
            print(text.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
