"""The disk tier (``host_budget=``): device slots ← a bounded host expert cache ← the checkpoint's files.

Lossless with a host cache far smaller than the experts; the cache's own accounting never above its budget; disk
reads counted in the metrics, recorded in the trace and drawn in the Perfetto export and the timeline; the
simulated clock charges each read by the profile's disk numbers before the copy that needs it; a checkpoint larger
than the memory allowed either runs from disk within it (fused) or is refused before loading, with numbers
(per-expert); resident memory grows by about the cache, not by the experts (a ~100 MB checkpoint written here).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch

import specter_lab as sl
from specter_lab.errors import CheckpointError, HostBudgetTooSmall, NotEnoughMemory
from specter_lab.model.checkpoint_check import check_checkpoint
from specter_lab.model import inspect_model
from specter_lab.model.expert_files import ExpertFiles
from specter_lab.model.memory import plan_memory
from specter_lab.offload.clock import SimClock
from specter_lab.pricing.profiles import get_profile

from conftest import hf_greedy

N = 8


@pytest.fixture(scope="module")
def tiny():
    return sl.load_model("tiny")  # per-expert float32 safetensors: the tier fuses gate|up as it reads


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny random OLMoE written as 8 per-expert shards, and the same fused (one shard per layer)."""
    root = tmp_path_factory.mktemp("disk_tier")
    model = sl.tiny_random_model("olmoe", seed=3, num_experts=16, intermediate_size=64)
    model.save_pretrained(root / "per_expert", max_shard_size="200KB")
    sl.fuse_experts(root / "per_expert", root / "fused")
    return root / "per_expert", root / "fused"


def _ids(tok, text="The quick brown fox jumps"):
    return tok(text)["input_ids"]


@pytest.mark.parametrize("strategy", ["lru", "specter", "fiddler"])
def test_lossless_within_the_host_budget(tiny, strategy):
    model, tok = tiny
    ids = _ids(tok)
    eng = sl.Engine(model, tok, strategy, expert_budget=0.5, host_budget=0.2, verify_lossless=True)
    r = eng.generate(ids, max_new_tokens=N)
    assert r.token_ids == hf_greedy(model, ids, N)
    cache = eng.host_cache
    cache.check_invariants()
    assert cache.pool_bytes <= eng.setup.host_budget and cache.peak_bytes <= eng.setup.host_budget
    experts = sum(getattr(l.experts, n).nbytes for l in eng.info.layers for n in l.param_names)
    assert cache.pool_bytes < 0.25 * experts  # the cache really is a fraction of the experts
    disk = r.frames()["disk"]
    assert r.metrics["disk_reads"] == len(disk) == cache.reads > cache.capacity  # it refilled slots
    assert (disk.file_bytes == cache.expert_bytes).all()
    assert r.metrics["disk_file_bytes"] == cache.bytes_read
    assert r.metrics["host_cache_bytes"] == cache.pool_bytes


def test_clock_charges_each_read_before_its_copy(tiny):
    model, tok = tiny
    ids = _ids(tok)
    runs = {}
    for gbps in (5, 0.5):
        profile = replace(get_profile("rtx4090-pcie4"), name=f"disk{gbps}", disk_bandwidth=gbps * 1e9)
        eng = sl.Engine(model, tok, "lru", expert_budget=0.25, host_budget=0.2, hardware=profile)
        runs[gbps] = (eng, eng.generate(ids, max_new_tokens=N))
    eng, r = runs[5]
    disk, tr = r.frames()["disk"], r.frames()["transfers"]
    pieces = 3  # per-expert checkpoint: gate, up and down are three reads
    want_ms = 1e3 * eng.cost.disk_time(eng.cost.expert_bytes, pieces)
    assert ((disk.end - disk.start) - want_ms).abs().max() < 1e-9
    assert r.metrics["disk_ms_per_token"] > 0
    # every demand copy of a just-read expert starts after its read ended (the copy waits on the disk lane)
    first = tr.merge(disk, on=["step", "layer", "expert"], suffixes=("", "_disk"))
    first = first[first.start >= first.start_disk - 1e-9]
    assert len(first) and (first.start >= first.end_disk - 1e-9).all()
    # a slower disk: the same tokens, the same reads, a longer run
    slow = runs[0.5][1]
    assert slow.token_ids == r.token_ids and slow.metrics["disk_reads"] == r.metrics["disk_reads"]
    assert slow.metrics["tpot_ms"] > r.metrics["tpot_ms"]
    slow_disk = slow.frames()["disk"]
    slow_ms = 1e3 * runs[0.5][0].cost.disk_time(eng.cost.expert_bytes, pieces)
    assert ((slow_disk.end - slow_disk.start) - slow_ms).abs().max() < 1e-9 and slow_ms > want_ms
    assert slow.metrics["disk_ms_per_token"] > r.metrics["disk_ms_per_token"]
    # no disk tier: nothing read, nothing charged
    plain = sl.Engine(model, tok, "lru", expert_budget=0.25).generate(ids, max_new_tokens=N)
    assert plain.token_ids == r.token_ids and plain.metrics["disk_reads"] == 0 and plain.frames()["disk"].empty


