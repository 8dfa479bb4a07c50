"""Fault injection (issue 56): kill the long work at random moments and check that nothing finished is lost.

Three kinds of work, each in a child process forked from this one (the bundled model and the traces already in
memory, so a child starts in milliseconds):

- ``record``: ``sl.record(model, tok, prompts, out=F, resume=True)`` on the bundled model;
- ``compare``: ``sl.compare(None, None, ..., trace=T, results=R)`` on a trace recorded from the bundled model and
  on a DeepSeek-V2-Lite-shaped trace (26 MoE layers, 64 experts, top-6: synthetic routing with DeepSeek-V2's
  published locality, imported with a modelled draft; no model needed);
- ``save``: ``trace.save(F)`` over an existing trace, two versions in turn, in a loop (both traces).

Each is interrupted three ways: ``SIGKILL`` at a random moment (uniform over an uninterrupted run's time), a
``KeyboardInterrupt`` (``SIGINT``) at a random moment, and memory that runs out at a random moment (a thread
sets ``RLIMIT_AS`` to the child's current size and takes every free byte it still has: the work's next
allocation fails, a ``MemoryError`` or torch's allocator error). After every interruption the files
are checked: every file under a final name loads (a trace with every array checked, a results file with every
line's checksum; a torn last line is counted, not an error), holds at least every sequence or cell the child had
reported durable (a save or append that returned), and each of them equals the uninterrupted run's. Then the work
is resumed, interrupted again, until a resume runs to its end here, whose output (tokens, routing arrays, replayed
metrics; the compare frame) must equal the uninterrupted run's. Last, a disk that fills during a save: a file-size
limit (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored) and, where this machine lets root mount one, a small ``tmpfs``:
the error must name the path and the bytes needed and leave the old file intact, byte for byte.

    python scripts/fault_injection.py                    # 100 SIGKILLs, the default page
    python scripts/fault_injection.py --kills 20 --others 2 --out /tmp/fi.md   # a quick run

Writes ``docs/measured/fault_injection.md`` (whole, :mod:`specter_lab.atomic`). Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import platform
import random
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the children are forked

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import specter_lab as sl  # noqa: E402
from specter_lab import atomic  # noqa: E402
from specter_lab.errors import DiskFull  # noqa: E402
from specter_lab.model.geometry import CONFIG_DIR, geometry_from_config  # noqa: E402
from specter_lab.traces import trace_file  # noqa: E402
from specter_lab.traces.synthetic import locality_for, synthetic_routing  # noqa: E402
from specter_lab.traces.trace_file import _ARRAYS  # noqa: E402
from specter_lab.studies import results_file  # noqa: E402
from specter_lab.studies.results_file import open_results, read_lines  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECORD = dict(max_new_tokens=10, k_max=2)  # 4 prompts: about 2 s of recording here
STRATEGIES = ["lru", "host_lru", "lfu_decay", "split_lfu", "specter", "specter_split"]
BUDGETS = [0.5, 0.25]
HOW = ("SIGKILL", "SIGINT", "RLIMIT_AS")


# ----------------------------------------------------------------------------------------------- the work
@dataclass
class Work:
    """One kind of work on one target: how to run it (in a child or here), its files, and the checks."""

    key: str  # its name for a fresh child (--child)
    phase: str  # record, compare, save
    target: str  # bundled model, bundled trace, DeepSeek-V2-Lite-shaped trace
    run: Callable[[Path], object]  # the work itself, into a folder
    check: Callable[[Path, int], "tuple[int, int, int]"]  # (files checked, units on disk, torn lines) or raise
    finish: Callable[[Path], "tuple[int, bool]"]  # resume to the end here: (units recovered, equal)
    seconds: float = 1.0  # an uninterrupted run's time (children's kills land within it)
    loops: bool = False  # a save loop: runs until killed (the memory limit stops it after `loops_n`)


@dataclass
class Row:
    phase: str
    target: str
    how: str
    interruptions: int = 0
    ended_first: int = 0  # runs that finished before the interruption landed (not counted as one)
    files: int = 0
    bad: int = 0
    temporaries: int = 0  # left by a kill under a temporary name (never the final one)
    swept: int = 0  # of those, removed by the next successful write
    torn: int = 0
    acked: int = 0  # sequences or cells a child reported durable before it was interrupted (summed)
    lost: int = 0
    recovered: int = 0  # found on disk by the resumes that ran to their end
    episodes: int = 0
    equal: int = 0
    causes: Counter = field(default_factory=Counter)
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def _same_trace(a: sl.RoutingTrace, b: sl.RoutingTrace, n: int | None = None) -> bool:
    """``a``'s sequences equal ``b``'s first ``n`` (all when None), array by array."""
    seqs = b.sequences if n is None else b.sequences[:n]
    if len(a.sequences) != len(seqs) or (a.k_max, a.draft) != (b.k_max, b.draft):
        return False
    for x, y in zip(a.sequences, seqs):
        for name in _ARRAYS:
            u, v = getattr(x, name), getattr(y, name)
            if (u is None) != (v is None) or (u is not None and not np.array_equal(u, v)):
                return False
    return True


def _replays_equal(a: sl.RoutingTrace, b: sl.RoutingTrace) -> bool:
    """Tokens and every metric of two strategies replayed on both traces, exactly (NaN equal to NaN)."""
    for strategy, kw in (("lru", {}), ("specter", {"k": 2})):
        ra, rb = (sl.replay(t, strategy, expert_budget=0.5, **kw) for t in (a, b))
        if [r.token_ids for r in ra] != [r.token_ids for r in rb]:
            return False
        try:
            pd.testing.assert_frame_equal(pd.DataFrame([r.metrics for r in ra]), pd.DataFrame([r.metrics for r in rb]),
                                          check_exact=True)
        except AssertionError:
            return False
    return True


def record_work(model, prompt_ids: list, reference: "sl.RoutingTrace | None" = None) -> Work:
    def run(d: Path):
        return sl.record(model, None, prompt_ids, out=d / "rec.npz", resume=True, progress=False, **RECORD)

    def check(d: Path, acked: int):
        _only(d, {"rec.npz"})
        f = d / "rec.npz"
        if not f.exists():
            if acked:
                raise AssertionError(f"{acked} sequences reported saved, no file")
            return 0, 0, 0
        t = sl.load_trace(f)  # every header field and array checked
        if not _same_trace(t, reference, len(t.sequences)):
            raise AssertionError(f"{f.name}: its {len(t.sequences)} sequences differ from the uninterrupted run's")
        return 1, len(t.sequences), 0

    def finish(d: Path):
        f = d / "rec.npz"
        before = len(sl.load_trace(f).sequences) if f.exists() else 0
        final = run(d)
        return before, (_same_trace(final, reference) and _same_trace(sl.load_trace(f), reference)
                        and _replays_equal(final, reference))

    return Work("record", "record(out=, resume=True)", "bundled model", run, check, finish)


TARGETS = {"bundled": ("bundled model's trace", dict(cost_shape="deepseek-v2-lite")),
           "deepseek": ("DeepSeek-V2-Lite-shaped trace", dict(cost_shape="deepseek-v2-lite@full",
                                                               draft=sl.QuantSpec(4, 64)))}


def compare_args(trace: sl.RoutingTrace, key: str) -> dict:
    return dict(trace=trace, strategies=STRATEGIES, expert_budget=BUDGETS, hardware=["rtx4090-pcie4"], k=2,
                executor=None, progress=False, **TARGETS[key][1])


def compare_work(trace: sl.RoutingTrace, key: str, reference: "pd.DataFrame | None" = None,
                 ref_cells: "dict | None" = None) -> Work:
    args = compare_args(trace, key)

    def run(d: Path):
        return sl.compare(None, None, results=d / "cells.jsonl", **args)

    def check(d: Path, acked: int):
        _only(d, {"cells.jsonl"})
        f = d / "cells.jsonl"
        if not f.exists():
            if acked:
                raise AssertionError(f"{acked} cells reported written, no file")
            return 0, 0, 0
        records, good = read_lines(f)  # every line's checksum; a torn last line left out
        if not records or records[0].get("specter_lab_results") != 1:
            raise AssertionError(f"{f.name}: no whole header")
        for rec in records[1:]:
            key = json.dumps(rec["cell"], sort_keys=True, separators=(",", ":"))
            if json.dumps(rec["result"]["metrics"], sort_keys=True) != ref_cells[key]:
                raise AssertionError(f"{f.name}: a cell differs from the uninterrupted run's")
        return 1, len(records) - 1, int(good < f.stat().st_size)

    def finish(d: Path):
        df = run(d)
        cols = [c for c in reference.columns if c != "wall_s"]
        try:
            pd.testing.assert_frame_equal(df[cols], reference[cols], check_exact=True)
            same = True
        except AssertionError:
            same = False
        return df.attrs["sweep"]["from_results_file"], same

    return Work(f"compare-{key}", "compare(results=)", TARGETS[key][0], run, check, finish)


def save_work(small: sl.RoutingTrace, big: sl.RoutingTrace, key: str) -> Work:
    """trace.save over an existing file, the two versions in turn: the file is always one of them, whole."""
    versions = {len(small.sequences): small, len(big.sequences): big}

    def run(d: Path, loops: int = 10**9):
        for i in range(loops):
            (small if i % 2 else big).save(d / "trace.npz")

    def check(d: Path, acked: int):
        _only(d, {"trace.npz"})
        t = sl.load_trace(d / "trace.npz")
        want = versions.get(len(t.sequences))
        if want is None or not _same_trace(t, want):
            raise AssertionError("trace.npz is neither version")
        return 1, 1, 0

    def finish(d: Path):
        before = sl.load_trace(d / "trace.npz")
        small.save(d / "trace.npz")  # one more save, to its end (it sweeps what a killed save left)
        after = sl.load_trace(d / "trace.npz")
        return 1, any(_same_trace(before, v) for v in versions.values()) and _same_trace(after, small)

    return Work(f"save-{key}", "trace.save over a file", TARGETS[key][0], run, check, finish, loops=True)


def _only(d: Path, names: set) -> None:
    """Nothing under a final name but the work's files (temporaries are hidden ``.<name>.<pid>.<hex>.tmp``)."""
    other = [p.name for p in d.iterdir() if p.name not in names and not p.name.endswith(".tmp")]
    if other:
        raise AssertionError(f"unexpected files {other}")


