"""Fuzz the readers: corrupted trace files into ``sl.load_trace`` (then ``lru`` replayed if accepted), corrupted
configs into ``sl.estimate``, corrupted engine routing files into ``sl.import_routing`` (then replayed). Prints,
per reader, the counts in issue 35's form: refused at load / accepted / refused late / crashed / hung, the slowest
refusal and the largest allocation a refusal made (tracemalloc peak during the refused load).

    nice python scripts/fuzz_readers.py --traces 1000 --configs 300 --imports 300 --out docs/measured/fuzz_readers.md

Each case runs in a worker process with a time limit (a worker past it is killed: "hung") and an address-space
limit (a huge allocation fails there instead of swapping the machine: "crashed"). "Refused at load" means a
project error (``TraceError`` / ``ConfigError``, both ``ValueError``) raised by the reader; "refused late" a
project error raised by the replay or the estimate after the reader accepted; "crashed" any other exception.
Every refused load is also checked to leave no file descriptor open.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import tracemalloc
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import specter_lab as sl  # noqa: E402
from specter_lab.atomic import write_atomic  # noqa: E402
from specter_lab.errors import ConfigError, TraceError  # noqa: E402
from specter_lab.model.geometry import BUNDLED_CONFIGS, CONFIG_DIR  # noqa: E402
from specter_lab.traces.formats import FORMATS, SUFFIX  # noqa: E402

PROJECT = (TraceError, ConfigError)
HANG_S = 20.0  # wall seconds of one case (the bound); the worker runs one torch thread
VALUES = [None, -1, 0, 1, 2, 10**12, -(10**12), "x", "bfloat16", [1, 2], [], {}, {"a": 1}, 1.5, -0.5, True,
          float("nan"), 2**31, 2**15]


# ------------------------------------------------------------------------------------------------ cases

def recorded_trace(tmp: Path) -> Path:
    """A recorded trace of the bundled model (2 prompts x 12 tokens, chains of 4): the fuzz's seed file."""
    model, tok = sl.load_model("tiny")
    trace = sl.record(model, tok, ["def fib(n):", "The capital of France"], max_new_tokens=12, k_max=4,
                      progress=False)
    return trace.save(tmp / "seed.npz")


