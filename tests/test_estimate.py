"""sl.estimate from a config.json alone: an estimate is a replay of every strategy row on the machine's llama.cpp-class
clock (the same TPOT as sl.replay of its workload), sizes and the VRAM split, the planner's pick by its own rule,
bands around every row, emitted commands, bad input, the synthetic routing's fit to published locality."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.estimator import NOT_A_DEPLOYMENT, estimate
from specter_lab.estimator.lanes import price_token, static_layers
from specter_lab.model.geometry import CONFIG_DIR, geometry_from_config
from specter_lab.records.metrics import later_half_rate
from specter_lab.records.trace import TokenRecord
from specter_lab.run import NOT_CANDIDATES, STRATEGIES, planner_choice
from specter_lab.traces.synthetic import LOCALITY, hot_coverage, lru_hit_rate, synthetic_routing

DATA = Path(__file__).parent / "data"
QWEN3, GPT_OSS = DATA / "qwen3-30b-a3b", DATA / "gpt-oss-20b"
FAST = dict(tokens=16)  # decode tokens replayed per row: enough to test what is priced, quick to run
DSV2 = dict(gpu="rtx3060", vram="8GB", host="ddr4-3200x2", weights="q4_k_m", **FAST)


@pytest.fixture(scope="module")
def dsv2():
    """DeepSeek-V2-Lite at q4_k_m on an 8 GB RTX 3060: about half the experts fit; every kind of row is priced."""
    return estimate("deepseek-v2-lite", **DSV2)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-20b"])
def test_test_configs_are_the_bundled_ones(name):
    bundled = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    assert json.loads((DATA / name / "config.json").read_text()) == bundled


def test_sizes_from_the_config_match_the_model_cards():
    q, g = geometry_from_config(QWEN3), geometry_from_config(GPT_OSS)
    # model cards: Qwen3-30B-A3B 30.5B total / 3.3B active; gpt-oss-20b 21B total / 3.6B active
    assert q.total_params / 1e9 == pytest.approx(30.5, abs=0.1)
    assert (q.active_params + q.embed_params) / 1e9 == pytest.approx(3.3, abs=0.1)
    assert g.total_params / 1e9 == pytest.approx(20.9, abs=0.1) and g.active_params / 1e9 == pytest.approx(3.6, abs=0.1)
    assert (q.moe_layers, q.num_experts, q.top_k) == (48, 128, 8)
    assert (g.moe_layers, g.num_experts, g.top_k) == (24, 32, 4)
    assert g.checkpoint_format == "mxfp4"
    # sliding layers keep 128 tokens: half of gpt-oss's layers stop growing their KV cache (8 kv heads x 64, K + V)
    per = 2 * 2 * 8 * 64
    assert g.kv_bytes(8192) == pytest.approx(12 * per * 8192 + 12 * per * 128)


# ------------------------------------------------------------------------------------------ one way to price

def test_every_strategy_is_a_row_or_not_a_deployment(dsv2):
    """Every row of sl.STRATEGIES is priced, or left out by its role (a replica, a reference) or because it does
    not fit; the planner's own pick is among the rows."""
    priced = set(dsv2.table.strategy)
    assert priced | set(dsv2.not_priced) == set(STRATEGIES)
    for name, why in dsv2.not_priced.items():
        assert STRATEGIES[name].role in NOT_A_DEPLOYMENT or why.startswith("does not fit"), (name, why)
    assert {"pregate_split", "split_lfu", "specter_split", "specter", "static_split", "global_lru"} <= priced
    assert dsv2.pick in priced


def test_every_row_is_sl_replay_of_the_workload_on_the_same_clock(dsv2):
    """The estimate and sl.replay of the same trace on the same clock give the same TPOT (relative 1e-9), for every
    row the estimate priced (the strategies, the resident run, the cache)."""
    rows = list(dsv2.table.strategy)
    assert len(rows) >= 15
    for row in rows:
        (r,) = sl.replay(dsv2.workload.trace, dsv2.replayed_strategy(row), **dsv2.replay_options(row))
        assert r.metrics["tpot_ms"] == pytest.approx(dsv2.row(row).tpot_ms, rel=1e-9), row
        assert later_half_rate(r.trace.tokens) == pytest.approx(dsv2.row(row).later_half_tok_s, rel=1e-9), row
        assert "llama.cpp" in r.metrics["clock"], row


