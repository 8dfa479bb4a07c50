#!/usr/bin/env python
"""A real-size random checkpoint from a published config.json, then load → generate → record on it, with the time
and peak resident memory of every stage.

Writes random weights in the shapes ``--config`` describes (a bundled name such as ``olmoe-1b-7b`` or a path to
any config.json) as safetensors shards with an index, in bf16 by default, with the bundled tokenizer beside them,
**one shard at a time**: the whole model is never in RAM (peak ≈ one shard). Then, in this process:

1. ``plan``     : ``sl.plan_memory`` from the headers (what the run will hold, against the RAM available);
2. ``load``     : ``sl.load_model(folder)`` with its defaults (the checkpoint's dtype);
3. ``hf``       : HF ``model.generate`` greedy, the baseline;
4. ``lru``      : ``sl.Engine(..., "lru")``, output checked equal to the baseline token for token;
5. ``specter``  : ``sl.Engine(..., "specter")`` (its draft included), checked equal too;
6. ``record``   : ``sl.record`` (greedy decoding plus the draft chains).

Peak resident memory per stage is the kernel's VmHWM, reset before each stage (``/proc/self/clear_refs``; where
that is refused, the process's peak so far, and the table says so), with what stays resident after it split
into anonymous memory (copies: the per-expert layout's experts, the draft) and file pages (the mapped checkpoint:
dense weights, a fused layout's experts as far as they were read). The shards are fsynced as they are written and
the C heap is trimmed after writing, so the stages measure the run, not the writer. Times are wall clock on this
machine; per token = the stage's wall time / new tokens (prefill included). ``--layers`` and ``--scale`` shrink
the model (fewer decoder layers; expert and dense MLP widths scaled) for a machine or a test that cannot hold the
real size.

Examples::

    python scripts/real_checkpoint.py --config olmoe-1b-7b --layers 2 --scale 0.25     # ~0.9 GB, a few minutes
    python scripts/real_checkpoint.py --config olmoe-1b-7b --out /data/olmoe-rand       # 13.8 GB: needs the disk
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import specter_lab as sl  # noqa: E402
from specter_lab.atomic import atomic_open, write_atomic  # noqa: E402
from specter_lab.model import BUNDLED  # noqa: E402
from specter_lab.model.geometry import CONFIG_DIR  # noqa: E402
from specter_lab.model.pages import trim_heap  # noqa: E402
from specter_lab.units import format_bytes  # noqa: E402

TOKENIZER_FROM = BUNDLED["tiny"]
_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


# ----------------------------------------------------------------------------------------------- memory
class PeakRSS:
    """Peak resident memory of one stage: VmHWM after resetting it (Linux ≥ 4.0), else the process peak so far."""

    def __init__(self) -> None:
        self.resettable = True

    def reset(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.resettable = False

    @staticmethod
    def _status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def peak(self) -> int:
        return self._status("VmHWM")

    def now(self) -> int:
        return self._status("VmRSS")

    def split(self) -> tuple[int, int]:
        """(anonymous, file-backed) resident bytes now: copies in RAM vs pages of the mapped checkpoint."""
        return self._status("RssAnon"), self._status("RssFile")


# ----------------------------------------------------------------------------------------------- config
def load_config(name: str, layers: int | None, scale: float) -> dict:
    path = Path(name)
    if not path.is_file():
        path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        sys.exit(f"--config {name!r}: no such file and not one of {sorted(p.stem for p in CONFIG_DIR.glob('*.json'))}")
    cfg = json.loads(path.read_text())
    if layers is not None:
        cfg["num_hidden_layers"] = layers
        if isinstance(cfg.get("layer_types"), list):
            cfg["layer_types"] = cfg["layer_types"][:layers]
        if isinstance(cfg.get("mlp_only_layers"), list):
            cfg["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < layers]
    if scale != 1.0:
        for key in _WIDTHS:
            if isinstance(cfg.get(key), int):
                cfg[key] = max(16, int(cfg[key] * scale) // 16 * 16)
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    cfg.pop("quantization_config", None)  # random weights are written unquantized
    return cfg


def tensor_plan(cfg: dict, layout: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor the checkpoint holds, in the model's order: the model built on the meta device names them;
    routed experts are written per expert (``experts.{j}.gate_proj.weight``, the published layout) or fused."""
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf)
    info = sl.inspect_model(model)
    fused = {f"{l.name}.{n}": l for l in info.layers for n in l.param_names}
    out = []
    for name, p in model.named_parameters():  # tied weights appear once
        layer = fused.get(name)
        if layer is None or layout == "fused":
            out.append((name, tuple(p.shape)))
            continue
        if layer.experts.is_transposed or name.endswith("_bias"):
            raise SystemExit(f"{cfg['model_type']}: its experts have no per-expert layout here; use --layout fused")
        e, rows, cols = p.shape
        parts = ["gate_proj", "up_proj"] if name.endswith("gate_up_proj") else [name.rsplit(".", 1)[1]]
        for j in range(e):
            for part in parts:
                out.append((f"{layer.name}.{j}.{part}.weight", (rows // len(parts), cols)))
    return out


def _write_sparse(path: Path, group: list[tuple[str, tuple[int, ...]]]) -> int:
    """A safetensors file whose header is real and whose data is a hole (no disk blocks): what the header-only
    checks and the memory plan read, at full size, for free. Returns its tensor bytes."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in group:
        n = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    with atomic_open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.truncate(8 + len(raw) + off)
    return off


def _written_back(path: Path) -> None:
    """fsync a shard: its page cache is then clean, as a checkpoint's is when it was not written moments ago (dirty
    pages cannot be handed back to the OS, so the later stages would measure the writing, not the run)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(cfg: dict, out: Path, layout: str, shard_bytes: int, seed: int, sparse: bool = False) -> int:
    """Random bf16 weights (norms at 1), written shard by shard; returns the bytes written. ``sparse``: headers
    only, the data left as holes (for ``--plan-only``: nothing can load it, but its sizes are the real ones)."""
    from safetensors.torch import save_file

    plan = tensor_plan(cfg, layout)
    out.mkdir(parents=True, exist_ok=True)
    groups, cur, size = [], [], 0
    for name, shape in plan:
        nbytes = math.prod(shape) * 2
        if cur and size + nbytes > shard_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += nbytes
    groups.append(cur)
    weight_map, total = {}, 0
    g = torch.Generator().manual_seed(seed)
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        if sparse:
            total += _write_sparse(out / fname, group)
            weight_map.update({name: fname for name, _ in group})
            continue
        tensors = {}
        for name, shape in group:
            if "norm" in name and len(shape) == 1:
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = torch.randn(shape, generator=g, dtype=torch.bfloat16).mul_(0.02)
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        _written_back(out / fname)
        total += sum(t.nbytes for t in tensors.values())
        weight_map.update({name: fname for name, _ in group})
        del tensors  # only one shard is ever held
        print(f"  wrote {fname} ({format_bytes((out / fname).stat().st_size)})", flush=True)
    write_atomic(out / "model.safetensors.index.json", json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": weight_map}, indent=1))
    write_atomic(out / "config.json", json.dumps(cfg, indent=2))
    for f in TOKENIZER_FROM.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    return total


# ----------------------------------------------------------------------------------------------- stages
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="olmoe-1b-7b", help="a bundled config name or a path to a config.json")
    ap.add_argument("--layers", type=int, default=None, help="keep only this many decoder layers")
    ap.add_argument("--scale", type=float, default=1.0, help="scale the MLP/expert widths (e.g. 0.25)")
    ap.add_argument("--layout", choices=("per-expert", "fused"), default="per-expert",
                    help="per-expert: as published (fused into a copy at load); fused: mapped from the files")
    ap.add_argument("--out", default="/tmp/specter_real_checkpoint")
    ap.add_argument("--shard-mb", type=int, default=1000, help="shard size (writing peaks near twice one shard)")
    ap.add_argument("--tokens", type=int, default=8, help="new tokens per generate")
    ap.add_argument("--budget", default="0.5", help="expert budget for lru/specter")
    ap.add_argument("--strategies", default="lru,specter", help="the strategies generated and checked against HF")
    ap.add_argument("--no-record", action="store_true", help="leave out the sl.record stage")
    ap.add_argument("--k-max", type=int, default=4, help="sl.record's draft chain length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint (default: delete it at the end)")
    ap.add_argument("--report", default=None, help="also write the table as markdown to this file")
    ap.add_argument("--exact", action="store_true",
                    help="also run specter with verify='exact' (one-token verification: issue 38's exact mode) and "
                         "compare its time with the default batched verification")
    ap.add_argument("--plan-only", action="store_true",
                    help="write headers only (sparse files, no disk blocks), print the checks and the memory plan at "
                         "full size, delete, stop: what the real run would hold, known before writing it")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    out = Path(a.out)
    if out.exists():
        sys.exit(f"{out} exists: pass another --out or delete it (this script writes a fresh checkpoint).")
    budget = float(a.budget) if a.budget.replace(".", "", 1).isdigit() else a.budget
    cfg = load_config(a.config, a.layers, a.scale)
    rss, rows = PeakRSS(), []

    def stage(name: str, fn, tokens: int = 0, first=None):
        """Run ``fn`` with its peak RSS; ``first`` (the same generation cut to one token) gives the decode time
        per token, (t(N) − t(1)) / (N − 1): prefill and start-up left out, as the issue's goal reads it."""
        rss.reset()
        t = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t
        peak, split = rss.peak(), rss.split()
        decode = None
        if first is not None and tokens > 1:
            t1 = time.perf_counter()
            first()
            decode = (dt - (time.perf_counter() - t1)) / (tokens - 1)
        rows.append((name, dt, dt / tokens if tokens else None, decode, peak, split))
        print(f"[{name}] {dt:.1f} s" + (f", {dt / tokens * 1e3:.0f} ms/token" if tokens else "")
              + (f", decode {decode * 1e3:.0f} ms/token" if decode is not None else "")
              + f", peak RSS {format_bytes(peak)}", flush=True)
        return result

    rows.append(("start (imports)", 0.0, None, None, rss.peak(), rss.split()))
    if a.plan_only:
        try:
            write_checkpoint(cfg, out, a.layout, a.shard_mb * 2**20, seed=0, sparse=True)
            for draft in (None, sl.QuantSpec()):
                print(sl.plan_memory(out, draft=draft, context=64 + a.tokens, expert_budget=budget), "\n")
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return 0
    try:
        written = stage("write", lambda: write_checkpoint(cfg, out, a.layout, a.shard_mb * 2**20, seed=0))
        trim_heap()  # the writer's freed shards are not the run's: a user's process has not written the checkpoint
        disk = sum(p.stat().st_size for p in out.glob("*.safetensors"))
        plan = stage("plan", lambda: sl.plan_memory(out, draft=sl.QuantSpec(), context=64 + a.tokens,
                                                    expert_budget=budget))
        print(plan, flush=True)
        model, tok = stage("load", lambda: sl.load_model(out))
        ids = tok("def fibonacci(n):\n    if n < 2:", return_tensors=None)["input_ids"]
        def hf(n):
            return model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                  min_new_tokens=n)[0, len(ids):].tolist()

        ref = stage("hf", lambda: hf(a.tokens), a.tokens, first=lambda: hf(1))
        equal = {}
        runs = [(s, s, {}) for s in a.strategies.split(",")]
        if a.exact:  # both with the draft the run above built (shared): the verification's cost, not quantizing's
            runs += [("specter, draft ready", "specter", {}), ("specter verify=exact", "specter", {"verify": "exact"})]
        for name, strategy, opts in runs:
            # the engine is built in its own stage (the op count, the exactness probe, the draft), so that a
            # stage's time per token is generation's
            eng = stage(f"{name}: build", lambda s=strategy, o=opts: sl.Engine(model, tok, s, expert_budget=budget,
                                                                              **o))
            got = stage(name, lambda e=eng: e.generate(ids, max_new_tokens=a.tokens).token_ids, a.tokens,
                        first=lambda e=eng: e.generate(ids, max_new_tokens=1))
            del eng
            equal[name] = got == ref
            print(f"  {name} equals HF generate: {equal[name]} ({got} vs {ref})", flush=True)
        if not a.no_record:
            stage("record", lambda: sl.record(model, tok, [ids], max_new_tokens=a.tokens, k_max=a.k_max,
                                              progress=False), a.tokens)
    finally:
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
    table = _table(a, cfg, rows, disk, written, plan, rss.resettable, equal)
    print(table)
    if a.report:
        write_atomic(a.report, table + "\n")
    return 0 if all(equal.values()) else 1


def _table(a, cfg, rows, disk, written, plan, resettable, equal) -> str:
    head = (f"{a.config} (layers {cfg['num_hidden_layers']}, experts {cfg.get('num_experts')}, scale {a.scale}), "
            f"{a.layout} layout, bf16: {format_bytes(disk)} on disk ({written:,} tensor bytes); {a.tokens} new "
            f"tokens, budget {a.budget}, record k_max {a.k_max}, {a.threads} threads. Command: python "
            f"scripts/real_checkpoint.py " + " ".join(sys.argv[1:]))
    lines = [head, "", "| stage | wall s | ms/token | decode ms/token | peak RSS | peak RSS / checkpoint | "
             "after: anon + file pages |", "|---|---|---|---|---|---|---|"]
    for name, dt, per, decode, peak, (anon, file) in rows:
        lines.append(f"| {name} | {dt:.1f} | {'' if per is None else f'{per * 1e3:.0f}'} | "
                     f"{'' if decode is None else f'{decode * 1e3:.0f}'} | {format_bytes(peak)} | "
                     f"{peak / disk:.2f}× | {format_bytes(anon)} + {format_bytes(file)} |")
    same = ", ".join(f"{k} {'==' if v else '!='} HF generate" for k, v in equal.items())
    lines += ["", f"Planned: {format_bytes(plan.required)} resident + {format_bytes(plan.mapped)} mapped "
              f"(allowance {format_bytes(plan.allowance)}). Lossless: {same}"]
    if not resettable:
        lines.append("Peak RSS could not be reset per stage here: each row is the process peak so far.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