def _arrays(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {n: z[n] for n in z.files}


def _header(arrays: dict) -> dict:
    return json.loads(arrays["header"].tobytes().decode())


def _set_header(arrays: dict, h: dict) -> None:
    arrays["header"] = np.frombuffer(json.dumps(h).encode(), dtype=np.uint8)


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def trace_case(seed_bytes: bytes, seed_arrays: dict, rng: np.random.Generator) -> tuple[str, bytes]:
    """(what was done, the corrupted file's bytes)."""
    kind = rng.choice(["truncate", "flip", "header", "config", "drop", "retype", "reshape", "ids", "tokens",
                       "junk_header"], p=[.08, .12, .16, .16, .08, .1, .1, .1, .06, .04])
    if kind == "truncate":
        n = int(rng.integers(0, len(seed_bytes)))
        return f"truncate at {n}", seed_bytes[:n]
    if kind == "flip":
        b = bytearray(seed_bytes)
        for _ in range(int(rng.integers(1, 9))):
            i = int(rng.integers(0, len(b)))
            b[i] ^= int(rng.integers(1, 256))
        return "flip bytes", bytes(b)
    arrays = {k: v.copy() for k, v in seed_arrays.items()}
    h = _header(arrays)
    names = [n for n in arrays if n != "header"]
    if kind == "header":
        field = str(rng.choice(["version", "config", "k_max", "draft", "source", "meta", "sequences", "extra"]))
        value = VALUES[int(rng.integers(len(VALUES)))]
        h[field] = value
        _set_header(arrays, h)
        return f"header.{field} = {value!r}", _npz_bytes(arrays)
    if kind == "config":
        cfg = h["config"]
        for _ in range(int(rng.integers(1, 4))):
            field = str(rng.choice(sorted(cfg) + ["num_experts", "num_experts_per_tok", "vocab_size", "torch_dtype"]))
            cfg[field] = _replacement(cfg.get(field), rng)
        _set_header(arrays, h)
        return "config fields changed", _npz_bytes(arrays)
    if kind == "junk_header":
        junk = [b"\xff\xfe\x00", b"[" * 100000 + b"]" * 100000, b"[1, 2]", b"{\"version\": 1}", b"null"]
        arrays["header"] = np.frombuffer(junk[int(rng.integers(len(junk)))], dtype=np.uint8)
        return "junk header", _npz_bytes(arrays)
    name = str(rng.choice(names))
    a = arrays[name]
    if kind == "drop":
        del arrays[name]
        return f"drop {name}", _npz_bytes(arrays)
    if kind == "retype":
        dt = rng.choice(["float32", "int8", "uint64", "bool", "U3", "complex64", "int64"])
        arrays[name] = a.astype(dt)
        return f"retype {name} {dt}", _npz_bytes(arrays)
    if kind == "reshape":
        how = int(rng.integers(4))
        if how == 0 and a.ndim >= 2:
            arrays[name] = a.reshape(a.shape[0] * a.shape[1], *a.shape[2:]) if a.ndim > 2 else a.reshape(-1)
        elif how == 1:
            arrays[name] = a[None]
        elif how == 2 and a.ndim >= 2:
            arrays[name] = np.swapaxes(a, 0, -1).copy()
        else:
            arrays[name] = a[: max(0, len(a) - 1)] if a.ndim else a
        return f"reshape {name} ({how})", _npz_bytes(arrays)
    if kind == "ids" and a.size:
        bad = [32, 33, 1000, -2, 2**15 - 1, -1] + list(range(8))  # out of range, or in range (routing changed)
        flat = a.reshape(-1).copy()
        flat[int(rng.integers(flat.size))] = bad[int(rng.integers(len(bad)))] if a.dtype.itemsize > 1 else 127
        arrays[name] = flat.reshape(a.shape)
        return f"ids in {name}", _npz_bytes(arrays)
    tok = str(rng.choice([n for n in names if n.endswith(("prompt", "tokens"))]))
    t = arrays[tok].copy()
    t.reshape(-1)[int(rng.integers(t.size))] = [4096, 10**9, -1, 0][int(rng.integers(4))]
    arrays[tok] = t
    return f"token id in {tok}", _npz_bytes(arrays)


def _replacement(old, rng: np.random.Generator):
    """A value for a config field: one of VALUES, or the old value scaled / retyped."""
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.5:  # near the old value
        choices = [old * 2, old // 2, old + 1, max(old - 1, 0), -old, float(old), str(old), old * 1000]
    elif isinstance(old, float) and np.isfinite(old) and rng.random() < 0.5:
        choices = [old * 2, old / 2, -old, 0.0, str(old), int(old)]
    else:
        choices = list(VALUES)
    return choices[int(rng.integers(len(choices)))]


def config_case(configs: dict, rng: np.random.Generator) -> tuple[str, dict]:
    name = str(rng.choice(sorted(configs)))
    cfg = copy.deepcopy(configs[name])
    changed = []
    for _ in range(int(rng.integers(1, 4))):
        field = str(rng.choice(sorted(cfg) + ["torch_dtype", "rope_theta", "num_experts", "head_dim"]))
        cfg[field] = _replacement(cfg.get(field), rng)
        changed.append(f"{field}={cfg[field]!r:.30}")
    return f"{name}: {', '.join(changed)}", cfg


def import_case(seed_trace, tmp: Path, rng: np.random.Generator) -> tuple[str, Path]:
    """A corrupted engine routing file (vLLM npz, llama.cpp CSV, JSONL, SGLang JSON) written from the seed trace."""
    fmt = str(rng.choice(FORMATS))
    suffix = SUFFIX[fmt]
    path = seed_trace.export(tmp / f"imp{suffix}")
    raw = path.read_bytes()
    how = int(rng.integers(5))
    if how == 0:
        raw = raw[: int(rng.integers(0, len(raw)))]
    elif how == 1:
        b = bytearray(raw)
        for _ in range(int(rng.integers(1, 6))):
            i = int(rng.integers(0, len(b)))
            b[i] = int(rng.choice(list(b"0123456789-,{}[]\"\n x\xff")))
        raw = bytes(b)
    elif how == 2 and fmt not in ("vllm", "sglang"):  # a JSON response is one line
        lines = raw.split(b"\n")
        i = int(rng.integers(1, max(2, len(lines))))
        lines.insert(i, lines[min(i, len(lines) - 1)])  # a duplicated row
        raw = b"\n".join(lines)
    elif how == 3 and fmt not in ("vllm", "sglang"):
        lines = raw.split(b"\n")
        del lines[int(rng.integers(1, max(2, len(lines))))]
        raw = b"\n".join(lines)
    else:
        if fmt == "vllm":
            arrays = _arrays(path)
            k = str(rng.choice(sorted(arrays)))
            arrays[k] = arrays[k].astype(np.int64) + int(rng.choice([32, 10**6, -3]))
            raw = _npz_bytes(arrays)
        elif fmt == "sglang":
            body = json.loads(raw)
            meta = (body[int(rng.integers(len(body)))] if isinstance(body, list) else body)["meta_info"]
            field = str(rng.choice(sorted(meta)))
            meta[field] = _replacement(meta[field], rng)
            raw = json.dumps(body).encode()
        else:
            raw = raw.replace(b"decode", b"decodx", 1) if rng.random() < 0.5 else raw.replace(b",3,", b",999,", 1)
    out = tmp / f"case{suffix}"
    out.write_bytes(raw)
    return f"{fmt} corruption {how}", out


# ------------------------------------------------------------------------------------------------ worker

def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _worker(conn, mem_limit: int, warm: dict) -> None:
    import torch

    torch.set_num_threads(1)
    _run(warm)  # imports and builds what every case needs, before the clock of any case starts
    soft = resource.getrlimit(resource.RLIMIT_AS)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, soft[1]))
    except (ValueError, OSError):
        pass
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(_run(job))


