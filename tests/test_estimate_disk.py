"""estimate(ram=, disk=): experts read from disk when host RAM cannot hold them all, priced per row by the replay's
disk tier (a host cache of the experts RAM holds, every miss read from the files at the disk's speed); nothing
changes where RAM is not given or holds every expert. RAM sizes are binary, as a user means them."""

import pandas as pd
import pytest

import specter_lab as sl
from specter_lab.cli import main

# Mixtral-8x7B at q4_k_m on a 12 GB card: ~25 GiB of routed experts, ~10 GiB of them fit in VRAM
MACHINE = dict(gpu="rtx3060", host="ddr4-3200x2", weights="q4_k_m", tokens=12)


@pytest.fixture(scope="module")
def in_ram():
    return sl.estimate("mixtral-8x7b", **MACHINE)


@pytest.fixture(scope="module")
def short():
    return sl.estimate("mixtral-8x7b", ram="16GB", **MACHINE)


def _by_row(e) -> pd.DataFrame:
    return e.table.set_index("strategy")


def test_without_ram_or_with_enough_nothing_is_read_from_disk(in_ram):
    assert (in_ram.table.disk_ms == 0).all() and "disk bandwidth" not in in_ram.unknowns
    assert any("host RAM NOT GIVEN" in a for a in in_ram.assumptions) and "--ram" in str(in_ram)
    plenty = sl.estimate("mixtral-8x7b", ram="64GB", **MACHINE)
    pd.testing.assert_series_equal(_by_row(plenty).tokens_per_s, _by_row(in_ram).tokens_per_s)
    assert any("nothing is read from disk" in a for a in plenty.assumptions)


def test_short_ram_reads_experts_from_disk_and_costs_time(in_ram, short):
    a, b = _by_row(in_ram), _by_row(short)
    reads = b.index[b.disk_reads_per_token > 0]
    # every row that moves experts through the host reads some from disk, but a static split whose host layers'
    # experts fit in the RAM left keeps them there (nothing else moves)
    assert len(reads) >= len(b) - 2 and (b.loc[reads, "tokens_per_s"] < a.loc[reads, "tokens_per_s"]).all()
    assert "disk bandwidth" in short.unknowns and any("disk tier" in x for x in short.assumptions)
    assert "--no-mmap" not in short.llama_cpp() and "--no-mmap" in in_ram.llama_cpp()
    # the rows are replays with the disk tier: sl.replay with the same options gives the same TPOT
    row = "lru"
    (r,) = sl.replay(short.workload.trace, row, **short.replay_options(row))
    assert r.metrics["tpot_ms"] == pytest.approx(short.row(row).tpot_ms, rel=1e-9) and r.metrics["disk_reads"] > 0


def test_less_ram_or_a_slower_disk_is_slower(short):
    less = _by_row(sl.estimate("mixtral-8x7b", ram="12GB", **MACHINE))
    b = _by_row(short)
    reads = b.index[b.disk_reads_per_token > 0]
    assert (less.loc[reads, "tokens_per_s"] <= b.loc[reads, "tokens_per_s"]).all()
    slow = _by_row(sl.estimate("mixtral-8x7b", ram="16GB", disk="2GB/s", **MACHINE))
    fast = _by_row(sl.estimate("mixtral-8x7b", ram="16GB", disk=7e9, **MACHINE))
    assert (slow.loc[reads, "tokens_per_s"] < fast.loc[reads, "tokens_per_s"]).all()


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
                 "--ram", "16GB", "--disk", "3.5GB/s", "--wide"]) == 0
    out = capsys.readouterr().out
    assert "disk" in out and "3.5 GB/s" in out and "16.0 GiB RAM for weights" in out


def test_the_explorer_takes_ram():
    from specter_lab.viz.estimate_view import EstimateExplorer, estimate_table

    x = EstimateExplorer("mixtral-8x7b", vram="12GB", run_now=False)
    x.ram.value = "16GB"
    x.run()
    assert "disk_reads_per_token" in estimate_table(x.summary["table"]).columns
    assert "16.0 GiB RAM for weights" in x.status.value
    x.ram.value = "lots"
    x.run()  # a bad field is shown, not raised
    assert "ram=&#x27;lots&#x27;: give bytes" in x.status.value
    # E14: nothing of the previous estimate is left below the error, to be read as this setting's
    assert x.table.value == x.commands.value == "" and x.figure not in x.box.children
    x.ram.value = ""
    x.run()
    assert "disk_reads_per_token" not in estimate_table(x.summary["table"]).columns
