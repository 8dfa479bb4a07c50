"""Notebook hygiene, without running a kernel (nbval executes the notebooks themselves):

* each tutorial is valid nbformat 4.5 (every cell stored with its id), runs on the ``python3`` kernel and opens with a markdown title;
* it teaches: prose between the code (never more than two code cells in a row), and not much less prose than code;
* it is saved light: no outputs except in the cells nbval compares (``# NBVAL_CHECK_OUTPUT``), whose stored outputs
  are small text (with the execution count nbval needs); no widget state; no other execution counts;
* it never downloads: a hub id only appears behind ``SPECTER_LAB_ONLINE``, CUDA only behind
  ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = ["01_quickstart", "02_quantization", "03_timelines", "04_compare", "05_your_model",
            "06_reproducing_specter", "07_estimate"]
MAX_CODE_RUN = 2  # code cells in a row without a markdown cell between them
MAX_CHECKED_OUTPUT = 2_000  # characters of stored output per checked cell
MAX_FILE_BYTES = 100_000
CHECK = "# NBVAL_CHECK_OUTPUT"


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_tutorials_are_there():
    assert [p.stem for p in _notebooks()] == EXPECTED
    assert (NOTEBOOKS / "sanitize.cfg").is_file()


@pytest.fixture(params=_notebooks(), ids=lambda p: p.stem)
def nb(request):
    path = request.param
    assert path.stat().st_size <= MAX_FILE_BYTES, f"{path.name} is {path.stat().st_size:,} B: clear its outputs"
    # nbformat.read adds a missing cell id with only a warning; the stored file must carry them (4.5 requires
    # them, and JupyterLab rewrites the file with new ones on first save: a noisy diff)
    missing = [i for i, c in enumerate(json.loads(path.read_text())["cells"]) if "id" not in c]
    assert not missing, f"{path.name}: cells {missing} have no id (nbformat.validator.normalize adds them)"
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    return notebook


def test_kernel_and_title(nb):
    assert nb.metadata.kernelspec.name == "python3"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), "open with a markdown title"


def test_prose_between_code(nb):
    kinds = [c.cell_type for c in nb.cells]
    run = longest = 0
    for k in kinds:
        run = run + 1 if k == "code" else 0
        longest = max(longest, run)
    assert longest <= MAX_CODE_RUN, f"{longest} code cells in a row: explain what they show"
    n_md, n_code = kinds.count("markdown"), kinds.count("code")
    assert n_md >= 0.6 * n_code, f"{n_md} markdown cells for {n_code} code cells"
    prose = sum(len(c.source) for c in nb.cells if c.cell_type == "markdown")
    code = sum(len(c.source) for c in nb.cells if c.cell_type == "code")
    assert prose >= 0.75 * code, f"{prose} characters of prose for {code} of code"
    for c in nb.cells:
        if c.cell_type == "markdown":
            assert c.source.strip(), "empty markdown cell"


def test_saved_without_outputs(nb):
    assert "widgets" not in nb.metadata, "widget state saved: clear the outputs"
    checked = 0
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        if c.source.lstrip().startswith(CHECK):
            checked += 1
            assert c.outputs, "a checked cell needs its expected output stored"
            # nbval refuses stored outputs on a cell without an execution count ("unrun reference cell")
            assert c.execution_count is not None, "a checked cell needs its execution count stored"
            for o in c.outputs:
                assert o.output_type == "stream", "checked cells store plain printed text only"
                assert len(o.text) <= MAX_CHECKED_OUTPUT
        else:
            assert not c.outputs, f"outputs stored in an unchecked cell: {c.source[:60]!r}"
            assert c.execution_count is None, "execution counts saved: clear the outputs"
    assert len(json.dumps(nb)) <= MAX_FILE_BYTES


def test_offline_and_cpu_safe(nb):
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for m in re.finditer(r"load_model\(\s*[\"']([^\"']+)[\"']", code):
        name = m.group(1)
        if name != "tiny" and re.fullmatch(r"[\w.-]+/[\w.-]+", name):  # a hub id
            assert "SPECTER_LAB_ONLINE" in code, f"hub id {name!r} outside an SPECTER_LAB_ONLINE guard"
    if re.search(r"hardware\s*=\s*[\"']cuda[\"']|sl\.calibrate\(", code):
        assert "torch.cuda.is_available()" in code, "CUDA use without a torch.cuda.is_available() guard"


def test_checked_outputs_exist_somewhere():
    # at least the lossless checks are compared, not only executed
    total = sum(c.source.lstrip().startswith(CHECK) for p in _notebooks()
                for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code")
    assert total >= 2


# A number the prose quotes as a result: two or more decimals (10.39, 0.72), a factor (1.71×) or a percentage
# (12 %). Such a number changes whenever the model, the cost model or an estimate does, so the prose may quote it
# only where a checked cell prints it (nbval then compares that output, sanitize.cfg masking none of these), or
# where the notebook's own code sets it (a parameter). Rounded approximations with one decimal ("~0.7 ms") are
# not held to this (issue 55: E5, E8-E12, E17 were prose that its own output contradicted).
_QUOTED = re.compile(r"(?<![\w.])(\d+\.\d{2,}|\d+(?:\.\d+)?(?=\s?×)|\d+(?:\.\d+)?(?=\s?%))")


def _checked_text(nb) -> str:
    return "\n".join(o.text for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(CHECK)
                     for o in c.outputs if o.output_type == "stream")


def test_prose_numbers_are_printed_by_checked_cells(nb):
    checked = _checked_text(nb)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    # code spans and arXiv ids are not results
    prose = "\n".join(re.sub(r"`[^`]*`|arXiv \S+", "", c.source) for c in nb.cells if c.cell_type == "markdown")
    loose = sorted({n for n in _QUOTED.findall(prose) if not re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", checked)
                    and not re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", code)})
    assert not loose, (f"numbers in the prose that no checked cell prints and no code sets: {loose} (print them in "
                       "a # NBVAL_CHECK_OUTPUT cell, scripts/notebook_outputs.py stores its output, or refer to "
                       "the printed line instead)")