def _run(job: dict) -> dict:
    kind = job["kind"]
    out = {"phase": "load"}
    fds = _fds()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        if kind == "trace":
            obj = sl.load_trace(job["path"])
        elif kind == "import":
            obj = sl.import_routing(job["path"], job["config"], k_max=0)
        else:
            from specter_lab.model.geometry import geometry_from_config

            obj = geometry_from_config(job["config"])
        out["load_s"] = time.perf_counter() - t0
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out["phase"] = "use"
        if kind in ("trace", "import"):
            sl.replay(obj, "lru", expert_budget=0.5, trace_level="steps")
        else:
            sl.estimate(job["config"])
        out["outcome"] = "accepted"
    except BaseException as exc:  # noqa: BLE001 - every outcome is counted
        if tracemalloc.is_tracing():
            out["load_s"] = time.perf_counter() - t0
            out["peak"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        # late: a ValueError (the project's refusals are ValueErrors) or an error class of the project's own
        project = isinstance(exc, ValueError) or type(exc).__module__.startswith("specter_lab")
        if out["phase"] == "load":
            out["outcome"] = "refused at load" if isinstance(exc, PROJECT) else "crashed"
            out["leaked_fds"] = _fds() - fds
        else:
            out["outcome"] = "refused late" if project else "crashed"
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        cause = exc.__cause__ if isinstance(exc, TraceError) and isinstance(exc.__cause__, ConfigError) else exc
        out["field"] = getattr(cause, "field", None)  # a ConfigError's field ("" where none was named)
        if out["outcome"] == "crashed":
            out["trace"] = traceback.format_exc(limit=6)[-1500:]
    return out


class Pool:
    """One worker process; a job past ``HANG_S`` kills it (counted hung) and starts another."""

    def __init__(self, mem_limit: int, warm: dict) -> None:
        self.mem_limit, self.warm = mem_limit, warm
        self.ctx = mp.get_context("spawn")  # a fork of a process that ran torch can deadlock in its thread pools
        self._start()

    def _start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.mem_limit, self.warm), daemon=True)
        self.proc.start()
        if self.conn.recv() != "ready":  # the worker's imports are not timed as a case
            raise RuntimeError("fuzz worker did not start")

    def run(self, job: dict) -> dict:
        t0 = time.perf_counter()
        self.conn.send(job)
        if self.conn.poll(HANG_S):
            try:
                res = self.conn.recv()
            except EOFError:
                res = {"outcome": "crashed", "error": "worker died (killed for memory?)"}
                self._restart()
        else:
            res = {"outcome": "hung", "error": f"over {HANG_S:.0f} s"}
            self._restart()
        if not self.proc.is_alive():
            self._restart()
        res["wall_s"] = time.perf_counter() - t0
        return res

    def _restart(self) -> None:
        self.proc.kill()
        self.proc.join()
        self._start()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(5)


# ------------------------------------------------------------------------------------------------ main

ORDER = ("refused at load", "accepted", "refused late", "crashed", "hung")