def test_the_pick_is_the_planners_rule_among_its_candidates(dsv2):
    ranked = [(s, t) for s, t in zip(dsv2.table.strategy, dsv2.table.tpot_ms)
              if s in STRATEGIES and s not in NOT_CANDIDATES]
    assert dsv2.pick == ranked[planner_choice(ranked)][0]
    assert f"The planner's pick: {dsv2.pick}" in str(dsv2) and "llama.cpp's best:" in str(dsv2)


def test_choices_put_the_planners_pick_beside_llama_cpps_best_with_what_runs_each(dsv2):
    """Notebook 07's side by side: the planner's pick with its Engine call, llama.cpp's best row with its flags."""
    from specter_lab.estimator.commands import llama_cpp_rows

    c = dsv2.choices().set_index("who")
    assert c.loc["the planner's pick", "strategy"] == dsv2.pick
    assert c.loc["the planner's pick", "run_it"].startswith(f"sl.Engine(model, tok, strategy={dsv2.pick!r}")
    best_ll = llama_cpp_rows(dsv2)[0]
    assert c.loc["llama.cpp's best", "strategy"] == best_ll
    assert c.loc["llama.cpp's best", "run_it"].startswith("llama-server ")
    assert c.loc["llama.cpp's best", "tokens_per_s"] == dsv2.row(best_ll).tokens_per_s
    assert "your flags" not in c.index  # only with placement=


def test_a_row_refused_in_a_pool_worker_is_said_not_raised():
    """Rows replayed in worker processes that do not fit come back as reasons (the refusal crosses the process
    boundary whole), the same as in one process."""
    args = dict(gpu="rtx3060", host="ddr4-3200x2", weights="q4_k_m", ram="8GB", tokens=4)
    pooled, here = estimate("mixtral-8x7b", workers=2, **args), estimate("mixtral-8x7b", workers=1, **args)
    assert any(why.startswith("does not fit") for why in pooled.not_priced.values())
    assert pooled.not_priced == here.not_priced
    assert list(pooled.table.tpot_ms) == list(here.table.tpot_ms)
    # the cache sizing, swept in a worker beside the rows, is the one swept here
    assert pooled._inputs["sizing"] is not None and here._inputs["sizing"] is None
    a, b = pooled.cache_sizing(), here.cache_sizing()
    assert (a.cliff_mib, a.enough_mib, a.budget_mib) == (b.cliff_mib, b.enough_mib, b.budget_mib)
    assert a.sweep.equals(b.sweep) and here.cache_sizing() is b  # computed once


def test_every_row_says_what_runs_it_today(dsv2):
    t = dsv2.table.set_index("strategy")
    assert t.loc["static_split", "runs_as"].startswith("llama.cpp --n-cpu-moe")
    assert t.loc["global_lru", "runs_as"].startswith("llama.cpp --cpu-moe --moe-cache-mib")
    assert t.loc["pregate_split", "runs_as"] == "specter_lab only"
    assert "MODELLED" in t.loc["specter", "placement"]


def test_a_static_placement_is_priced_the_same_by_the_closed_form_and_the_replay(dsv2):
    """For placements that never move an expert, the clock's closed form (estimator/lanes.py: the bands, the
    published rows) is the replay's time."""
    g, sc = dsv2.model, dsv2._inputs["central"]
    slots = dsv2.placements["static_split"]["slots_per_layer"]
    counts = static_layers([s > 0 for s in slots], g.top_k)
    closed = price_token(sc.cost(g), counts, g.top_k, sc.depth).total_ms
    assert closed == pytest.approx(dsv2.row("static_split").tpot_ms, rel=1e-6)
    for ngl in (g.decoder_layers + 1, 13, 0):  # llama.cpp -ngl: every layer, half, none
        (r,) = sl.replay(dsv2.workload.trace, "static_split", expert_budget=1.0, gpu_layers=ngl,
                         **{k: v for k, v in dsv2.replay_options().items()})
        closed = price_token(sc.cost(g, ngl), static_layers([True] * g.moe_layers, g.top_k), g.top_k, sc.depth)
        assert closed.total_ms == pytest.approx(r.metrics["tpot_ms"], rel=1e-6), ngl


