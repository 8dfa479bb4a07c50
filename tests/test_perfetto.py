"""result.to_perfetto(path) / run --perfetto: a Chrome trace-event file with one track per lane, expert slices with
their fields, and flow arrows from each copy to the compute that read it."""

from __future__ import annotations

import json

import pytest

import specter_lab as sl


@pytest.fixture(scope="module")
def bundled():
    return sl.load_model("tiny")


def _load(path) -> tuple[dict, list[dict]]:
    doc = json.loads(path.read_text())
    return doc, doc["traceEvents"]


def test_quickstart_run_opens_as_a_trace(bundled, tmp_path):
    model, tok = bundled
    engine = sl.Engine(model, tok, strategy="specter", expert_budget=0.5, draft=sl.QuantSpec(bits=4, group_size=64),
                       hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite")
    r = engine.generate("def fib(n):", max_new_tokens=12)
    assert r.to_perfetto(str(tmp_path / "t.json")) == str(tmp_path / "t.json")
    doc, ev = _load(tmp_path / "t.json")
    tracks = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(tracks.values()) == sorted(["steps", "compute (device stream)", "copy (host to device link)",
                                              "host (experts on the CPU)"])
    slices = [e for e in ev if e["ph"] == "X"]
    assert all(e["dur"] > 0 and e["ts"] >= 0 for e in slices)
    steps = [e for e in slices if e["cat"] == "step"]
    assert len(steps) == len(r.frames()["steps"])
    miss = next(e for e in slices if e["cat"] == "expert" and e["args"]["status"] == "miss")
    assert {"layer", "expert", "status", "bytes", "copy_id", "step", "phase"} <= set(miss["args"])
    copies = {e["args"]["copy_id"]: e for e in slices if e["cat"] == "copy"}
    copy = copies[miss["args"]["copy_id"]]
    assert (copy["args"]["layer"], copy["args"]["expert"]) == (miss["args"]["layer"], miss["args"]["expert"])
    assert miss["args"]["bytes"] == copy["args"]["bytes"] > 0
    assert copy["ts"] + copy["dur"] <= miss["ts"] + 1e-3  # the compute that waited starts after its copy ends
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = [e for e in ev if e["ph"] == "f"]
    assert ends and len(starts) == len(ends) and all(e["bp"] == "e" for e in ends)
    for f in ends[:20]:  # each arrow leaves a copy slice and lands on a compute slice
        s = starts[f["id"]]
        assert any(c["ts"] <= s["ts"] <= c["ts"] + c["dur"] for c in copies.values())
        assert any(x["tid"] == f["tid"] and x["ts"] == f["ts"] for x in slices)
    assert doc["metadata"]["clock"].startswith("simulated")


def test_host_lane_and_cli_flag(tmp_path, capsys):
    from specter_lab.cli import main

    out = tmp_path / "run.json"
    assert main(["run", "--strategy", "fiddler", "--expert-budget", "0.3", "--max-new-tokens", "6",
                 "--perfetto", str(out)]) == 0
    assert "timeline written" in capsys.readouterr().out
    _, ev = _load(out)
    host = [e for e in ev if e["ph"] == "X" and e["tid"] == 4]
    assert host and all(e["args"]["status"] == "host" for e in host)


def test_steps_only_trace_is_refused(bundled, tmp_path):
    model, tok = bundled
    r = sl.Engine(model, tok, strategy="lru", expert_budget=0.5, trace="steps").generate("x = 1", max_new_tokens=3)
    with pytest.raises(ValueError, match="trace='full'"):
        r.to_perfetto(str(tmp_path / "x.json"))
