"""The package's imports point one way: each module imports only from its own layer or the layers below it, and
the module graph has no cycle. Function-local imports count too (they are how cycles used to be held apart).

The layers are listed below, lowest first; the README's code map lists the same files.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "specter_lab"

LAYERS = [
    ["errors", "units", "atomic"],  # errors, argument parsing, writing files whole: nothing above them
    ["caching"],  # the eviction policies every cache ranks with, and the cache simulator over routing ids
    ["model", "records"],  # the model adapter and geometry; a run's records (trace, tally, metrics, export)
    ["pricing"],  # profiles, shapes, the cost model, op counts, calibration, precisions, published rows
    ["offload"],  # the runtime: store, cache policies, clocks, the layer schedule, host execution
    ["predict", "decode"],  # forecasts, prefetch, K; the decode loops
    ["run"],  # strategies, the assembly (the only reader of their mechanisms), budget, draft, quantization, engine
    ["traces"],  # routing as data: the file, its formats, imports, synthetic routing, locality (torch-free to import)
    ["analysis"],  # record, replay, the bound and the gap: they drive the runtime over traces
    ["estimator"],  # estimates from a config alone, and the consumer rows they are held to
    ["studies"],  # things that run many engines: sweeps, bench, planner, fidelity, the paper's protocol
    ["viz"],  # notebook views
    ["cli", "__init__"],  # entry points
]

# Upward imports made on purpose, each with its reason. Keep this list short.
ALLOWED = {
    ("run.setup", "viz.report"): "GenerationResult.to_html renders itself with the view layer, on request only",
}

RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _module(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Package modules imported anywhere in the file (relative or absolute), as dotted names under the package."""
    mod = _module(path)
    package = mod.split(".")[:-1] if path.name != "__init__.py" else mod.split(".")
    if mod == "__init__":
        package = []
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [".".join(base + [a.name]) for a in node.names]
                out.update(n for n in names if n)
            elif node.module and node.module.startswith("specter_lab."):
                out.add(node.module[len("specter_lab."):])
        elif isinstance(node, ast.Import):
            out.update(a.name[len("specter_lab."):] for a in node.names if a.name.startswith("specter_lab."))
    return out


def _existing(name: str, modules: set[str]) -> str:
    """`from .offload.store import X` names module offload.store; `from . import planner` names planner."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _graph() -> dict[str, set[str]]:
    files = [p for p in PKG.rglob("*.py") if "assets" not in p.parts]
    modules = {_module(p) for p in files}
    return {_module(p): {_existing(n, modules) for n in _imports(p)} - {"", _module(p)} for p in files}


def _rank(module: str) -> int:
    top = module.split(".")[0]
    assert top in RANK, f"{module} is in no layer: add it to LAYERS here and to the README's code map"
    return RANK[top]


def test_every_module_has_a_layer():
    for module in _graph():
        _rank(module)


def test_imports_only_point_down():
    upward = []
    for module, deps in _graph().items():
        for dep in deps:
            if _rank(dep) > _rank(module) and (module, dep) not in ALLOWED:
                upward.append(f"{module} (layer {_rank(module)}) imports {dep} (layer {_rank(dep)})")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = _graph()
    graph = {m: {d for d in deps if (m, d) not in ALLOWED} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def _folder(module: str) -> str:
    return module.split(".")[0]


def test_pricing_never_imports_the_runtime():
    """Pricing sizes and times things; the runtime moves them. A price that needs the store is a design error."""
    bad = [f"{m} imports {d}" for m, deps in _graph().items() if _folder(m) == "pricing"
           for d in deps if _folder(d) in {"offload", "predict", "decode", "run"}]
    assert not bad, "\n".join(sorted(bad))


def test_the_runtime_never_imports_a_strategy():
    """offload/ knows slots, clocks and schedules; which strategy asked for them is run/'s business."""
    bad = [f"{m} imports {d}" for m, deps in _graph().items() if _folder(m) == "offload"
           for d in deps if _folder(d) == "run"]
    assert not bad, "\n".join(sorted(bad))


