"""The command line, end to end on the bundled model."""

import json

from specter_lab.cli import main


def test_run_prints_text_and_metrics(capsys):
    assert main(["run", "--model", "tiny", "--strategy", "specter", "--max-new-tokens", "8",
                 "--expert-budget", "0.5", "--cost-shape", "deepseek-v2-lite"]) == 0
    out = capsys.readouterr().out
    assert "tpot_ms" in out and "acceptance_rate" in out and "projected as deepseek-v2-lite" in out


def test_run_json(capsys):
    assert main(["run", "--model", "tiny", "--strategy", "lru", "--max-new-tokens", "6", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["token_ids"]) == 6 and d["metrics"]["clock"].startswith("simulated:")


def test_bench_json_and_html(capsys, tmp_path):
    html = tmp_path / "r.html"
    assert main(["bench", "--strategies", "lru,specter,oracle", "--hardware", "rtx4090-pcie4", "--budgets", "0.5",
                 "--prompts", "1", "--max-new-tokens", "8", "--json", "--html", str(html)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {r["strategy"] for r in d["runs"]} == {"lru", "specter", "oracle"}
    s = d["summary"][0]
    assert s["best_baseline"] == "lru" and s["speedup_specter"] > 0
    assert "projected as deepseek-v2-lite" in d["note"]
    assert "plotly" in html.read_text()


def test_bad_arguments_exit_2(capsys):
    assert main(["run", "--model", "tiny", "--strategy", "nope"]) == 2
    assert "strategy" in capsys.readouterr().err
    assert main(["run", "--model", "tiny", "--hardware", "rtx9999"]) == 2
    assert main(["run", "--model", "tiny", "--bits", "5"]) == 2
    assert "bits" in capsys.readouterr().err


def test_bench_takes_expert_budget_and_sizes(capsys):
    """`bench --expert-budget X` benchmarks at X (it used to be accepted and silently ignored), `--budgets` takes
    the same forms as `--expert-budget` ('2GiB' included), and giving both is an error."""
    args = ["bench", "--strategies", "lru", "--hardware", "rtx4090-pcie4", "--prompts", "1", "--max-new-tokens", "4",
            "--cost-shape", "none", "--json"]
    assert main(args + ["--expert-budget", "0.7"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {r["expert_budget"] for r in d["runs"]} == {0.7}
    assert main(args + ["--budgets", "0.6,200KiB"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["expert_budget"] for r in d["runs"]] == [0.6, "200KiB"]
    assert d["runs"][1]["budget_bytes"] == 200 * 1024
    assert main(args + ["--budgets", "0.5", "--expert-budget", "0.7"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(args + ["--budgets", "lots"]) == 2
    assert "--budgets='lots' is not a size" in capsys.readouterr().err


def test_trace_record_export_import_and_bench_on_it(tmp_path, capsys):
    """Routing goes out in an engine's format and comes back as a trace the bench replays: record, export as an
    SGLang response, import with the model's config, bench --trace; a malformed file is a clean error (exit 2)."""
    import numpy as np

    import specter_lab as sl

    rec, out, back = tmp_path / "rec.npz", tmp_path / "routing.json", tmp_path / "back.npz"
    assert main(["trace", "record", "--out", str(rec), "--prompts", "1", "--max-new-tokens", "8", "--k-max", "0"]) == 0
    assert main(["trace", "export", str(rec), "--out", str(out)]) == 0
    assert "routed_experts" in json.loads(out.read_text())["meta_info"]
    config = tmp_path / "config.json"
    sl.load_model("tiny")[0].config.to_json_file(config)
    assert main(["trace", "import", str(out), "--config", str(config), "--out", str(back)]) == 0
    a, b = sl.load_trace(rec).sequences[0], sl.load_trace(back).sequences[0]
    assert np.array_equal(a.prefill, b.prefill) and np.array_equal(a.decode, b.decode)
    capsys.readouterr()
    assert main(["bench", "--trace", str(back), "--budgets", "0.5", "--hardware", "rtx4090-pcie4",
                 "--strategies", "lru,specter"]) == 0
    assert "specter" in capsys.readouterr().out
    out.write_text('{"meta_info": {}}')
    assert main(["trace", "import", str(out), "--config", str(config), "--out", str(back)]) == 2
    assert "meta_info field 'routed_experts'" in capsys.readouterr().err
