"""sl.bench.consumer_anchors(): published offloaded decode on consumer machines against the estimator, every row
tagged fit or check, the constant fitted on fit rows only, and the two groups' errors reported apart."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specter_lab.estimator.consumer import (CONSUMER_ROWS, TOLERANCE, consumer_summary, derive_host_efficiency)
from specter_lab.pricing.profiles import HOST_DECODE_EFFICIENCY, HOST_EFFICIENCY_RANGE
from specter_lab.pricing.published import PUBLISHED_ROWS
from specter_lab.studies import bench


@pytest.fixture(scope="module")
def table():
    return bench.consumer_anchors()


def test_every_row_is_tagged_fit_or_check_with_a_source(table):
    assert len(table) == len(CONSUMER_ROWS) >= 10
    assert set(table.split) == {"fit", "check"} and (table.split == "check").sum() >= 5
    assert table.source.str.len().gt(0).all() and table.note.str.len().gt(0).all()
    assert {r.split for r in PUBLISHED_ROWS} == {"fit", "check"}  # the resident table too


def test_fitted_rows_hold_within_30pct_also_left_out(table):
    fit = table[table.split == "fit"]
    assert fit.within_30pct.all(), fit[["model", "engine", "ratio"]]
    host = fit[fit.row_host_efficiency.notna()]  # a backend's own fit row has no other row to be left out against
    assert (host.loo_ratio.sub(1).abs() <= TOLERANCE).all(), host[["model", "engine", "loo_ratio"]]


def test_the_constant_is_fitted_on_fit_rows_only(table):
    assert HOST_DECODE_EFFICIENCY == pytest.approx(derive_host_efficiency(), rel=0.01)
    rows = table.row_host_efficiency.dropna()
    assert len(rows) == ((table.split == "fit") & table.row_backend_efficiency.isna()).sum()
    assert HOST_EFFICIENCY_RANGE == pytest.approx((rows.min(), rows.max()), abs=0.002)
    # a check row changes nothing: mark one as if it were fitted and the constant moves
    moved = tuple(replace(r, role="fit") if "CPU only" in r.engine else r for r in CONSUMER_ROWS)
    assert derive_host_efficiency(moved) != pytest.approx(derive_host_efficiency(), rel=1e-3)


def test_bands_hold_the_published_figures(table):
    assert (table.band_low <= table.simulated_tok_s).all() and (table.simulated_tok_s <= table.band_high).all()
    assert table.in_band.mean() >= 0.8, table[["model", "engine", "band_tok_s", "published_tok_s"]]
    assert table.dominant_unknown.str.len().gt(0).all()


def test_summary_reports_the_groups_apart(table):
    s = consumer_summary(table).set_index("split")
    assert list(s.index) == ["fit", "check"]
    assert s.loc["check", "rows"] == (table.split == "check").sum()
    assert s.loc["check", "median_abs_error"] == pytest.approx(table[table.split == "check"].abs_error.median())


def test_the_mmap_row_says_why(table):
    row = table[table.engine.str.contains("CPU only")].iloc[0]
    assert row.in_published_range and "mmap" in row.note  # warm no-mmap prices the top of a bimodal range


def test_cli_bench_consumer(capsys):
    from specter_lab.cli import main

    assert main(["bench", "--consumer", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["consumer"]) == len(CONSUMER_ROWS) and all("ratio" in r for r in out["consumer"])
    assert [s["split"] for s in out["summary"]] == ["fit", "check"]


def test_a_backends_efficiency_is_fitted_on_its_fit_row_only(table):
    """The backends with a fit row of their own hold the value that row reproduces; a backend with none keeps the
    CUDA-measured figures and says so with a wider band."""
    from specter_lab.estimator.bands import BACKEND_EFFICIENCY, BACKEND_RANGE
    from specter_lab.estimator.consumer import derive_backend_efficiency

    derived = derive_backend_efficiency()
    assert set(derived) == set(BACKEND_EFFICIENCY)
    for key, value in derived.items():
        assert BACKEND_EFFICIENCY[key] == pytest.approx(value, rel=0.01), key
    fitted = table[table.row_backend_efficiency.notna()]
    assert len(fitted) == len(BACKEND_EFFICIENCY) and (fitted.split == "fit").all()
    intel = table[table.machine.str.startswith("arca770")].iloc[0]  # Vulkan on Intel: no fit row
    assert intel.split == "check" and intel.dominant_unknown in ("backend efficiency", "GPU format efficiency")
    assert BACKEND_RANGE[0] < 1 < BACKEND_RANGE[1]