def test_the_estimator_takes_only_public_names_from_run():
    """estimator/ reads the strategy table through run/__init__ (STRATEGIES), never a run's internals."""
    bad = [f"{m} imports {d}" for m, deps in _graph().items() if _folder(m) == "estimator"
           for d in deps if _folder(d) == "run" and d != "run"]
    assert not bad, "\n".join(sorted(bad))


def test_the_top_level_keeps_only_the_public_entry():
    top = sorted(p.stem for p in PKG.glob("*.py"))
    assert top == ["__init__", "atomic", "cli", "errors", "units"], top


def test_the_readme_code_map_names_every_module():
    """scripts/code_map.py writes the map; a module the README does not name is one a reader cannot find."""
    readme = (PKG.parent / "README.md").read_text()
    section = readme[readme.index("## Code map"):]
    missing = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
               if "assets" not in p.parts and p.name != "__init__.py" and f"`{p.relative_to(PKG)}`" not in section]
    assert not missing, f"not in README.md's code map (python scripts/code_map.py): {missing}"


def test_the_checker_sees_function_local_and_relative_imports(tmp_path, monkeypatch):
    """The test itself can fail: a function-local upward import in a lower module is caught."""
    for d in ("offload", "run"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "offload" / "store.py").write_text("def f():\n    from ..run.engine import Engine\n")
    (tmp_path / "run" / "engine.py").write_text("from ..offload.store import f\n")
    monkeypatch.setitem(globals(), "PKG", tmp_path)
    graph = _graph()
    assert graph["offload.store"] == {"run.engine"} and graph["run.engine"] == {"offload.store"}
    try:
        test_imports_only_point_down()
    except AssertionError as e:
        assert "offload.store (layer 4) imports run.engine (layer 6)" in str(e)
    else:
        raise AssertionError("the upward import was not caught")


BOTTOM = ["specter_lab", "specter_lab.errors", "specter_lab.units", "specter_lab.caching.policies",
          "specter_lab.caching.simulate", "specter_lab.traces.trace_file", "specter_lab.traces.formats",
          "specter_lab.traces.npz", "specter_lab.traces.synthetic", "specter_lab.traces.locality",
          "specter_lab.pricing.profiles", "specter_lab.pricing.gpus", "specter_lab.pricing.hosts",
          "specter_lab.pricing.precision", "specter_lab.pricing.cost", "specter_lab.pricing.llamacpp"]


def test_the_bottom_imports_no_torch():
    """Traces and their formats, the policies, the simulator, the prices: data and arithmetic, no torch (and
    ``import specter_lab`` itself loads nothing but its own entry: every name on first use)."""
    import subprocess
    import sys

    probe = ("import importlib, sys; bad = []\n"
             f"for m in {BOTTOM!r}:\n"
             "    importlib.import_module(m)\n"
             "    if 'torch' in sys.modules or 'transformers' in sys.modules: bad.append(m); break\n"
             "print(bad)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"imports torch or transformers: {out}"


@pytest.mark.parametrize("entry", ["specter_lab.studies.bench", "specter_lab.Engine"])
def test_every_entry_that_builds_auto_engines_has_the_planner(entry):
    """``strategy="auto"`` plans with the function ``studies/planner.py`` registers on import (the engine never
    imports the planner that builds engines), so each public way in that builds one (``sl.Engine``; ``sl.compare``
    and the bench's sweeps) must have imported it: a fresh ``sl.compare(..., strategies=["auto"])`` failed with
    "needs a planner" when only the top-level ``sl.Engine`` imported it."""
    import subprocess
    import sys

    load = (f"import {entry}" if not entry.endswith("Engine") else "import specter_lab as sl; sl.Engine")
    probe = f"{load}\nfrom specter_lab.run.engine import auto_planner\nprint(auto_planner().__name__)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "plan", done.stderr[-400:]
