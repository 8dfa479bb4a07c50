#!/usr/bin/env python
"""Long generation: does a 2,000-token run stay lossless, and does its memory stay flat?

Generates ``--tokens`` tokens (default 2,000) with one strategy (default ``specter``) on the bundled model
(``sl.load_model("tiny")``; falls back to ``sl.tiny_random_model("qwen2_moe")`` when the bundled weights are not
there, and says so), with EOS disabled on both sides so the run really is that long. It prints:

* peak RSS (VmHWM) and current RSS (VmRSS) when 200 and when all tokens are committed (sampled from the step
  callback, i.e. inside ``generate``), and again after ``generate`` returned (metrics and frames built);
* how many records the trace holds at those points (the only thing that grows with the run besides the KV cache);
* whether the tokens equal ``model.generate(do_sample=False)`` for the same length (HF runs *after* the engine,
  so its memory does not count in the engine's numbers).

Example::

    python scripts/long_run.py                      # 2,000 tokens, specter, bundled model
    python scripts/long_run.py --tokens 300 --no-record-routing
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _status_mb(field: str) -> float:
    """A VmHWM / VmRSS line of /proc/self/status in MiB (Linux); ru_maxrss as the fallback for the peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    if field == "VmHWM":
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / 1024 if sys.platform != "darwin" else kb / 2**20
    return float("nan")


def trace_records(trace) -> dict[str, int]:
    return {name: len(getattr(trace, name)) for name in
            ("steps", "tokens", "routing_raw", "forecast", "cache_events", "transfers", "compute")}


def trace_mb(trace) -> float:
    """Rough deep size of the trace's records (the record objects, their float times and routing lists; shared
    ints and strings not counted) in MiB: what the trace itself holds in memory."""
    total = 0
    for name in ("steps", "tokens", "routing_raw", "forecast", "cache_events", "transfers", "compute"):
        rows = getattr(trace, name)
        total += sys.getsizeof(rows)
        for row in rows:
            total += sys.getsizeof(row)
            for f in row.__slots__:
                x = getattr(row, f)
                if isinstance(x, float):
                    total += sys.getsizeof(x)
                elif isinstance(x, list):  # routing ids: a list of per-token lists
                    total += sys.getsizeof(x) + sum(sys.getsizeof(t) for t in x)
    return total / 2**20


def disable_eos(model) -> None:
    """HF generate stops at generation_config.eos_token_id; the Engine reads generation_config, then config."""
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--checkpoint", type=int, default=200, help="also report memory when this many are committed")
    p.add_argument("--strategy", default="specter")
    p.add_argument("--model", default="tiny", help="'tiny' (bundled), a local folder, or 'random'")
    p.add_argument("--prompt", default="def heappush(heap, item):\n")
    p.add_argument("--expert-budget", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-record-routing", action="store_true", help="Engine(record_routing=False)")
    p.add_argument("--skip-hf", action="store_true", help="do not compare with HF generate")
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    import specter_lab as sl

    source = a.model
    tok = None
    if a.model != "random":
        try:
            model, tok = sl.load_model(a.model)
        except (FileNotFoundError, ValueError) as e:
            if a.model != "tiny":
                raise
            print(f"bundled model unavailable ({e}); using sl.tiny_random_model('qwen2_moe') instead")
            source = "random"
    if source == "random":
        need = a.tokens + 64
        model = sl.tiny_random_model("qwen2_moe", seed=0, max_position_embeddings=max(512, need))
    info = sl.inspect_model(model)
    max_pos = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    disable_eos(model)

    if tok is not None:
        ids = tok(a.prompt)["input_ids"]
    else:
        ids = [5, 17, 99, 42, 7, 200, 11, 3][: max(1, min(8, info.vocab - 1))]
    if max_pos is not None and len(ids) + a.tokens > max_pos:
        raise SystemExit(f"prompt ({len(ids)}) + tokens ({a.tokens}) exceed max_position_embeddings={max_pos}")

    engine = sl.Engine(model, tok, a.strategy, expert_budget=a.expert_budget,
                       record_routing=not a.no_record_routing)
    samples: dict[str, dict] = {}
    run: dict = {}

    def sample(label: str, committed: int) -> None:
        samples[label] = {"committed": committed, "peak_rss_mb": round(_status_mb("VmHWM"), 1),
                          "rss_mb": round(_status_mb("VmRSS"), 1)}

    def on_step(info_) -> None:
        n = len(info_.tokens)
        for label, hit in (("checkpoint", "checkpoint" not in samples and n >= a.checkpoint), ("end", n >= a.tokens)):
            if hit:
                sample(label, n)
                run.setdefault("records", {})[label] = {**trace_records(run["trace"]),
                                                        "approx_mb": round(trace_mb(run["trace"]), 2)}

    sample("before", 0)
    prepared = engine.prepare(ids, max_new_tokens=a.tokens, callback=on_step)
    run["trace"] = prepared.trace  # read by the step callback, while the run records
    t0 = time.perf_counter()
    try:
        result = prepared.execute()
    finally:
        prepared.store.release()
    wall = time.perf_counter() - t0
    sample("after_generate", len(result.token_ids))

    out = {"model": source if source != "tiny" else "tiny (bundled)", "strategy": a.strategy,
           "tokens": len(result.token_ids), "prompt_tokens": len(ids), "wall_s": round(wall, 1),
           "record_routing": not a.no_record_routing, "memory": samples, "trace_records": run.get("records", {}),
           "tpot_ms_sim": result.metrics.get("tpot_ms"), "hit_rate": result.metrics.get("hit_rate")}
    out["trace_records"]["after_generate"] = {**trace_records(result.trace),
                                              "approx_mb": round(trace_mb(result.trace), 2)}
    if not a.skip_hf:
        t1 = time.perf_counter()
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=a.tokens, do_sample=False,
                                 pad_token_id=0)[0, len(ids):].tolist()
        out["hf_wall_s"] = round(time.perf_counter() - t1, 1)
        same = result.token_ids == ref
        out["lossless"] = same
        if not same:
            first = next((i for i, (x, y) in enumerate(zip(result.token_ids, ref)) if x != y),
                         min(len(ref), len(result.token_ids)))
            out["first_mismatch"] = first
            out["lengths"] = [len(result.token_ids), len(ref)]
    print(json.dumps(out, indent=2))
    if a.json:
        from specter_lab.atomic import write_atomic

        write_atomic(a.json, json.dumps(out, indent=2))
    return 0 if out.get("lossless", True) else 1


if __name__ == "__main__":
    sys.exit(main())
