"""The package's imports point one way: each module imports only from its own layer or the layers below it, and
the module graph has no cycle. Function-local imports count too (they are how cycles used to be held apart).

The layers are listed below, lowest first; the README's code map lists the same files.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "specter_lab"

LAYERS = [
    ["errors", "units", "strategies", "quant", "drafts", "prompts", "paper"],  # data and specs: no package imports
    # counters and records; recorded routing and its locality; the budget split; the model adapter
    ["tally", "trace", "routing_trace", "locality", "budget", "model"],
    # derived metrics; store, runtime, clocks, costs; forecasts, prefetch, K; a run's trace as trace-event JSON
    ["metrics", "offload", "predict", "perfetto"],
    ["decode", "assembly"],  # the decode loops; strategy → a run's parts (the only reader of its mechanisms)
    ["engine"],  # one model + strategy + budget + clock
    # things that run engines or read traces; published rows; estimates from a config and their anchors
    ["runs", "fidelity", "analysis", "published", "record", "replay", "bound", "estimate", "consumer",
     "import_routing"],
    ["bench", "planner", "reproduce"],  # comparisons, the planner, the paper's protocol reproduced
    ["viz"],  # notebook views
    ["cli", "__init__"],  # entry points
]

# Upward imports made on purpose, each with its reason. Keep this list short.
ALLOWED = {
    ("engine", "viz.report"): "GenerationResult.to_html renders itself with the view layer, on request only",
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


def test_the_checker_sees_function_local_and_relative_imports(tmp_path, monkeypatch):
    """The test itself can fail: a function-local upward import in a lower module is caught."""
    (tmp_path / "offload").mkdir()
    (tmp_path / "offload" / "__init__.py").write_text("")
    (tmp_path / "offload" / "store.py").write_text("def f():\n    from ..engine import Engine\n")
    (tmp_path / "engine.py").write_text("from .offload.store import f\n")
    monkeypatch.setitem(globals(), "PKG", tmp_path)
    graph = _graph()
    assert graph["offload.store"] == {"engine"} and graph["engine"] == {"offload.store"}
    try:
        test_imports_only_point_down()
    except AssertionError as e:
        assert "offload.store (layer 2) imports engine (layer 4)" in str(e)
    else:
        raise AssertionError("the upward import was not caught")
