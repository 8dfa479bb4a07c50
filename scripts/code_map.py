"""The README's code map, one line per module from its docstring's first sentence, folders in layer order.

    python scripts/code_map.py > /tmp/map.md     # then paste it under README.md's "## Code map"

``tests/test_layers.py`` checks that the README names every module, so a new file fails there until it is listed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "specter_lab"
# (the folder's line, its folder or its files), lowest floor first, as tests/test_layers.py's LAYERS
LAYERS = [("*the public entry*", ["errors.py", "units.py", "atomic.py"]),
          ("`caching/`: the eviction policies every cache ranks with, and the cache simulator", "caching"),
          ("`model/`: the model adapter: inspection, the experts interface, geometry from a config, loading, tiny models", "model"),
          ("`records/`: a run's records", "records"),
          ("`pricing/`: what things cost (never imports the runtime)", "pricing"),
          ("`offload/`: the runtime (knows no strategy)", "offload"),
          ("`predict/`: forecasts, prefetch, K", "predict"),
          ("`decode/`: the decode loops", "decode"),
          ("`run/`: one strategy on one model", "run"),
          ("`traces/`: routing as data", "traces"),
          ("`analysis/`: record, replay, the bound and the gap (drive the runtime)", "analysis"),
          ("`estimator/`: estimates from a config alone, a replay on a llama.cpp-class clock (takes only `run/`'s public names)", "estimator"),
          ("`studies/`: things that run many engines or replays", "studies"),
          ("`viz/`: notebook views", "viz"),
          ("*entry points*", ["cli.py", "__init__.py"])]


def first(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line, cut at 150 characters."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = " ".join(doc.split("\n\n")[0].split())
    s = line if len(line) < 150 else line[:147].rsplit(" ", 1)[0] + " …"
    return s.rstrip(".")


def code_map() -> str:
    out = []
    for title, what in LAYERS:
        out.append(f"- {title}")
        files = [PKG / f for f in what] if isinstance(what, list) else sorted((PKG / what).glob("*.py"))
        for f in files:
            if f.name == "__init__.py" and isinstance(what, str):
                continue
            out.append(f"  - `{f.relative_to(PKG)}`: {first(f)}")
    return "\n".join(out)


if __name__ == "__main__":
    print(code_map())