def test_qwen3_on_a_48gb_card_is_resident_with_plain_ngl():
    e = estimate(QWEN3, gpu="w7800", host="ddr5-5600x2", weights="q4_k_m", **FAST)
    assert list(e.table.strategy) == ["resident"] and e.best == "resident"
    cmd = e.llama_cpp("qwen3-30b-a3b-q4_k_m.gguf")
    assert "-ngl 99" in cmd and "--n-cpu-moe" not in cmd and "--moe-cache-mib" not in cmd
    assert "synthetic routing matched to" in " ".join(e.assumptions) and "Qwen3-30B-A3B" in e.routing_label
    assert e.cache_sizing() is None


def test_the_split_emits_the_layers_it_keeps_on_the_host(dsv2):
    slots = dsv2.placements["static_split"]["slots_per_layer"]
    n_host = sum(1 for s in slots if s == 0)
    assert 0 < n_host < dsv2.model.moe_layers and all(s == 0 for s in slots[:n_host])  # the first layers
    cmd = dsv2.llama_cpp()
    if "--moe-cache-mib" not in cmd.splitlines()[0]:
        # DeepSeek's dense block 0 counts in llama.cpp's --n-cpu-moe: n expert layers on the host need n + 1
        assert f"--n-cpu-moe {n_host + 1}" in cmd
        listed = re.search(r'blk\\\.\(([0-9|]+)\)', cmd).group(1).split("|")
        assert listed == [str(i + 1) for i in range(n_host)]


def test_more_vram_is_never_slower_for_a_static_split():
    tps = [estimate("deepseek-v2-lite", gpu="rtx3060", vram=v, host="ddr4-3200x2", weights="q4_k_m",
                    **FAST).row("static_split").tokens_per_s for v in ("6GB", "8GB")]
    assert tps[0] < tps[1]


def test_weight_precision_is_a_cost_input():
    lo = estimate("deepseek-v2-lite", gpu="rtx4090", host="ddr5-5600x2", weights="q4_k_m", **FAST)
    hi = estimate("deepseek-v2-lite", gpu="rtx4090", host="ddr5-5600x2", weights="q8_0", **FAST)
    assert lo.table.tokens_per_s.iloc[0] > hi.table.tokens_per_s.iloc[0]
    assert "q8_0" in hi.precision.label


def test_a_card_size_is_binary_and_said():
    e = estimate("deepseek-v2-lite", gpu="rtx3060", vram="12GB", host="ddr4-3200x2", weights="q4_k_m", **FAST)
    assert e.machine.vram == 12 * 2**30 and "12.00 GiB" in str(e)  # an RTX 3060 12GB holds 12,288 MiB
    assert estimate("deepseek-v2-lite", gpu="rtx3060", vram=None, weights="q4_k_m", **FAST).machine.vram == 12 * 2**30


def test_a_routing_trace_is_replayed(tmp_path):
    g = geometry_from_config("gpt-oss-20b")
    rng = np.random.default_rng(0)
    ids = np.stack([np.stack([rng.permutation(g.num_experts)[:g.top_k] for _ in range(g.moe_layers)])
                    for _ in range(120)])
    e = estimate("gpt-oss-20b", gpu="rtx2080", vram="8GiB", host="i9-10900x", trace=ids)
    assert "imported routing array" in e.routing_label
    with pytest.raises(ValueError, match="trace: expected expert ids"):
        estimate("gpt-oss-20b", gpu="rtx2080", trace=ids[:, :3])
    t = sl.import_routing(ids, json.loads((CONFIG_DIR / "gpt-oss-20b.json").read_text()),
                          [(0, 64, "prefill"), (64, 56, "decode")], k_max=0)
    t.save(tmp_path / "t.npz")
    r = estimate("gpt-oss-20b", gpu="rtx2080", vram="8GiB", host="i9-10900x", trace=tmp_path / "t.npz")
    assert r.routing_label.startswith("recorded routing trace")
    assert not r.table.speculative.any() and "specter" in r.not_priced  # no draft chains in that trace


