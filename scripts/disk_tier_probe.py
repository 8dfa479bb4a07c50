"""The disk tier on this machine: what is measured and what is modelled (docs/disk_tier.md).

Writes a random fused OLMoE-shaped checkpoint (~100 MB of fp32 experts by default) to a temporary folder, runs
``lru`` with a host expert cache far smaller than the experts, and prints:

* measured: the wall time of each expert read from the files (``os.preadv`` + ``posix_fadvise(DONTNEED)``, timed
  around :meth:`ExpertFiles.read_into`), the resident-memory growth of the run, and whether the tokens equal HF
  ``generate``;
* modelled: the simulated clock's disk lane (the profile's ``disk_bandwidth`` / ``disk_latency``) and the TPOT
  with and without the tier, for the same run priced as a real model (``--cost-shape``).

Usage: ``python scripts/disk_tier_probe.py [--host-budget 12MiB] [--cost-shape olmoe-1b-7b] [--tokens 8]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host-budget", default="12MiB")
    ap.add_argument("--expert-budget", type=float, default=0.1)
    ap.add_argument("--cost-shape", default="olmoe-1b-7b")
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import psutil

    import specter_lab as sl
    from specter_lab.model.expert_files import ExpertFiles

    root = Path(tempfile.mkdtemp(prefix="disk_tier_"))
    try:
        big = sl.tiny_random_model("olmoe", seed=4, hidden_size=256, intermediate_size=512, num_experts=16,
                                   num_hidden_layers=4)
        big.save_pretrained(root / "pe", max_shard_size="64MB")
        del big
        sl.fuse_experts(root / "pe", root / "fused")
        shutil.rmtree(root / "pe")
        for f in (root / "fused").glob("*.safetensors"):  # just written: flush it and drop its pages, so the
            fd = os.open(f, os.O_RDONLY)                     # run's reads come from the drive, not the page cache
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        model, _ = sl.load_model(root / "fused")
        ids = list(range(3, 19))
        reads: list[tuple[float, int]] = []
        original = ExpertFiles.read_into

        def timed(self, layer, expert, dst):
            t0 = time.perf_counter()
            n = original(self, layer, expert, dst)
            reads.append((time.perf_counter() - t0, n))
            return n

        ExpertFiles.read_into = timed
        proc = psutil.Process(os.getpid())
        runs = {}
        for hb in (a.host_budget, None):
            kw = {"host_budget": hb} if hb else {}
            eng = sl.Engine(model, None, "lru", expert_budget=a.expert_budget, cost_shape=a.cost_shape, **kw)
            rss0 = proc.memory_info().rss
            r = eng.generate(ids, max_new_tokens=a.tokens)
            runs[hb] = (eng, r, proc.memory_info().rss - rss0)
        ExpertFiles.read_into = original
        ref = model.generate(torch.tensor([ids]), max_new_tokens=a.tokens, do_sample=False)[0, len(ids):].tolist()
        eng, r, grown = runs[a.host_budget]
        secs = [s for s, _ in reads[2:]]  # the first two are the verification reads at Engine construction
        nbytes = reads[-1][1]
        print(f"checkpoint: {sum(f.stat().st_size for f in (root / 'fused').glob('*.safetensors')) / 2**20:.0f} MiB "
              f"fused fp32; host cache {eng.host_cache}")
        print(f"measured: {len(secs)} expert reads of {nbytes / 2**20:.2f} MiB, median "
              f"{1e3 * sorted(secs)[len(secs) // 2]:.2f} ms ({nbytes / sorted(secs)[len(secs) // 2] / 1e9:.2f} GB/s), "
              f"total {sum(secs):.3f} s; resident growth {grown / 2**20:.0f} MiB with the tier, "
              f"{runs[None][2] / 2**20:.0f} MiB without; tokens equal HF generate: {r.token_ids == ref} / "
              f"{runs[None][1].token_ids == ref}")
        m, p = r.metrics, runs[None][1].metrics
        prof = eng.profile
        print(f"modelled ({m['clock']}, projected as {a.cost_shape}; disk {prof.disk_bandwidth / 1e9:g} GB/s + "
              f"{prof.disk_latency * 1e6:g} us a read): disk reads/token {m['disk_reads_per_token']:.1f}, disk "
              f"{m['disk_ms_per_token']:.2f} ms/token; TPOT {m['tpot_ms']:.2f} ms with the tier vs "
              f"{p['tpot_ms']:.2f} ms with every expert in host RAM (hit rate {m['hit_rate']:.2f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
