"""sl.bench.consumer_anchors(): published offloaded decode on consumer machines against the estimator."""

from __future__ import annotations

import json

import pytest

from specter_lab.studies import bench
from specter_lab.estimate.consumer import CONSUMER_ROWS, TOLERANCE, derive_host_efficiency
from specter_lab.estimate.pricing import HOST_DECODE_EFFICIENCY, HOST_EFFICIENCY_RANGE


@pytest.fixture(scope="module")
def table():
    return bench.consumer_anchors()


def test_every_row_of_the_issue_is_there(table):
    assert len(table) == len(CONSUMER_ROWS) == 7
    assert set(table.model) == {"DeepSeek-V2-Lite Q4_K_M", "Qwen3-30B-A3B Q2_K", "Qwen3-30B-A3B-2507 BF16",
                                "gpt-oss-20B MXFP4"}
    assert table.source.str.len().gt(0).all() and table.note.str.len().gt(0).all()


def test_fitted_rows_hold_within_30pct_also_left_out(table):
    fit = table[table.role == "host fit"]
    assert fit.within_30pct.all(), fit[["model", "engine", "ratio"]]
    assert (fit.loo_ratio.sub(1).abs() <= TOLERANCE).all(), fit[["model", "engine", "loo_ratio"]]


def test_the_device_only_check_holds(table):
    row = table[table.engine.str.contains("all on the GPU")].iloc[0]
    assert abs(row.ratio - 1) <= TOLERANCE


def test_the_mmap_row_misses_and_says_why(table):
    row = table[table.engine.str.contains("CPU only")].iloc[0]
    assert not row.within_30pct and row.in_published_range  # warm no-mmap is the top of a bimodal range
    assert "mmap" in row.note


def test_host_efficiency_constant_is_the_fit(table):
    assert HOST_DECODE_EFFICIENCY == pytest.approx(derive_host_efficiency(), rel=0.01)
    rows = table.row_host_efficiency.dropna()
    assert HOST_EFFICIENCY_RANGE == pytest.approx((rows.min(), rows.max()), abs=0.002)


def test_cli_bench_consumer(capsys):
    from specter_lab.cli import main

    assert main(["bench", "--consumer", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["consumer"]
    assert len(rows) == 7 and all("ratio" in r for r in rows)