@pytest.mark.parametrize("key,shape", [("qwen3_moe", (128, 8)), ("deepseek_v2", (64, 6))])
def test_synthetic_routing_reproduces_the_published_lru_curve(key, shape):
    loc = LOCALITY[key]
    routing = synthetic_routing(4, *shape, 512, loc, seed=3)
    for fraction, published in loc.lru_points.items():
        assert lru_hit_rate(routing, round(fraction * shape[0])) == pytest.approx(published, abs=0.06)
    for fraction, published in loc.hot_points.items():  # a pinned hot set serves little: the hot set moves
        assert hot_coverage(routing, round(fraction * shape[0])) == pytest.approx(published, abs=0.06)


def test_synthetic_routing_is_drawn_once_and_handed_out_as_copies():
    loc = LOCALITY["qwen3_moe"]
    first = synthetic_routing(2, 16, 2, 64, loc, seed=5)
    expected = first.copy()
    first[:] = 0
    again = synthetic_routing(2, 16, 2, 64, loc, seed=5)
    assert np.array_equal(again, expected) and again.flags.writeable
    assert not np.array_equal(synthetic_routing(2, 16, 2, 64, loc, seed=6), expected)
    assert not np.array_equal(synthetic_routing(2, 16, 2, 64, LOCALITY["deepseek_v2"], seed=5), expected)


def _reference_draw(num_layers, num_experts, top_k, tokens, loc, seed):
    """The synthetic draw written plainly, with numpy's own ``choice`` and a draw per kept expert."""
    rng = np.random.default_rng(seed)
    out = np.empty((tokens, num_layers, top_k), dtype=np.int64)
    base = (np.arange(num_experts) + 1.0) ** -loc.skew
    base = base / base.sum()
    for layer in range(num_layers):
        rank = rng.permutation(num_experts)
        prev = []
        for t in range(tokens):
            for _ in range(rng.binomial(num_experts, loc.drift)):
                i, j = rng.integers(num_experts, size=2)
                rank[i], rank[j] = rank[j], rank[i]
            keep = [e for e in prev if rng.random() < loc.stick]
            w = base[rank]
            w[keep] = 0.0
            fresh = rng.choice(num_experts, size=top_k - len(keep), replace=False, p=w / w.sum())
            prev = keep + [int(e) for e in fresh]
            out[t, layer] = prev
    return out


@pytest.mark.parametrize("key,shape", [("qwen3_moe", (128, 8)), ("deepseek_v2", (64, 6)), ("mixtral", (8, 2))])
def test_the_synthetic_draw_is_numpys_sampler_draw_for_draw(key, shape):
    """The draw's own sampler (no argument checks) gives numpy's ``choice`` routing, id for id: an estimate's
    routing did not move when it got faster."""
    loc = LOCALITY[key]
    assert np.array_equal(synthetic_routing(3, *shape, 96, loc, seed=11), _reference_draw(3, *shape, 96, loc, 11))


# ------------------------------------------------------------------------------------------ bands

def test_every_row_has_a_band_around_it_and_names_what_dominates(dsv2):
    t = dsv2.table
    assert (t.low_tok_s <= t.tokens_per_s * (1 + 1e-9)).all() and (t.tokens_per_s <= t.high_tok_s * (1 + 1e-9)).all()
    assert set(t.dominant_unknown) <= set(dsv2.unknowns) and t.dominant_unknown.str.len().gt(0).all()
    assert dsv2.row("specter").dominant_unknown == "draft acceptance"


