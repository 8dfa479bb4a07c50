"""estimate(ram=, disk=): experts read from disk when host RAM cannot hold them all, priced per row through the
page cache (estimate/page_cache.py); nothing changes where RAM is not given or holds every expert."""

import numpy as np
import pandas as pd
import pytest

import specter_lab as sl
from specter_lab.cli import main
from specter_lab.estimate import replay
from specter_lab.estimate.page_cache import PageCache

# Mixtral-8x7B at q4_k_m on a 12 GB card: 25.5 GiB of routed experts, ~10 GiB of them fit in VRAM
MACHINE = dict(gpu="rtx3060", host="ddr4-3200x2", weights="q4_k_m")


@pytest.fixture(scope="module")
def in_ram():
    return sl.estimate("mixtral-8x7b", **MACHINE)


def _by_row(e) -> pd.DataFrame:
    return e.table.set_index("strategy")


def test_without_ram_or_with_enough_nothing_is_read_from_disk(in_ram):
    assert (in_ram.table.disk_ms == 0).all() and "disk bandwidth" not in in_ram.unknowns
    assert "host RAM NOT GIVEN" in in_ram.assumptions[-1] and "--ram" in str(in_ram)
    plenty = sl.estimate("mixtral-8x7b", ram="64GB", **MACHINE)
    pd.testing.assert_series_equal(_by_row(plenty).tokens_per_s, _by_row(in_ram).tokens_per_s)
    assert "nothing is read from disk" in plenty.assumptions[-1]


def test_short_ram_reads_experts_from_disk_and_costs_time(in_ram):
    short = sl.estimate("mixtral-8x7b", ram="16GB", **MACHINE)
    a, b = _by_row(in_ram), _by_row(short)
    offloaded = [s for s in b.index if b.loc[s, "copies_per_token"] + b.loc[s, "host_experts_per_token"] > 0]
    assert offloaded and (b.loc[offloaded, "disk_ms"] > 0).all()
    # the row's time is the in-RAM time plus its disk time (same routing, same placement)
    np.testing.assert_allclose(b.loc[offloaded, "tpot_ms"], a.loc[offloaded, "tpot_ms"] + b.loc[offloaded, "disk_ms"],
                               rtol=1e-9)
    # a read costs the latency plus the expert's bytes at the profile's 5 GB/s
    g = short.model
    per_read = short.machine.gpu.disk_latency + g.expert_params * short.precision.experts.bytes_per_weight / 5e9
    np.testing.assert_allclose(b.disk_ms, b.disk_reads_per_token * per_read * 1e3, rtol=1e-9)
    assert "disk bandwidth" in short.unknowns and "page cache" in short.assumptions[-1]
    assert "--no-mmap" not in short.llama_cpp() and "--no-mmap" in in_ram.llama_cpp()


def test_less_ram_or_a_slower_disk_is_slower():
    tps = {ram: _by_row(sl.estimate("mixtral-8x7b", ram=ram, **MACHINE)).tokens_per_s for ram in ("8GB", "16GB")}
    assert (tps["8GB"] < tps["16GB"]).all()
    slow = _by_row(sl.estimate("mixtral-8x7b", ram="16GB", disk="2GB/s", **MACHINE))
    fast = _by_row(sl.estimate("mixtral-8x7b", ram="16GB", disk=7e9, **MACHINE))
    assert (slow.tokens_per_s < fast.tokens_per_s).all()
    assert (slow.disk_reads_per_token == fast.disk_reads_per_token).all()  # the disk's speed moves no read


def test_the_page_cache_is_one_lru_with_the_gpus_slots():
    rng = np.random.default_rng(0)
    routing = np.stack([rng.choice(8, size=(4, 2), replace=False) for _ in range(200)])  # [tokens, layers, top-2]
    routing = routing.reshape(200, 4, 2)
    pages = PageCache(6, routing)
    counts = replay.layer_lru(routing, 2, 20)  # 2 GPU slots a layer: 8 in all
    # the steady state: the routing twice, the misses of the second pass
    misses = replay.global_lru(np.concatenate([routing, routing]), 8 + 6, 200).copies_per_token
    reads = float((counts.copied + counts.host).sum())
    assert pages.disk_share(counts, 8) == pytest.approx(min(1.0, misses / reads))
    disked = pages.with_disk(counts, 8)
    np.testing.assert_allclose(disked.disk, (counts.copied + counts.host) * pages.disk_share(counts, 8))
    assert pages.disk_share(replay.resident(4, 2), 8) == 0.0  # no host reads, no disk reads
    assert PageCache(24, routing).disk_share(counts, 8) == 0.0  # with the GPU's 8: all 32 experts, no first touch
    # a static split (layers 0-1 on the GPU, 2-3 on the host): only the host layers pass through the page cache
    static = replay.static_layers([True, True, False, False], 2)
    host_only = np.concatenate([routing[:, 2:], routing[:, 2:]])
    want = replay.global_lru(host_only, 6, 200).copies_per_token / float(static.host.sum())
    assert pages.disk_share(static, 16) == pytest.approx(min(1.0, want)) and want > 0


@pytest.mark.parametrize("kw, match", [
    (dict(ram="lots"), r"ram='lots': give bytes"),
    (dict(ram=-1), r"ram=-1: give bytes"),
    (dict(ram=float("nan")), r"ram=nan: give bytes"),
    (dict(ram="16GB", disk="fast"), r"disk='fast': give bytes.*3.5GB/s"),
    (dict(ram="10MB"), r"ram=0.01 GiB cannot hold the embeddings"),
])
def test_bad_ram_and_disk_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        sl.estimate("mixtral-8x7b", **MACHINE, **kw)


def test_cli_ram(capsys):
    assert main(["estimate", "--config", "mixtral-8x7b", "--gpu", "rtx3060", "--weights", "q4_k_m",
                 "--ram", "16GB", "--disk", "3.5GB/s"]) == 0
    out = capsys.readouterr().out
    assert "disk_ms" in out and "3.5 GB/s" in out and "14.9 GiB RAM for weights" in out


def test_the_explorer_takes_ram():
    from specter_lab.viz.estimate_view import EstimateExplorer, estimate_table

    x = EstimateExplorer("mixtral-8x7b", vram="12GB", run_now=False)
    x.ram.value = "16GB"
    x.run()
    assert "disk_reads_per_token" in estimate_table(x.summary["table"]).columns
    assert "14.9 GiB RAM for weights" in x.status.value
    x.ram.value = "lots"
    x.run()  # a bad field is shown, not raised
    assert "ram=&#x27;lots&#x27;: give bytes" in x.status.value
    # E14: nothing of the previous estimate is left below the error, to be read as this setting's
    assert x.table.value == x.commands.value == "" and x.figure not in x.box.children
    x.ram.value = ""
    x.run()
    assert "disk_reads_per_token" not in estimate_table(x.summary["table"]).columns
