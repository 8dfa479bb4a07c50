"""Nothing lost on long work (issue 56): every file is written whole or not at all (the old one intact when a write
fails midway, a full disk or a file-size limit named with the bytes it needs); a recording with ``out=`` resumes
to exactly the uninterrupted trace and refuses another model or setting by name; a sweep with ``results=``
resumes to the uninterrupted frame; a results file's torn last line is dropped and a corrupt middle line refused.
The kills themselves (SIGKILL, SIGINT, memory limits at random moments) are ``scripts/fault_injection.py``'s."""

from __future__ import annotations

import ast
import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import specter_lab as sl
from specter_lab import atomic
from specter_lab.errors import DiskFull, ResultsFileError, ResumeMismatch
from specter_lab.analysis import record as record_module
from specter_lab.traces.trace_file import _ARRAYS
from specter_lab.studies import runs as runs_module
from specter_lab.studies.results_file import open_results, read_lines

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
REC = dict(max_new_tokens=6, k_max=2, progress=False)
PKG = Path(sl.__file__).parent


# --------------------------------------------------------------------------------------------- the helper
def test_a_write_that_raises_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.html"
    atomic.write_atomic(path, "old report")
    for exc in (RuntimeError("the writer failed"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with atomic.atomic_open(path, "w") as f:
                f.write("half of the new re")
                f.flush()
                assert atomic.temp_files(path)  # the new content is beside the old file, under another name
                raise exc
        assert path.read_text() == "old report" and atomic.temp_files(path) == []
    atomic.write_atomic(path, "new report")
    assert path.read_text() == "new report" and atomic.temp_files(path) == []


def test_a_full_disk_midway_is_named_with_the_path_and_bytes(tmp_path):
    """ENOSPC from a write after 20,000 bytes landed (as a file object raises it; the real one, EFBIG, is the
    subprocess test's): DiskFull names the path and the bytes written, the old file stays."""
    path = tmp_path / "t.csv"
    atomic.write_atomic(path, "a,b\n1,2\n")
    with pytest.raises(DiskFull) as err:
        with atomic.atomic_open(path, "wb") as f:
            for _ in range(2):
                f.write(b"x" * 10_000)
            f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
    e = err.value
    assert e.errno == errno.ENOSPC and e.path == str(path) and e.needed_bytes == 20_000 and not e.needed_exact
    assert str(path) in str(e) and "20,000 bytes" in str(e) and "intact" in str(e)
    assert path.read_text() == "a,b\n1,2\n" and atomic.temp_files(path) == []
    # the same error from an unrelated cause (a permission) is left as it is
    with pytest.raises(PermissionError):
        with atomic.atomic_open(path, "w"):
            raise PermissionError(errno.EACCES, "denied")


def test_a_failed_append_is_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    atomic.append_line(path, "first")
    real_write = os.write

    def half(fd, data):  # half the line lands, then the disk is full
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "write", half)
    with pytest.raises(DiskFull, match="r.jsonl"):
        atomic.append_line(path, "second, a longer line")
    monkeypatch.undo()
    assert path.read_text() == "first\n"


_FSIZE_CHILD = textwrap.dedent("""
    import json, resource, signal, sys
    import specter_lab as sl
    from specter_lab.atomic import atomic_open, temp_files
    from specter_lab.errors import DiskFull
    path, limit = sys.argv[1], int(sys.argv[2])
    trace = sl.load_trace(path + ".bigger")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    out = {}
    try:
        trace.save(path)                          # its size is known: refused before a byte is written
    except DiskFull as e:
        out["save"] = [str(e), e.needed_bytes, e.limit_bytes, len(temp_files(path))]
    try:
        trace.export(path + ".csv", "llama_csv")   # streamed: fails when the limit is reached
    except DiskFull as e:
        out["export"] = [str(e), e.needed_bytes, e.errno, len(temp_files(path + ".csv"))]
    print(json.dumps(out))
""")


def test_a_real_file_size_limit_in_a_subprocess(tmp_path, model):
    """RLIMIT_FSIZE below the new trace's size: the save over an existing trace and a streamed export both fail
    with DiskFull naming the path and the bytes; the old files are byte for byte what they were."""
    small = sl.record(model, None, PROMPTS[:1], max_new_tokens=3, k_max=0, progress=False)
    big = sl.record(model, None, PROMPTS, max_new_tokens=10, k_max=2, progress=False)
    path = tmp_path / "t.npz"
    small.save(path)
    small.export(str(path) + ".csv", "llama_csv")
    big.save(str(path) + ".bigger")
    before = path.read_bytes(), Path(str(path) + ".csv").read_bytes()
    limit = len(before[0]) + 100
    assert Path(str(path) + ".bigger").stat().st_size > limit
    proc = subprocess.run([sys.executable, "-c", _FSIZE_CHILD, str(path), str(limit)], capture_output=True,
                          text=True, timeout=300, cwd=PKG.parent)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    msg, needed, lim, temps = out["save"]
    assert str(path) in msg and "file-size limit" in msg and needed > limit and lim == limit and temps == 0
    msg, needed, err, temps = out["export"]
    assert str(path) + ".csv" in msg and err == errno.EFBIG and needed >= limit and temps == 0
    assert (path.read_bytes(), Path(str(path) + ".csv").read_bytes()) == before
    assert sl.load_trace(path).sequences[0].tokens.tolist() == small.sequences[0].tokens.tolist()


def _writes_a_path(call: ast.Call) -> bool:
    """A call that writes a file by its name: ``open(p, "w")``, ``p.write_text``, ``np.savez(p)``, ``df.to_csv(p)``,
    ``json.dump`` (into a file), ``fig.write_image(p)`` (not into an in-memory buffer or a file object ``f``)."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    first = call.args[0] if call.args else None
    to_object = isinstance(first, ast.Name) and first.id in ("f", "fh", "buf")
    if name == "open":
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
    if name in ("write_text", "write_bytes", "dump"):
        return True
    if name in ("savez", "savez_compressed", "save", "to_csv", "to_parquet", "write_image", "write_html"):
        return first is not None and not to_object and name != "save" or (name == "save" and _np(f))
    return False


def _np(f) -> bool:
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("np", "numpy", "torch")


def test_no_writer_of_the_package_opens_a_final_name_itself():
    """Every file the package writes goes through specter_lab/atomic.py: no other module opens a path for
    writing, writes text or bytes to one, or hands one to numpy, torch or pandas to write."""
    found = []
    for f in PKG.rglob("*.py"):
        if f.name == "atomic.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and _writes_a_path(node):
                found.append(f"{f.relative_to(PKG)}:{node.lineno}: {ast.unparse(node)[:100]}")
    assert not found, "\n".join(found)


def test_the_writer_check_can_fail():
    calls = ['open(path, "w", encoding="utf-8")', "path.write_text(x)", "np.savez_compressed(path, **a)",
             "df.to_csv(path, index=False)", "json.dump(doc, fh)"]
    fine = ["open(path)", 'open(path, "rb")', "np.savez_compressed(buf, **a)", "df.to_csv(f, index=False)",
            'atomic_open(path, "w")', "trace.save(path)"]
    assert all(_writes_a_path(ast.parse(c).body[0].value) for c in calls)
    assert not any(_writes_a_path(ast.parse(c).body[0].value) for c in fine)


# --------------------------------------------------------------------------------------------- record(out=)
def _same_sequences(a: sl.RoutingTrace, b: sl.RoutingTrace) -> None:
    assert len(a.sequences) == len(b.sequences)
    for x, y in zip(a.sequences, b.sequences):
        for name in _ARRAYS:
            u, v = getattr(x, name), getattr(y, name)
            assert (u is None and v is None) or np.array_equal(u, v), name
    as_json = lambda c: json.loads(json.dumps(c))  # noqa: E731 (a file's config has JSON's string keys)
    assert (as_json(a.config), a.k_max, a.draft, a.source) == (as_json(b.config), b.k_max, b.draft, b.source)


@pytest.fixture(scope="module")
def uninterrupted(model):
    return sl.record(model, None, PROMPTS, **REC)


def test_record_out_resumes_to_the_uninterrupted_trace(model, uninterrupted, tmp_path, monkeypatch, capsys):
    """Interrupted while recording the second prompt: the file holds the first, as a trace that loads and
    replays; resume=True records only the other two and the result is the uninterrupted recording."""
    path = tmp_path / "rec.npz"
    calls = []
    real = record_module._autoregressive

    def interrupted(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # a Ctrl-C (or a kernel's interrupt) inside the second prompt
        return real(*args, **kw)

    monkeypatch.setattr(record_module, "_autoregressive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sl.record(model, None, PROMPTS, out=path, **REC)
    monkeypatch.undo()
    partial = sl.load_trace(path)
    assert len(partial.sequences) == 1 and partial.meta["recording"]["sequences_planned"] == 3
    _same_sequences(partial, sl.RoutingTrace(**{**vars(uninterrupted), "sequences": uninterrupted.sequences[:1]}))
    replayed = sl.replay(partial, "lru", expert_budget=0.5)
    assert replayed[0].token_ids == uninterrupted.sequences[0].tokens.tolist()

    calls.clear()
    monkeypatch.setattr(record_module, "_autoregressive", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    resumed = sl.record(model, None, PROMPTS, out=path, resume=True, **{**REC, "progress": True})
    assert len(calls) == 2  # the two prompts not on disk, nothing else
    assert "1 of 3 sequences already on disk" in capsys.readouterr().out
    _same_sequences(resumed, uninterrupted)
    _same_sequences(sl.load_trace(path), uninterrupted)
    for strategy in ("lru", "specter"):
        kw = dict(expert_budget=0.5, k=2 if strategy == "specter" else None)
        got, want = sl.replay(resumed, strategy, **kw), sl.replay(uninterrupted, strategy, **kw)
        pd.testing.assert_frame_equal(pd.DataFrame([r.metrics for r in got]), pd.DataFrame([r.metrics for r in want]),
                                      check_exact=True)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert atomic.temp_files(path) == []


def test_record_refuses_another_setting_model_or_prompts_by_name(model, uninterrupted, tmp_path):
    path = tmp_path / "rec.npz"
    uninterrupted.save(path)
    before = path.read_bytes()
    cases = {"resume": dict(),  # a file there, resume not asked
             "max_new_tokens": dict(resume=True, max_new_tokens=7),
             "k_max": dict(resume=True, k_max=3),
             "draft": dict(resume=True, draft=sl.QuantSpec(2, 64)),
             "prompt 1": dict(resume=True, prompts=[PROMPTS[0], PROMPTS[2], PROMPTS[1]]),
             "prompts": dict(resume=True, prompts=PROMPTS[:2])}
    for field, kw in cases.items():
        kw = {**REC, **kw}
        with pytest.raises(ResumeMismatch) as err:
            sl.record(model, None, kw.pop("prompts", PROMPTS), out=path, **kw)
        assert err.value.field == field and str(path) in str(err.value)
    other = sl.tiny_random_model("qwen2_moe", seed=2)  # same config, other weights
    with pytest.raises(ResumeMismatch, match="model.weights=") as err:
        sl.record(other, None, PROMPTS, out=path, resume=True, **REC)
    assert err.value.field == "model.weights"
    assert path.read_bytes() == before  # refused before anything was written
    # more prompts than the file holds: only the new one is recorded, the rest is the file's
    more = sl.record(model, None, PROMPTS + [[20, 21, 22]], out=path, resume=True, **REC)
    assert len(more.sequences) == 4
    _same_sequences(sl.RoutingTrace(**{**vars(more), "sequences": more.sequences[:3]}), uninterrupted)


def test_cli_trace_record_resume(tmp_path, capsys):
    from specter_lab.cli import main

    out = tmp_path / "t.npz"
    args = ["trace", "record", "--out", str(out), "--prompts", "1", "--max-new-tokens", "4", "--k-max", "0"]
    assert main(args) == 0
    first = out.read_bytes()
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err and out.read_bytes() == first
    assert main(args + ["--prompts", "2", "--resume"]) == 0
    assert "1 of 2 sequences already on disk" in capsys.readouterr().out
    assert len(sl.load_trace(out).sequences) == 2


# --------------------------------------------------------------------------------------------- compare(results=)
SWEEP = dict(strategies=["lru", "host_lru", "specter"], expert_budget=[0.5, 0.35], k=2, progress=False,
             hardware=["rtx4090-pcie4"], cost_shape="deepseek-v2-lite")


def test_compare_results_resumes_to_the_uninterrupted_frame(uninterrupted, tmp_path, monkeypatch):
    path = tmp_path / "cells.jsonl"
    full = sl.compare(None, None, trace=uninterrupted, executor=None, **SWEEP)
    real, ran = runs_module.TraceSource.run, []

    total = full.attrs["sweep"]["cells"]  # those that fit the budget (a row says so for the others)
    assert total >= 4

    def stops_after_three(self, cell):
        if len(ran) == 3:
            raise KeyboardInterrupt  # the sweep is stopped at its fourth cell
        ran.append(cell)
        return real(self, cell)

    monkeypatch.setattr(runs_module.TraceSource, "run", stops_after_three)
    with pytest.raises(KeyboardInterrupt):
        sl.compare(None, None, trace=uninterrupted, executor=None, results=path, **SWEEP)
    monkeypatch.undo()
    assert len(read_lines(path)[0]) == 1 + 3  # the header and the three finished cells
    again = sl.compare(None, None, trace=uninterrupted, executor=None, results=path, **SWEEP)
    assert again.attrs["sweep"]["cells"] == total - 3 and again.attrs["sweep"]["from_results_file"] == 3
    # row for row: same columns, order and floats (wall_s is each cell's own time when it ran)
    pd.testing.assert_frame_equal(again.drop(columns="wall_s"), full.drop(columns="wall_s"), check_exact=True)
    once_more = sl.compare(None, None, trace=uninterrupted, executor=None, results=path, **SWEEP)
    assert once_more.attrs["sweep"]["cells"] == 0
    pd.testing.assert_frame_equal(once_more, again, check_exact=True)


def test_compare_results_from_a_process_pool_equal_the_serial_run(uninterrupted, tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    path = tmp_path / "cells.jsonl"
    serial = sl.compare(None, None, trace=uninterrupted, executor=None, **SWEEP)
    with ProcessPoolExecutor(2) as pool:
        pooled = sl.compare(None, None, trace=uninterrupted, executor=pool, results=path, **SWEEP)
    reread = sl.compare(None, None, trace=uninterrupted, executor=None, results=path, **SWEEP)
    assert reread.attrs["sweep"]["cells"] == 0
    for df in (pooled, reread):
        pd.testing.assert_frame_equal(df.drop(columns="wall_s"), serial.drop(columns="wall_s"), check_exact=True)


def test_a_results_file_of_other_settings_is_refused_by_name(uninterrupted, model, tmp_path):
    path = tmp_path / "cells.jsonl"
    sl.compare(None, None, trace=uninterrupted, executor=None, results=path, **SWEEP)
    before = path.read_bytes()
    other = sl.record(model, None, PROMPTS[:2], **REC)
    for field, kw in {"settings.cost_shape": dict(cost_shape="mixtral-8x7b"), "settings.k": dict(k=1),
                      "source.trace": dict(trace=other)}.items():
        with pytest.raises(ResumeMismatch) as err:
            sl.compare(None, None, executor=None, results=path, **{**SWEEP, "trace": uninterrupted, **kw})
        assert err.value.field == field and str(path) in str(err.value)
    with pytest.raises(ResumeMismatch, match="'compare' sweep") as err:
        sl.bench.reproduce_paper(None, None, trace=uninterrupted, results=path, progress=False)
    assert err.value.field == "kind" and path.read_bytes() == before


def test_a_torn_last_line_is_dropped_and_a_corrupt_middle_line_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    log = open_results(path, "compare", {"source": "x"})
    for i in range(3):
        log.add({"cell": i}, {"tpot_ms": 1.0 + i, "nan": float("nan"), "hist": {0: 2, 4: 1}, "pair": (1, 2)})
    whole = path.read_bytes()
    back = open_results(path, "compare", {"source": "x"})
    assert back.get({"cell": 1}) == {"tpot_ms": 2.0, "nan": back.get({"cell": 1})["nan"], "hist": {0: 2, 4: 1},
                                     "pair": (1, 2)}
    assert np.isnan(back.get({"cell": 1})["nan"])
    # a kill mid-append: half a line, no newline. Dropped on read and cut before the next append.
    with open(path, "ab") as f:
        f.write(b'{"cell":{"cell":3},"result":{"tpot')
    torn = open_results(path, "compare", {"source": "x"})
    assert torn.dropped_torn_line and len(torn.cells) == 3 and path.read_bytes() == whole
    torn.add({"cell": 3}, {"tpot_ms": 4.0})
    assert len(open_results(path, "compare", {"source": "x"}).cells) == 4
    # a whole last line whose checksum fails is torn too; the same in the middle is refused with its number
    lines = path.read_bytes().split(b"\n")
    flipped = lines[2].replace(b'"tpot_ms":2.0', b'"tpot_ms":2.5')
    assert flipped != lines[2]
    path.write_bytes(b"\n".join(lines[:2] + [flipped] + lines[3:]))
    with pytest.raises(ResultsFileError) as err:
        open_results(path, "compare", {"source": "x"})
    assert err.value.line == 3 and "line 3 of 5" in str(err.value)
    path.write_bytes(b"\n".join(lines[:-2] + [lines[-2].replace(b'4.0', b'4.5'), b""]))
    assert len(open_results(path, "compare", {"source": "x"}).cells) == 3


def test_cli_bench_results(uninterrupted, tmp_path, capsys):
    from specter_lab.cli import main

    trace, results = tmp_path / "t.npz", tmp_path / "cells.jsonl"
    uninterrupted.save(trace)
    args = ["bench", "--trace", str(trace), "--strategies", "lru,host_lru", "--hardware", "rtx4090-pcie4",
            "--budgets", "0.5", "--json", "--results", str(results)]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(read_lines(results)[0]) == 3
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["runs"] == second["runs"]


# --------------------------------------------------------------------------------------------- the live view
def test_live_run_out_keeps_the_steps_done_so_far(model, tmp_path):
    import threading

    from specter_lab.viz.live_file import load_live

    path = tmp_path / "live.json"
    engine = sl.Engine(model, None, "lru", cache_slots=3)
    seen, hold, release = [], threading.Event(), threading.Event()

    def watch(info):
        seen.append(info.step)
        if len(seen) == 5:  # after 4 saves of 1 step and this step's callback, hold the run
            hold.set()
            release.wait(30)

    run = sl.viz.live(engine, [5, 6, 7, 8], max_new_tokens=12, callback=watch, out=path, save_every=2)
    assert hold.wait(60)
    mid = load_live(path)  # what a kernel that died here would have left
    assert mid.status == "running" and len(mid.steps) == 4 and len(mid.token_ids) == 4
    release.set()
    result = run.join(60)
    end = load_live(path)
    assert end.status == "done" and end.token_ids == result.token_ids
    assert len(end.steps) == len(result.trace.frames()["steps"]) and mid.token_ids == end.token_ids[:4]
    assert atomic.temp_files(path) == []