def test_a_longer_generation_is_an_unknown_read_from_the_replays_later_half():
    """A placement chosen from the prompt goes stale as the routing drifts: fiddler's later half runs slower than
    its whole replay, and its band reaches down to it; a placement by whole layers does not move."""
    e = estimate(QWEN3, gpu="rtx3060", vram="12GB", host="ddr4-3200x2", weights="q4_k_m", tokens=64)
    assert f"than the {e.workload.trace.tokens} tokens replayed" in e.unknowns["decode length"]
    f, s = e.row("fiddler"), e.row("static_split")
    assert f.later_half_tok_s < 0.95 * f.tokens_per_s
    assert s.later_half_tok_s == pytest.approx(s.tokens_per_s, rel=1e-6)
    t = e.table
    assert (t.low_tok_s <= t.later_half_tok_s * (1 + 1e-9)).all() and (t.later_half_tok_s <= t.high_tok_s * (1 + 1e-9)).all()


def test_the_later_half_counts_a_window_that_crosses_the_middle_in_the_half_it_ends_in():
    rec = lambda t, ok=True: TokenRecord(0, 0, 0, "decode", ok, t)
    # the prefill's token at 0 ms, then windows committing 3 tokens at 30 ms, 3 at 60 ms, 1 at 70 ms
    tokens = [rec(0.0)] + [rec(30.0)] * 3 + [rec(60.0)] * 3 + [rec(55.0, ok=False)] + [rec(70.0)]
    # 8 committed: the first half ends at the 4th (30 ms); 4 tokens after it in 40 ms
    assert later_half_rate(tokens) == pytest.approx(1e3 * 4 / 40.0)
    assert np.isnan(later_half_rate(tokens[:2]))


def test_a_host_not_given_is_said_and_widens_the_band():
    kw = dict(gpu="rtx3060", vram="8GB", weights="q4_k_m", depth=0, **FAST)
    given = estimate("deepseek-v2-lite", host="ddr5-5600x2", **kw)
    unknown = estimate("deepseek-v2-lite", **kw)
    assert given.machine.host is not None and unknown.machine.host is None
    assert any("HOST NOT GIVEN" in a for a in unknown.assumptions) and "Host not given" in str(unknown)
    width = lambda e: e.row("static_split").high_tok_s / e.row("static_split").low_tok_s
    assert width(unknown) > width(given)
    assert unknown.row("static_split").dominant_unknown == "host DRAM bandwidth"


def test_depth_prices_the_kv_cache_and_when_unknown_bands_it():
    kw = dict(gpu="rtx5080", host="ddr5-6000x2", context=32768, **FAST)
    deep = estimate(GPT_OSS, depth=32768, **kw)
    empty = estimate(GPT_OSS, depth=0, **kw)
    unknown = estimate(GPT_OSS, **kw)
    assert deep.table.tokens_per_s.iloc[0] < empty.table.tokens_per_s.iloc[0]
    assert "context depth" in unknown.unknowns and "context depth" not in deep.unknowns
    assert unknown.table.high_tok_s.iloc[0] >= empty.table.tokens_per_s.iloc[0] * 0.99


@pytest.mark.parametrize("kwargs,match", [
    ({"context": -5}, r"context=-5: .*integer >= 1"),
    ({"context": 4096, "depth": 5000}, r"depth=5000: .*\[0, context=4096\]"),
    ({"gpu": "rtx3060", "vram": "16GB"}, r"vram=.*more than the GeForce RTX 3060 12GB has .*'12GB'"),
    ({"gpu": "rtx4060", "vram": "1GiB", "weights": "bf16"}, r"vram=1\.00 GiB is smaller than .*dense weights"),
    ({"host": "ddr5-5700x2"}, r"host='ddr5-5700x2': .*nearest \['ddr5-5600x2'"),
    ({"gpu": "rtx 3060 tie"}, r"gpu='rtx 3060 tie' .*closest \['rtx3060"),
    ({"gpu": "rtx4070", "vram": 8}, r"vram=8 reads as 8 bytes, less than a MiB: .*unit is bytes.*'8GiB'"),
    ({"ram": "64"}, r"ram='64' reads as 64 bytes, less than a MiB: .*'64GiB'"),
    ({"disk": 3.5}, r"disk=3.5 reads as 3.5 bytes/s, less than a MiB: .*'3.5GB/s'"),
    ({"tokens": 1}, r"tokens=1: decode tokens"),
])
def test_bad_input_names_the_argument_and_the_nearest_valid_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate(QWEN3, **kwargs)


