"""``scripts/gpu_check.py --dry-run``: the whole GPU validation script, on the CPU, as CI runs it.

The dry run uses small models and the simulated clock, so its numbers say nothing about a GPU; what it checks is
that every part runs, is guarded, and writes the report the GPU run will write."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("gpu_check", None)


def test_dry_run_writes_a_complete_report(gpu_check, tmp_path):
    rc = gpu_check.main(["--dry-run", "--tokens", "6", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "dry-run-cpu.json").read_text())
    failed = {n: p.get("error") for n, p in report["parts"].items() if not p["ok"]}
    assert rc == 0 and not failed, failed
    assert report["meta"]["dry_run"] is True
    models = [n for n, p in report["parts"].items() if "strategies" in p]
    assert len(models) == 3
    for name in models:
        rows = report["parts"][name]["strategies"]
        assert "auto" not in rows and len(rows) >= 7
        for s, r in rows.items():
            assert "error" not in r, (name, s, r)
            assert r["tpot_ms"] > 0 and r["sim_tpot_ms"] > 0
            # on the CPU the runtime is exact: every strategy reproduces HF generate token for token
            assert r["token_agreement"] == 1.0, (name, s)
    md = (tmp_path / "dry-run-cpu.md").read_text()
    assert "dry run on the CPU" in md and "| lru |" in md


def test_a_failing_part_is_recorded_and_the_rest_runs(gpu_check, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(gpu_check, "race_part", boom)
    monkeypatch.setattr(gpu_check, "model_part", boom)
    rc = gpu_check.main(["--dry-run", "--tokens", "4", "--out", str(tmp_path)])
    parts = json.loads((tmp_path / "dry-run-cpu.json").read_text())["parts"]
    assert rc == 1
    assert parts["race"] == {**parts["race"], "ok": False, "error": "RuntimeError: injected"}
    assert parts["build models"]["ok"] and parts["calibrate"]["ok"]