# ----------------------------------------------------------------------------------------------- a child
@dataclass
class Ended:
    how: str  # finished, SIGKILL, KeyboardInterrupt, MemoryError, RuntimeError: ..., signal 11, hung
    acks: list[int]


def _vm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1])
    return 0


_HOARD: list = []  # what the memory-eating thread holds on to
_STOP = threading.Event()


def _exhaust_memory() -> None:
    """Out of memory from here on: no more address space than the process has now (``RLIMIT_AS``), and every
    free byte of what it has taken (large blocks first, then smaller ones, down to 64 bytes): the work's next
    allocation that needs more than it frees itself fails, as on a machine whose memory ran out at this moment."""
    vm = _vm_kib() * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm, resource.RLIM_INFINITY))
    size = 1 << 26
    while size >= 64 and not _STOP.is_set():
        try:
            _HOARD.append(bytearray(size))
        except MemoryError:
            size //= 2


def _child_body(run: Callable, how: str, delay: float, w: int) -> None:
    """What a child runs, then exits (whatever happens): the work with every save or append acknowledged on
    ``w`` (the number of sequences of a saved trace; 1 a results line), ending in one line that says how it ended.
    ``how == "RLIMIT_AS"``: after ``delay`` seconds a thread takes every byte the process may still allocate."""
    code = 0
    try:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            real_save, real_append = trace_file.RoutingTrace.save, results_file.append_line

            def save(self, path):
                out = real_save(self, path)
                os.write(w, f"{len(self.sequences)}\n".encode())
                return out

            def append(path, line, encoding="utf-8"):
                real_append(path, line, encoding)
                os.write(w, b"1\n")

            trace_file.RoutingTrace.save, results_file.append_line = save, append
            if how == "RLIMIT_AS":
                timer = threading.Timer(delay, _exhaust_memory)
                timer.daemon = True
                timer.start()
            run()
            os.write(w, b"F\n")
        except KeyboardInterrupt:
            code = 130
            os.write(w, b"EKeyboardInterrupt\n")
        except MemoryError:
            code = 3
            os.write(w, b"EMemoryError\n")
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which judges it
            code = 4
            _STOP.set()
            _HOARD.clear()  # room to say what it was
            os.write(w, f"E{type(exc).__name__}: {' '.join(str(exc).split())[:60]}\n".encode())
    finally:
        os._exit(code)