def test_sim_clock_disk_lane_orders_reads():
    clock = SimClock(get_profile(None))
    a = clock.disk(1.0, lambda: None)
    b = clock.disk(1.0, lambda: None, issue_at=0.0)  # one reader: waits for the first
    c = clock.disk(0.5, lambda: None, after=(5.0,))  # waits for the slot's last reader
    assert (a.start, a.end, b.start, b.end, c.start, c.end) == (0.0, 1.0, 1.0, 2.0, 5.0, 5.5)
    copy = clock.copy(0.1, lambda: None, after=(c.end,))
    assert copy.start == 5.5


def test_disk_reads_in_perfetto_and_timeline(tiny, tmp_path):
    model, tok = tiny
    r = sl.Engine(model, tok, "lru", expert_budget=0.25, host_budget=0.2).generate(_ids(tok), max_new_tokens=4)
    doc = json.loads(open(r.to_perfetto(str(tmp_path / "t.json"))).read())
    from specter_lab.records.perfetto import TRACKS

    reads = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("tid") == TRACKS["disk"]]
    assert len(reads) == r.metrics["disk_reads"] and all(e["cat"] == "disk" for e in reads)
    assert any(e.get("cat", "").startswith("disk->") for e in doc["traceEvents"])
    from specter_lab.viz.figures import timeline_figure
    from specter_lab.viz.style import DISK_LANE

    fig = timeline_figure(r)
    bars = [t for t in fig.data if t.name and t.name.startswith("disk read")]
    assert len(bars) == 1 and len(bars[0].x) == r.metrics["disk_reads"] and set(bars[0].y) == {DISK_LANE}
    # a run without the tier draws the same traces (the disk one empty) and no disk lane
    plain = timeline_figure(sl.Engine(model, tok, "lru", expert_budget=0.25).generate(_ids(tok), max_new_tokens=2))
    assert len(plain.data) == len(fig.data)
    assert DISK_LANE not in plain.layout.yaxis.categoryarray


def test_bigger_than_the_allowance_runs_from_disk_or_is_refused(checkpoints):
    per_expert, fused = checkpoints
    ck = check_checkpoint(fused)
    limit = ck.dense_bytes + ck.expert_bytes // 2  # less than the checkpoint: the experts cannot all be resident
    assert limit < ck.file_bytes
    # per-expert: transformers would concatenate every expert into RAM: refused before loading, with the numbers
    with pytest.raises(NotEnoughMemory) as err:
        sl.load_model(per_expert, memory_limit=limit)
    assert "fuse_experts" in str(err.value) and "DOES NOT FIT" in str(err.value)
    # fused, in its own dtype: mapped at load, then run from disk within a host cache of an eighth of the experts
    model, _ = sl.load_model(fused, memory_limit=limit)
    plan = plan_memory(fused, host_budget=0.125, expert_budget=0.25, memory_limit=limit)
    assert plan.fits and plan.host_cache_bytes == ck.expert_bytes // 8
    assert "host expert cache" in str(plan) and "on disk" in str(plan)
    ids = list(range(3, 19))
    eng = sl.Engine(model, None, "lru", expert_budget=0.25, host_budget=0.125)
    r = eng.generate(ids, max_new_tokens=N)
    assert r.token_ids == hf_greedy(model, ids, N)
    eng.host_cache.check_invariants()
    assert eng.host_cache.pool_bytes <= ck.expert_bytes // 8 and r.metrics["disk_reads"] > 0
    # the same cache over more than the allowance: refused before loading, with the numbers
    tight = plan_memory(fused, host_budget=1.0, expert_budget=0.25, memory_limit=limit)
    assert not tight.fits and "host_budget" in str(tight)