# ------------------------------------------------------------------------------------------ the user's flags

def test_the_users_own_flags_are_priced_beside_the_best(dsv2, capsys):
    from specter_lab.cli import main

    slots = dsv2.placements["static_split"]["slots_per_layer"]
    n = sum(1 for s in slots if s == 0) + 1  # llama.cpp counts DeepSeek's dense block 0
    same = estimate("deepseek-v2-lite", placement=f"--n-cpu-moe {n}", **DSV2)
    assert same.row("yours").tpot_ms == pytest.approx(same.row("static_split").tpot_ms, rel=1e-9)
    worse = estimate("deepseek-v2-lite", placement="--cpu-moe", **DSV2)
    assert worse.row("yours").tokens_per_s < worse.row("static_split").tokens_per_s
    assert worse.best != "yours" and "by changing it" in str(worse)
    cached = estimate("deepseek-v2-lite", placement="--cpu-moe --moe-cache-mib 3000", **DSV2)
    assert cached.row("yours").hit_rate > 0
    ngl = estimate("deepseek-v2-lite", placement="-ngl 14", **DSV2)  # the first 13 decoder layers on the host
    assert ngl.row("yours").tokens_per_s < same.row("yours").tokens_per_s
    assert main(["estimate", "--config", "deepseek-v2-lite", "--gpu", "rtx3060", "--vram", "8GB", "--host",
                 "ddr4-3200x2", "--weights", "q4_k_m", f"--placement=--n-cpu-moe {n}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(r["strategy"] == "yours" for r in out["table"]) and out["cache_sizing"]["cliff_mib"] > 0


def test_flags_that_do_not_fit_are_refused_with_the_numbers_and_the_nearest_that_fits():
    with pytest.raises(ValueError, match=r"placement='--n-cpu-moe 0' puts [0-9.]+ GiB in VRAM .*more than the 8\.00 "
                                         r"GiB the card has: the nearest that fits .*--n-cpu-moe \d+"):
        estimate("deepseek-v2-lite", placement="--n-cpu-moe 0", **DSV2)


def test_the_emitted_command_read_back_prices_the_same_placement(dsv2):
    line = next(l for l in dsv2.llama_cpp().splitlines() if "--n-cpu-moe" in l)
    flags = line.split("llama-server", 1)[1]
    again = estimate("deepseek-v2-lite", placement="llama-server" + flags, **DSV2)
    assert again.row("yours").tpot_ms == pytest.approx(again.row("static_split").tpot_ms, rel=1e-9)


# ------------------------------------------------------------------------------------------ what it prints

def test_cli_estimate_prints_the_command_and_fits_the_terminal(capsys, monkeypatch):
    from specter_lab.cli import main

    monkeypatch.setenv("COLUMNS", "120")
    args = ["estimate", "--config", "deepseek-v2-lite", "--gpu", "rtx3060", "--vram", "8GB", "--host", "ddr4-3200x2",
            "--weights", "q4_k_m", "--gguf", "dsv2.gguf"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "llama-server -m dsv2.gguf -ngl 99" in out and "The planner's pick:" in out
    table = out[out.index("Decode, modelled"):out.index("Fastest:")].splitlines()[1:-1]
    assert table and max(len(line) for line in table) <= 120  # every row on one line of a 120-column terminal
    assert main(args + ["--format", "csv"]) == 0
    csv = capsys.readouterr().out.splitlines()
    assert csv[0].startswith("strategy,tokens_per_s") and len(csv) >= 15
    assert main(args + ["--wide"]) == 0
    wide = capsys.readouterr().out
    wide_table = wide[wide.index("Decode, modelled"):wide.index("Fastest:")].splitlines()[1:-1]
    assert max(len(line) for line in wide_table) <= 120 and "widest" in wide  # more columns, still fitted
    assert main(["estimate", "--config", str(GPT_OSS), "--gpu", "gtx9"]) == 2
    assert "gpu='gtx9'" in capsys.readouterr().err


def test_emitted_engine_call_names_a_profile_the_engine_takes(dsv2, family_models):
    from specter_lab.pricing.profiles import get_profile

    call = dsv2.engine_call()
    hardware = re.search(r"hardware='([^']+)'", call).group(1)
    p = get_profile(hardware)
    assert p.execution == "llama.cpp" and p.cpu_mem_bandwidth == pytest.approx(dsv2.machine.host.dram_delivered)
    strategy = re.search(r"strategy='([^']+)'", call).group(1)
    weights = re.search(r"weights='([^']+)'", call).group(1)
    r = sl.Engine(family_models["mixtral"], None, strategy, expert_budget=0.5, hardware=hardware,
                  weights=weights).generate([1, 2, 3], max_new_tokens=3)
    assert len(r.token_ids) == 3 and "llama.cpp" in r.metrics["clock"]


def test_the_cache_cliff_is_one_token_of_every_layer(dsv2):
    s = dsv2.cache_sizing()
    g, b = dsv2.model, dsv2.budget
    assert s.token_cycle_mib == pytest.approx(g.moe_layers * g.top_k * b.expert_bytes / 2**20)
    below = s.sweep[s.sweep.cache_mib < s.cliff_mib]
    assert len(below) and (below.hit_rate < 0.01).all()  # sequential flooding: no hits at all
    assert s.cliff_mib <= s.token_cycle_mib * 1.001 and s.cliff_mib <= s.enough_mib
    assert "--moe-cache-mib" in s.command() and "hits 0 %" in str(dsv2)


def test_prefill_is_a_replay_of_the_prompt(dsv2):
    p = dsv2.prefill(1024).set_index("strategy")
    assert set(p.index) == set(dsv2.table.strategy)
    # fewer experts in VRAM, more bytes copied per micro-batch: the split (half the layers on the host) is slower
    # to first token than a cache holding more
    assert (p.ttft_s > 0).all() and p.loc["on_demand", "ttft_s"] >= p.loc["lru", "ttft_s"]
    with pytest.raises(ValueError, match="prompt=0"):
        dsv2.prefill(0)
    s = dsv2.summary(prompt=512)
    assert s["best"] == dsv2.best and s["pick"] == dsv2.pick and s["prefill"] is not None


def test_speculative_rows_use_the_modelled_draft_narrower_than_the_experts(dsv2):
    from specter_lab.traces.importing import MEASURED_DRAFT

    spec = dsv2.table[dsv2.table.speculative]
    assert len(spec) >= 4
    bits = dsv2.workload.draft_bits
    assert bits < 4.85 - 0.25  # q4_k_m experts: an int4-g64 draft (4.25 bits) is no narrower; int3 or int2
    assert (spec.acceptance.dropna() > 0).all() and MEASURED_DRAFT[bits].acceptance > 0
    assert any("MODELLED" in a for a in dsv2.assumptions) and "draft acceptance" in dsv2.unknowns


# ------------------------------------------------------------------------------------------ the cards people own

def test_amd_intel_and_apple_cards_are_named_and_priced_with_their_backend_said():
    amd = estimate("qwen3-30b-a3b", gpu="rx7900xt", host="ddr5-6000x2", weights="q4_k_m", **FAST)
    assert amd.machine.card.vendor == "amd" and amd.machine.backend_name == "rocm" and amd.machine.vram == 20 * 2**30
    assert "backend efficiency" in amd.unknowns and "rocm" in amd.unknowns["backend efficiency"]
    intel = estimate("gpt-oss-20b", gpu="arc b580", host="ddr5-6000x2", **FAST)
    assert intel.machine.card.key == "arcb580"
    assert "no measurement of its kernels" in intel.unknowns["backend efficiency"]  # never silently borrowed
    mac = estimate("qwen3-30b-a3b", gpu="m4 pro", vram=None, weights="q4_k_m", **FAST)
    assert list(mac.table.strategy) == ["resident"] and "unified memory" in mac.machine.label
    with pytest.raises(ValueError, match=r"does not fit the GPU's share of the Apple M4 Pro .*unified memory"):
        estimate("mixtral-8x7b", gpu="m4 pro", weights="q4_k_m", **FAST)