def child(work: Work, d: Path, how: str = "", delay: float = 0.0, timeout: float = 120.0) -> Ended:
    """Run ``work`` in a child forked from here; ``SIGKILL``/``SIGINT`` it, or take its memory away, after
    ``delay`` seconds."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        # a save loop runs until killed; with its memory taken it may go on reusing what each save frees: 30 saves
        _child_body(lambda: work.run(d, 30) if work.loops and how == "RLIMIT_AS" else work.run(d), how, delay, w)
    os.close(w)
    return _watch(pid, r, how, delay, timeout)


def _watch(pid: int, r: int, how: str, delay: float, timeout: float) -> Ended:
    buf, t0, sent = b"", time.perf_counter(), False
    while True:
        ready, _, _ = select.select([r], [], [], 0.005)
        if ready:
            chunk = os.read(r, 65536)
            buf += chunk
            if not chunk:
                break
        now = time.perf_counter() - t0
        if how in ("SIGKILL", "SIGINT") and not sent and now >= delay:
            try:
                os.kill(pid, signal.SIGKILL if how == "SIGKILL" else signal.SIGINT)
            except ProcessLookupError:
                pass
            sent = True
        if now > timeout:
            os.kill(pid, signal.SIGKILL)
            buf += b"Ehung\n"
            break
    os.close(r)
    _, status = os.waitpid(pid, 0)
    lines = buf.decode(errors="replace").splitlines()
    acks = [int(x) for x in lines if x.isdigit()]
    tail = [x for x in lines if not x.isdigit()]
    if "F" in tail:
        ended = "finished"
    elif any(x.startswith("E") for x in tail):
        ended = next(x[1:] for x in tail if x.startswith("E"))
    elif os.WIFSIGNALED(status):
        ended = signal.Signals(os.WTERMSIG(status)).name
    else:
        ended = f"exit {os.WEXITSTATUS(status)}"
    return Ended(ended, acks)


# ----------------------------------------------------------------------------------------------- episodes
def _units(work: Work, acks: list[int]) -> int:
    """Units a child reported durable: a recording's last saved trace holds that many sequences; a sweep appends
    one cell a line."""
    if work.phase.startswith("record"):
        return max(acks, default=0)
    return len(acks) if work.phase.startswith("compare") else 0


def episode(work: Work, how: str, budget: int, row: Row, rng: random.Random, base: Path,
            setup: Callable[[Path], None] | None = None) -> int:
    """Interrupt ``work`` until ``budget`` interruptions landed or a run finished, checking the files after each;
    then resume it here to its end and compare with the uninterrupted run. Returns the interruptions used."""
    d = Path(tempfile.mkdtemp(prefix="ep-", dir=base))
    if setup is not None:
        setup(d)
    used, durable, tries, seen = 0, 0, 0, set()
    while used < budget and tries < 5 * budget:
        tries += 1
        ended = child(work, d, how, delay=rng.uniform(0.0, 0.9 * work.seconds))
        if ended.how == "finished":
            row.ended_first += 1
            if not work.loops:
                break
            continue  # a save loop that outlived its memory limit: another try
        used += 1
        row.interruptions += 1
        row.causes[_cause(ended.how)] += 1
        units = _units(work, ended.acks)
        durable = max(durable, units) if work.phase.startswith("record") else durable + units
        row.acked += durable
        seen |= set(_temps(d))
        try:
            files, on_disk, torn = work.check(d, durable)
        except Exception as exc:  # noqa: BLE001 - a failed check is the finding
            row.bad += 1
            row.problems.append(f"{how} #{row.interruptions}: {type(exc).__name__}: {exc}")
            continue
        row.files += files
        row.torn += torn
        if not work.loops and on_disk < durable:
            row.lost += durable - on_disk
            row.problems.append(f"{how} #{row.interruptions}: {durable} reported durable, {on_disk} on disk")
    recovered, same = work.finish(d)  # here, to the end: its first write sweeps what killed writers left
    row.temporaries += len(seen)
    row.swept += len(seen - set(_temps(d)))
    row.recovered += recovered
    row.episodes += 1
    row.equal += int(same)
    if not same:
        row.problems.append(f"{how}: the resumed run's output differs from the uninterrupted run's")
    shutil.rmtree(d, ignore_errors=True)
    return used


def _temps(d: Path) -> list[str]:
    return [p.name for n in ("rec.npz", "cells.jsonl", "trace.npz") for p in atomic.temp_files(d / n)]


def _cause(how: str) -> str:
    if any(w in how.lower() for w in ("memory", "alloc")) or how.startswith(("SIGSEGV", "SIGABRT", "SIGBUS")):
        return "memory (" + how.split(":")[0] + ")"
    return how.split(":")[0]


# ----------------------------------------------------------------------------------------------- a full disk
def disk_full(base: Path, model, prompt_ids: list, small: sl.RoutingTrace, big: sl.RoutingTrace) -> list[dict]:
    """A file-size limit in a child (and a small tmpfs here when root may mount one): every write that does not
    fit raises DiskFull naming the path and bytes, and leaves the old file as it was, byte for byte."""
    rows = []
    d = Path(tempfile.mkdtemp(prefix="full-", dir=base))
    f, csv, res, rec = d / "trace.npz", d / "trace.csv", d / "cells.jsonl", d / "rec.npz"
    small.save(f)
    small.export(csv, "llama_csv")
    log = open_results(res, "compare", {"source": "fault injection"})
    log.add({"cell": 0}, {"tpot_ms": 1.0})
    sl.record(model, None, prompt_ids[:1], out=rec, progress=False, **RECORD)  # a recording stopped after one
    before = {p: p.read_bytes() for p in (f, csv, res, rec)}
    # the limit: the one-sequence recording and 512 bytes (an existing file larger than it is only read)
    limit = rec.stat().st_size + 512
    line = {"metrics": [{"x": "y" * (limit - res.stat().st_size + 200)}]}  # fits the limit alone, not appended
    ops = [("trace.save over a trace (size known: refused before writing)", f, lambda: big.save(f)),
           ("trace.export CSV over a CSV (streamed: fails midway)", csv, lambda: big.export(csv, "llama_csv")),
           ("results append (the file ends past the limit midway)", res, lambda: log.add({"cell": 1}, line)),
           ("record(out=, resume=True): the second sequence's save", rec,
            lambda: sl.record(model, None, prompt_ids[:2], out=rec, resume=True, progress=False, **RECORD))]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = []
        try:
            os.close(r)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            for label, path, op in ops:
                try:
                    op()
                    out.append([label, "no error", "", 0, False])
                except DiskFull as e:
                    out.append([label, f"DiskFull ({errno.errorcode.get(e.errno, e.errno)})", str(e),
                                e.needed_bytes, e.needed_exact])
                except Exception as e:  # noqa: BLE001
                    out.append([label, type(e).__name__, str(e), 0, False])
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    got = b""
    while chunk := os.read(r, 65536):
        got += chunk
    os.close(r)
    os.waitpid(pid, 0)
    for (label, path, _), (_, err, msg, needed, exact) in zip(ops, json.loads(got)):
        rows.append(dict(how=f"RLIMIT_FSIZE {limit:,} B", op=label, error=err, names_path=str(path) in msg,
                         needed=needed, exact=exact, intact=path.read_bytes() == before[path],
                         temporaries=len(atomic.temp_files(path)), message=msg))
    shutil.rmtree(d, ignore_errors=True)
    rows += _tmpfs(base, small, big)
    return rows


def _tmpfs(base: Path, small: sl.RoutingTrace, big: sl.RoutingTrace) -> list[dict]:
    """The same on a real full disk: a tmpfs of a few hundred KiB, when this process may mount one."""
    mnt = Path(tempfile.mkdtemp(prefix="tmpfs-", dir=base))
    size = 256 * 1024
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        return [dict(how="tmpfs", op="not mountable here (needs root and mount rights)", error="", names_path=None,
                     needed=0, exact=None, intact=None, temporaries=0, message="")]
    rows = []
    try:
        f, csv = mnt / "trace.npz", mnt / "trace.csv"
        small.save(f)
        small.export(csv, "llama_csv")
        before = {p: p.read_bytes() for p in (f, csv)}
        free = shutil.disk_usage(mnt).free
        (mnt / "filler").write_bytes(b"\0" * max(0, free - 4096))  # one page left: less than either new file
        for label, path, op in (("trace.save over a trace (size known: refused before writing)", f,
                                 lambda: big.save(f)),
                                ("trace.export CSV over a CSV (streamed: fails midway)", csv,
                                 lambda: big.export(csv, "llama_csv"))):
            try:
                op()
                err, msg, needed, exact = "no error", "", 0, False
            except DiskFull as e:
                err, msg, needed, exact = f"DiskFull ({errno.errorcode.get(e.errno, e.errno)})", str(e), \
                    e.needed_bytes, e.needed_exact
            rows.append(dict(how=f"tmpfs {size // 1024} KiB, 4 KiB free", op=label, error=err,
                             names_path=str(path) in msg, needed=needed, exact=exact,
                             intact=path.read_bytes() == before[path], temporaries=len(atomic.temp_files(path)),
                             message=msg))
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    return rows


# ----------------------------------------------------------------------------------------------- the page
def deepseek_trace() -> "tuple[sl.RoutingTrace, sl.RoutingTrace]":
    """Two DeepSeek-V2-Lite-shaped traces (3 and 2 sequences) from synthetic routing: no model needed."""
    cfg = json.loads((CONFIG_DIR / "deepseek-v2-lite.json").read_text())
    g = geometry_from_config(cfg)
    seqs = [(12, 16), (8, 12), (8, 8)]
    rows = synthetic_routing(g.moe_layers, g.num_experts, g.top_k, sum(p + n for p, n in seqs),
                             locality_for("deepseek_v2"), seed=1)
    segs, start = [], 0
    for p, n in seqs:
        segs += [(start, p, "prefill"), (start + p, n, "decode")]
        start += p + n
    big = sl.import_routing(rows, cfg, segs, k_max=2, draft_bits=4)
    small = sl.RoutingTrace(**{**vars(big), "sequences": big.sequences[:2]})
    return big, small


def page(rows: list[Row], full: list[dict], args, seconds: float, setup: dict) -> str:
    out = ["# Fault injection: kills at random moments, nothing finished lost", "",
           f"`python scripts/fault_injection.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}` "
           f"(this page; {seconds / 60:.1f} min on {os.cpu_count()} cores, {platform.machine()}, torch "
           f"{torch.__version__}, {time.strftime('%Y-%m-%d')}). What it does: the script's docstring. Settings: "
           f"record {setup['record']}; compare {setup['compare']}; DeepSeek-V2-Lite-shaped trace "
           f"{setup['deepseek']}; seed {args.seed}.", "",
           "Each interruption lands in a child forked from the script at a moment drawn uniformly over an "
           "uninterrupted run's time: SIGKILL, SIGINT, or memory that runs out then (RLIMIT_AS set to the child's "
           "size and every free byte taken, so the work's next allocation fails). *Durable* is what the child "
           "had reported saved (a trace save or a results line that returned) before it was stopped; *on disk* "
           "is checked right after. Each episode ends with a resume run here to its end, compared with the "
           "uninterrupted run: the trace's tokens and routing arrays and two strategies' replayed metrics "
           "(record), the whole frame but `wall_s` (compare), one of the two versions whole (save).", "",
           "| work | target | interruption | interruptions (runs that ended first) | how they ended | files checked "
           "| corrupt or half-written under a final name | temporaries left by a kill (swept by the next write) "
           "| torn last lines dropped | sequences or cells durable at the interruptions (summed) → lost | "
           "recovered by the resumes | resumed "
           "runs equal to the uninterrupted run |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        causes = ", ".join(f"{k} {v}" for k, v in sorted(r.causes.items()))
        unit = "sequences" if r.phase.startswith("record") else "cells" if r.phase.startswith("compare") else "—"
        durable = f"{r.acked} {unit} → {r.lost}" if unit != "—" else "—"
        recovered = f"{r.recovered} {unit}" if unit != "—" else "—"
        out.append(f"| `{r.phase}` | {r.target} | {r.how} | {r.interruptions} ({r.ended_first}) | {causes or '—'} "
                   f"| {r.files} | {r.bad} | {r.temporaries} ({r.swept}) | {r.torn} | {durable} | {recovered} "
                   f"| {r.equal} of {r.episodes} |")
    tot = {k: sum(getattr(r, k) for r in rows) for k in ("interruptions", "files", "bad", "lost", "equal",
                                                          "episodes")}
    kills = sum(r.interruptions for r in rows if r.how == "SIGKILL")
    out += ["", f"**In all**: {tot['interruptions']} interruptions ({kills} SIGKILLs), {tot['files']} files "
                f"checked, {tot['bad']} corrupt or half-written under a final name, {tot['lost']} finished "
                f"sequences or cells lost, {tot['equal']} of {tot['episodes']} resumed runs equal to the "
                "uninterrupted run.", "",
            "## A disk that fills during a save", "",
            "| limit | write | error | names the path | bytes needed (exact / at least) | old file intact, byte "
            "for byte | temporaries left |", "|---|---|---|---|---|---|---|"]
    for f in full:
        need = "—" if not f["needed"] else f"{f['needed']:,} ({'exact' if f['exact'] else 'at least'})"
        yes = {True: "yes", False: "**no**", None: "—"}
        out.append(f"| {f['how']} | {f['op']} | {f['error'] or '—'} | {yes[f['names_path']]} | {need} | "
                   f"{yes[f['intact']]} | {f['temporaries']} |")
    example = next((f["message"] for f in full if f["message"]), "")
    if example:
        out += ["", f"One message as a user reads it: *{example}*"]
    problems = [p for r in rows for p in r.problems]
    out += ["", "## Problems", ""] + ([f"- {p}" for p in problems[:40]] or ["None."])
    notes = [f"`{r.phase}`, {r.target}: {n}" for r in rows for n in r.notes]
    if notes:
        out += ["", "Interruptions that did not all land (the work kept finishing first):", ""]
        out += [f"- {n}" for n in notes]
    out += ["", "Notes: a SIGKILL can land while a temporary file is being written: it stays under a hidden "
            "temporary name (`.<name>.<pid>.<random>.tmp`), never the final one, and the next successful write "
            "of the same file removes it once its process is gone (the *swept* count). A SIGINT or a memory "
            "failure raises in Python, and the writer removes its temporary itself. Sweeps here run serially in "
            "the child (`executor=None`); a pool's cells are written by the parent as they come back "
            "(`tests/test_resume.py` checks a pool's file against the serial run)."]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=100, help="SIGKILLs in all (default 100)")
    ap.add_argument("--others", type=int, default=4,
                    help="SIGINTs and out-of-memory failures per work and target (default 4 each)")
    ap.add_argument("--per-episode", type=int, default=5, help="interruptions before a resume runs to its end")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "measured" / "fault_injection.md")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(a.seed)
    t0 = time.perf_counter()
    model, tok = sl.load_model("tiny")
    prompt_ids = [tok(p, add_special_tokens=True)["input_ids"][:32] for p in sl.heldout_prompts(4)]
    reference = sl.record(model, None, prompt_ids, progress=False, **RECORD)  # also quantizes the shared draft
    ds_big, ds_small = deepseek_trace()
    small_bundled = sl.RoutingTrace(**{**vars(reference), "sequences": reference.sequences[:2]})
    base = Path(tempfile.mkdtemp(prefix="fault-injection-"))
    works = [record_work(model, prompt_ids, reference)]
    for trace, key in ((reference, "bundled"), (ds_big, "deepseek")):
        d = base / f"ref-{key}"
        d.mkdir()
        ref_df = sl.compare(None, None, results=d / "cells.jsonl", **compare_args(trace, key))
        cells = {json.dumps(rec["cell"], sort_keys=True, separators=(",", ":")):
                 json.dumps(rec["result"]["metrics"], sort_keys=True) for rec in read_lines(d / "cells.jsonl")[0][1:]}
        works.append(compare_work(trace, key, ref_df, cells))
    works += [save_work(small_bundled, reference, "bundled"), save_work(ds_small, ds_big, "deepseek")]
    existing = {id(w): (w.loops and (lambda d, w=w: w.run(d, 1))) for w in works}  # a save loop starts over a file
    # an uninterrupted run's time: the interruptions land within it
    for w in works:
        if w.loops:
            w.seconds = 0.5  # saves in a loop: half a second holds several
            continue
        d = Path(tempfile.mkdtemp(prefix="cal-", dir=base))
        t = time.perf_counter()
        child(w, d)
        w.seconds = time.perf_counter() - t
        shutil.rmtree(d)
        print(f"{w.key}: {w.seconds:.2f} s uninterrupted", flush=True)
    share = {"record": 0.4, "compare-bundled": 0.2, "compare-deepseek": 0.2, "save-bundled": 0.1,
             "save-deepseek": 0.1}
    rows = []
    for w in works:
        frac = share[w.key]
        for how, budget in (("SIGKILL", max(1, round(a.kills * frac))),
                            ("SIGINT", a.others), ("RLIMIT_AS", a.others)):
            row, empty = Row(w.phase, w.target, how), 0
            while row.interruptions < budget and empty < 5:  # five episodes in a row with none: give up, say so
                left = budget - row.interruptions
                before = row.interruptions
                episode(w, how, min(a.per_episode, left), row, rng, base, existing[id(w)] or None)
                empty = empty + 1 if row.interruptions == before else 0
            if row.interruptions < budget:
                row.notes.append(f"{row.interruptions} of {budget} {how} interruptions landed: the work finished "
                                 f"first {row.ended_first} times")
            rows.append(row)
            print(f"{w.phase:28} {w.target:30} {how:9} {row.interruptions:3} interruptions, {row.bad} bad, "
                  f"{row.lost} lost, {row.equal}/{row.episodes} equal", flush=True)
    full = disk_full(base, model, prompt_ids, small_bundled, reference)
    shutil.rmtree(base, ignore_errors=True)
    setup = {"record": f"4 held-out prompts (first 32 tokens) × {RECORD['max_new_tokens']} tokens, k_max "
                       f"{RECORD['k_max']}, uninterrupted {works[0].seconds:.1f} s",
             "compare": f"{len(STRATEGIES)} strategies × budgets {BUDGETS} on rtx4090-pcie4, K = 2 "
                        f"({works[1].seconds:.1f} s and {works[2].seconds:.1f} s uninterrupted)",
             "deepseek": f"{ds_big!r}"[:160] + "…"}
    text = page(rows, full, a, time.perf_counter() - t0, setup)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_atomic(a.out, text)
    print(text)
    failed = any(r.bad or r.lost or r.equal < r.episodes for r in rows) or any(
        not (f["intact"] in (True, None) and f["error"] != "no error" and f["names_path"] in (True, None))
        for f in full)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(2)