def test_refusals(tiny, checkpoints, monkeypatch):
    model, tok = tiny
    with pytest.raises(HostBudgetTooSmall) as err:
        sl.Engine(model, tok, "lru", host_budget=1000)
    assert err.value.minimum_bytes > 1000
    with pytest.raises(ValueError, match="host_budget"):
        sl.Engine(model, tok, "lru", host_budget="lots")
    import specter_lab.model.memory as memory

    with monkeypatch.context() as mp:  # a machine with 1 MiB free: the 2.4 MiB cache is refused before allocating
        mp.setattr(memory, "available_memory", lambda: (2**20, "test"))
        with pytest.raises(NotEnoughMemory, match="nothing was allocated"):
            sl.Engine(model, tok, "lru", host_budget=0.2)
    random = sl.tiny_random_model("qwen2_moe", seed=1)  # built in memory: no files to read from
    with pytest.raises(ValueError, match="no local folder"):
        sl.Engine(random, None, "lru", host_budget=0.5)
    # files that are not the model's: caught by the bit-for-bit check before any run
    per_expert, fused = checkpoints
    same, _ = sl.load_model(fused)
    ExpertFiles(inspect_model(same), per_expert).verify()  # the same weights in the other layout: equal
    other = sl.tiny_random_model("olmoe", seed=99, num_experts=16, intermediate_size=64)
    with pytest.raises(CheckpointError, match="differs"):
        ExpertFiles(inspect_model(other), fused).verify()


def test_resident_memory_grows_by_the_cache_not_the_experts(tmp_path):
    """~100 MB of fused fp32 experts, a 12 MiB host cache: the run's resident growth stays near the cache and the
    slots, far below the experts' bytes (the experts stay on disk; HF's reference pass runs afterwards)."""
    psutil = pytest.importorskip("psutil")
    big = sl.tiny_random_model("olmoe", seed=4, hidden_size=256, intermediate_size=512, num_experts=16,
                               num_hidden_layers=4)
    big.save_pretrained(tmp_path / "pe", max_shard_size="64MB")
    del big
    sl.fuse_experts(tmp_path / "pe", tmp_path / "fused")
    for f in (tmp_path / "pe").iterdir():
        f.unlink()
    ck = check_checkpoint(tmp_path / "fused")
    assert ck.expert_bytes > 90e6
    model, _ = sl.load_model(tmp_path / "fused")
    proc = psutil.Process(os.getpid())
    ids = list(range(3, 15))
    eng = sl.Engine(model, None, "lru", expert_budget="4MiB", host_budget="12MiB")
    rss0 = proc.memory_info().rss
    r = eng.generate(ids, max_new_tokens=4)
    grown = proc.memory_info().rss - rss0
    assert eng.host_cache.pool_bytes <= 12 * 2**20 and r.metrics["disk_reads"] > 0
    assert grown < 48 * 2**20, f"resident memory grew {grown / 2**20:.0f} MiB; experts {ck.expert_bytes / 2**20:.0f} MiB"
    assert r.token_ids == hf_greedy(model, ids, 4)


def test_replay_prices_the_disk_tier_as_the_live_run(checkpoints):
    """A replay's tensorless host cache makes the same reads at the same simulated times as the live run (a fused
    checkpoint: one read per fused tensor, what the replay assumes)."""
    _, fused = checkpoints
    model, _ = sl.load_model(fused)
    ids = list(range(5, 17))
    trace = sl.record(model, None, [ids], max_new_tokens=N, k_max=0, progress=False)
    live = sl.Engine(model, None, "lru", expert_budget=0.25, host_budget=0.125).generate(ids, max_new_tokens=N)
    (rep,) = sl.replay(trace, "lru", expert_budget=0.25, host_budget=0.125)
    assert rep.metrics["disk_reads"] == live.metrics["disk_reads"] > 0
    assert rep.metrics["tpot_ms"] == pytest.approx(live.metrics["tpot_ms"], rel=1e-9)
    a, b = rep.frames()["disk"], live.frames()["disk"]
    assert (a[["layer", "expert", "slot"]].to_numpy() == b[["layer", "expert", "slot"]].to_numpy()).all()
    assert (a.start - b.start).abs().max() < 1e-9 and (a.file_bytes == 0).all()  # priced, nothing read


def test_cli_prints_the_tier(capsys):
    from specter_lab.cli import main

    assert main(["run", "--model", "tiny", "--strategy", "lru", "--max-new-tokens", "4", "--expert-budget", "0.25",
                 "--host-budget", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "host expert cache" in out and "read from disk" in out  # the plan, before loading
    reads = next(line for line in out.splitlines() if line.strip().startswith("disk_reads"))
    assert int(reads.split()[-1].replace(",", "")) > 0  # the run's metrics
