"""One prepared check of the CUDA path (run it on a machine with an NVIDIA GPU):

1. lossless: the bundled model with its routed experts in pinned host memory, every strategy on the CUDA clock
   (real copy stream, events, non-blocking pinned copies) against HF greedy generate on the same GPU;
2. the link: pinned and pageable H2D bandwidth, per-copy latency, HBM and matmul throughput (``calibrate``);
3. a CUDA-clock timeline summary: TPOT, stalls, copy bytes, measured copy bandwidth from the trace itself.

    python scripts/gpu_check.py [--model tiny] [--tokens 32]

Exit code 0 only if every strategy was lossless.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--budget", type=float, default=0.35)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing checked.", file=sys.stderr)
        return 2
    import specter_lab as sl
    from specter_lab.model import place_for_offload

    print(f"device: {torch.cuda.get_device_name()} · torch {torch.__version__}")
    model, tok = sl.load_model(a.model, dtype=torch.float32, device="cpu")
    prompt = "def fibonacci(n):\n"
    ids = tok(prompt)["input_ids"]
    model.to("cuda")
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=a.tokens, do_sample=False)
    ref = ref[0, len(ids):].tolist()
    place_for_offload(model, device="cuda")  # experts to pinned host memory, the rest stays on the GPU

    ok = True
    print(f"\n1. lossless on the CUDA clock (budget {a.budget}, {a.tokens} tokens):")
    results, engines = {}, {}
    for s in [s for s in sl.STRATEGIES if s != "auto"]:
        eng = sl.Engine(model, tok, s, expert_budget=a.budget, hardware="cuda")
        t0 = time.perf_counter()
        r = eng.generate(ids, max_new_tokens=a.tokens)
        wall = time.perf_counter() - t0
        same = r.token_ids == ref
        ok &= same
        results[s], engines[s] = r, eng
        m = r.metrics
        print(f"  {s:<15} lossless={same!s:<5} tpot={m['tpot_ms']:.3f} ms  stall/tok={m['stall_ms_per_token']:.3f} ms"
              f"  hit={m['hit_rate']:.2f}  h2d/tok={m['h2d_bytes_per_token'] / 1e6:.2f} MB  wall={wall:.2f} s"
              f"  clock={m['clock']}")

    d = engines["specter"].draft
    print(f"  specter's draft on {d.device}: stored {d.stored_bytes() / 1e6:.3f} MB (bit-packed={d.packed}), "
          f"budgeted {d.packed_bytes / 1e6:.3f} MB")

    print("\n2. the link (calibrate):")
    prof = sl.calibrate("gpu-check", save=False)
    print(f"  pinned H2D {prof.pcie_bandwidth / 1e9:.1f} GB/s · pageable {prof.pageable_bandwidth / 1e9:.1f} GB/s · "
          f"per-copy latency {prof.copy_latency * 1e6:.1f} us · HBM {prof.hbm_bandwidth / 1e9:.0f} GB/s · "
          f"fp16 matmul {prof.peak_flops / 1e12:.0f} TFLOP/s · launch {prof.launch_overhead * 1e6:.1f} us")

    print("\n3. CUDA-clock timeline of specter:")
    f = results["specter"].frames()
    tr, co = f["transfers"], f["compute"]
    if len(tr):
        dur = (tr.end - tr.start).clip(lower=1e-6)
        print(f"  {len(tr)} copies, {tr.bytes.sum() / 1e6:.1f} MB, median {((tr.bytes / 1e6) / dur).median():.1f} GB/s "
              f"per copy (bytes/ms = MB/ms = GB/s), prefetch {int((tr.reason == 'prefetch').sum())}, "
              f"demand {int((tr.reason == 'demand').sum())}")
    print(f"  compute spans {len(co)}, total stall {co.stall.sum():.2f} ms, "
          f"steps {len(f['steps'])}, windows accepted {results['specter'].metrics.get('mean_accepted', float('nan')):.2f}/window")
    print("\nOK" if ok else "\nFAILED: some strategy was not lossless")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
