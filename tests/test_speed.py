"""``specter-lab bench --speed``'s page and its quick check (studies/speed.py): the figures written are the ones
read back, and a quick run fails only on a figure more than 2x worse than the page's (the measuring itself is the
command's, run by .ci/run after the suite, where the machine is quietest)."""

from specter_lab.studies import speed


def _results(lru=1500.0, live=1.05, ops=1.42, plan=10.0):
    return {"date": "2026-12-06", "machine": "test", "quick": False,
            "replay": [{"trace": t, "strategy": s, "level": lv, "tokens_per_s": lru if s == "lru" else 99.0}
                       for t in speed.TRACES for s in ("lru", "specter") for lv in ("steps", "full")],
            "live": [{"tokens": 100, "plain_s": 1.0, "live_s": live, "ratio": live}],
            "ops": [{"engine": "specter", "ops_per_token": 700.0, "hf_ops_per_token": 500.0, "ratio": ops}],
            "plan": {"cpu_s": plan, "wall_s": plan, "pick": "lru", "candidates": 46, "again_cpu_s": plan / 2,
                     "again_wall_s": plan / 2, "again_pick": "lru"},
            "compare": {"cpu_s": plan / 2, "wall_s": plan / 2, "rows": 48},
            "notebooks": [{"notebook": "01_quickstart.ipynb", "wall_s": 20.0, "slowest": [[3.0, 1, "import torch"]]}]}


def test_the_page_holds_its_figures(tmp_path):
    page = speed.write_page(_results(), tmp_path / "speed.md", before=_results(lru=500.0, plan=25.0))
    text = page.read_text()
    assert "| `lru` | 1,500 (500) |" in text and "01_quickstart.ipynb | 20" in text and "10.0 s" in text
    assert "(48 rows, 4 held-out prompts x 48 tokens): **5.0 s** CPU" in text
    assert "planned again at `expert_budget=0.5`" in text and "**5.0 s** CPU" in text and "(before: 12.5 s CPU)" in text
    assert speed.read_page(page) == _results()


def test_quick_fails_only_on_a_figure_more_than_twice_worse():
    page = _results()
    assert speed.regressions(_results(lru=800.0, live=2.0, ops=2.5, plan=19.0), page) == []  # noise, not 2x
    bad = speed.regressions(_results(lru=700.0, live=2.2, ops=1.4, plan=25.0), page)
    assert len(bad) == 4 + 3  # lru at both levels on both traces, the live view, the planner, the comparison
    assert all("more than 2x worse" in b for b in bad) and not any("aten" in b for b in bad)
