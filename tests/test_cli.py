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