def summarize(name: str, results: list[tuple[str, dict]]) -> list[str]:
    counts = Counter(r["outcome"] for _, r in results)
    refused = [(what, r) for what, r in results if r["outcome"] == "refused at load"]
    lines = [f"### {name}: {len(results)} cases", "",
             "| " + " | ".join(ORDER) + " |", "|" + "---|" * len(ORDER),
             "| " + " | ".join(str(counts.get(o, 0)) for o in ORDER) + " |", ""]
    if refused:
        slow = max(refused, key=lambda x: x[1].get("load_s", 0))
        big = max(refused, key=lambda x: x[1].get("peak", 0))
        lines += [f"- slowest refusal: {slow[1]['load_s'] * 1e3:.0f} ms ({slow[0]}: {slow[1]['error'][:160]})",
                  f"- largest allocation a refusal made: {big[1]['peak'] / 2**20:.2f} MiB peak traced "
                  f"({big[0]}: {big[1]['error'][:160]})"]
        leaks = sum(1 for _, r in refused if r.get("leaked_fds", 0) > 0)
        lines.append(f"- refused loads that left a file descriptor open: {leaks}")
        unnamed = [(w, r) for w, r in refused if r.get("field") == ""]
        configs = [(w, r) for w, r in refused if r.get("field") is not None]
        if configs:
            lines.append(f"- config refusals naming no field: {len(unnamed)} of {len(configs)}"
                         + (f" (e.g. {unnamed[0][0]}: {unnamed[0][1]['error'][:160]})" if unnamed else ""))
    for outcome in ("refused late", "crashed", "hung"):
        for what, r in [x for x in results if x[1]["outcome"] == outcome][:5]:
            lines.append(f"- {outcome}: {what}: {r.get('error', '')[:200]}")
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=1000)
    ap.add_argument("--configs", type=int, default=300)
    ap.add_argument("--imports", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mem-gib", type=float, default=8.0, help="address-space limit of the worker")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    t_start = time.time()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        seed_path = recorded_trace(tmp)
        seed_trace = sl.load_trace(seed_path)
        seed_bytes, seed_arrays = seed_path.read_bytes(), _arrays(seed_path)
        configs = {n: json.loads((CONFIG_DIR / f"{n}.json").read_text()) for n in BUNDLED_CONFIGS}
        pool = Pool(int(a.mem_gib * 2**30), {"kind": "trace", "path": str(seed_path)})
        sections = []
        try:
            results = []
            for i in range(a.traces):
                what, raw = trace_case(seed_bytes, seed_arrays, rng)
                path = tmp / "case.npz"
                path.write_bytes(raw)
                results.append((what, pool.run({"kind": "trace", "path": str(path)})))
                _progress("traces", i, a.traces, results)
            sections.append(summarize("sl.load_trace, then sl.replay(trace, 'lru')", results))
            results = []
            for i in range(a.imports):
                what, path = import_case(seed_trace, tmp, rng)
                results.append((what, pool.run({"kind": "import", "path": str(path),
                                                "config": seed_trace.config})))
                _progress("imports", i, a.imports, results)
            if a.imports:
                sections.append(summarize("sl.import_routing (vLLM / llama.cpp CSV / JSONL / SGLang JSON), then 'lru' "
                                          "replayed", results))
            results = []
            for i in range(a.configs):
                what, cfg = config_case(configs, rng)
                results.append((what, pool.run({"kind": "config", "config": cfg})))
                _progress("configs", i, a.configs, results)
            sections.append(summarize("config.json (bundled configs, 1-3 fields replaced) into sl.estimate", results))
        finally:
            pool.close()
    cmd = "nice python scripts/fuzz_readers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = ["# Readers under fuzz (issue 35)", "",
              f"Measured with `{cmd}` on this 2-core CPU, {time.time() - t_start:.0f} s in all, seed {a.seed}. "
              f"Hung = over {HANG_S:.0f} s; the worker's address space is limited to {a.mem_gib:g} GiB. Allocation: "
              "tracemalloc's peak during the refused load (numpy and Python objects; torch's meta tensors "
              "allocate nothing).", ""] + [line for s in sections for line in s]
    text = "\n".join(report)
    print(text)
    if a.out:
        write_atomic(a.out, text + "\n")
    return 0


def _progress(name: str, i: int, n: int, results) -> None:
    if (i + 1) % 50 == 0 or i + 1 == n:
        c = Counter(r["outcome"] for _, r in results)
        print(f"{name} {i + 1}/{n}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())), file=sys.stderr,
              flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
