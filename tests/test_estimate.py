"""sl.estimate from a config.json alone: sizes, VRAM budget, placements, emitted commands, bad input, the synthetic
routing's fit to published locality, weight precision as a cost input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from specter_lab.estimate import estimate
from specter_lab.model.geometry import CONFIG_DIR, geometry_from_config
from specter_lab.pricing.precision import get_precision
from specter_lab.traces.synthetic import LOCALITY, hot_coverage, lru_hit_rate, synthetic_routing

DATA = Path(__file__).parent / "data"
QWEN3, GPT_OSS = DATA / "qwen3-30b-a3b", DATA / "gpt-oss-20b"


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


def test_qwen3_on_a_24gb_card_is_resident_with_plain_ngl():
    e = estimate(QWEN3, gpu="rtx4090", vram="24GB", host="i9-10900x", weights="q4_k_m")
    assert e.best == "resident"
    cmd = e.llama_cpp("qwen3-30b-a3b-q4_k_m.gguf")
    assert "-ngl 99" in cmd and "--n-cpu-moe" not in cmd and "--moe-cache-mib" not in cmd
    assert "synthetic routing matched to" in " ".join(e.assumptions) and "Qwen3-30B-A3B" in e.routing_label


def test_qwen3_on_an_8gb_card_splits_and_emits_the_layers():
    e = estimate(QWEN3, gpu="rtx2080", vram="8GiB", host="i9-10900x", weights="q4_k_m")
    split = e.placements["static_split"]
    assert 0 < split["layers_on_gpu"] < 48 and split["n_cpu_moe"] == 48 - split["layers_on_gpu"]
    cmd = e.llama_cpp()
    llama_rows = e.table[e.table.strategy.isin(["static_split", "global_lru"])]
    if llama_rows.iloc[0].strategy == "static_split":
        assert f"--n-cpu-moe {split['n_cpu_moe']}" in cmd
        listed = re.search(r'blk\\\.\(([0-9|]+)\)', cmd).group(1).split("|")
        assert listed == [str(i) for i in range(split["n_cpu_moe"])]
    else:  # the cache pays: its flags, and the split for a llama.cpp without the cache
        assert "--moe-cache-mib" in cmd and f"--n-cpu-moe {split['n_cpu_moe']}" in cmd
    assert "sl.Engine(model, tok, strategy=" in e.engine_call()
    text = str(e)
    assert "Placement it implies" in text and "modelled, not measured" in text


def test_gpt_oss_split_follows_the_dense_width():
    # the VRAM rule: a narrower dense part (q8_0 against the checkpoint's bf16) leaves room for more expert layers
    bf16 = estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", host="i9-10900x")
    q8 = estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", host="i9-10900x", weights="mxfp4+q8_0")
    assert bf16.precision.dense.name == "bf16"  # the checkpoint's own format (config quantization_config)
    assert q8.placements["static_split"]["n_cpu_moe"] < bf16.placements["static_split"]["n_cpu_moe"] < 24


def test_more_vram_is_never_slower_for_a_static_split():
    speeds = [estimate(QWEN3, gpu="rtx4090", vram=v, weights="q4_k_m", host="i5-7600k").row("static_split").tokens_per_s
              for v in ("8GiB", "12GiB", "16GiB")]
    assert speeds == sorted(speeds) and speeds[0] < speeds[-1]


def test_weight_precision_is_a_cost_input():
    bf16, q4 = get_precision("bf16"), get_precision("q4_k_m")
    assert q4.experts.bytes_per_weight < bf16.experts.bytes_per_weight
    assert get_precision("mxfp4").dense.name == "bf16" and get_precision("mxfp4+q8_0").dense.name == "q8_0"
    a = estimate(QWEN3, gpu="rtx4090", vram="16GiB", weights="q8_0", host="i9-10900x")
    b = estimate(QWEN3, gpu="rtx4090", vram="16GiB", weights="q4_k_m", host="i9-10900x")
    assert b.budget.experts / b.budget.expert_bytes > a.budget.experts / a.budget.expert_bytes  # more experts fit
    assert b.row("static_split").tokens_per_s > a.row("static_split").tokens_per_s


def test_bad_input_names_the_argument_and_what_would_fit():
    dense = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 128}
    with pytest.raises(ValueError, match=r"config: .*not a mixture-of-experts"):
        estimate(dense)
    with pytest.raises(ValueError, match=r"gpu='rtx9999' .*closest \["):
        estimate(QWEN3, gpu="rtx9999")
    with pytest.raises(ValueError, match=r"vram=2\.50 GiB .*needs at least 3\.3. GiB.*weights=.q8_0."):
        estimate(QWEN3, gpu="rtx4090", vram="2.5GiB", weights="bf16")
    with pytest.raises(ValueError, match="weights='q5'"):
        estimate(QWEN3, weights="q5")
    with pytest.raises(ValueError, match="host='pentium'"):
        estimate(QWEN3, host="pentium")


def test_trace_hook_replays_a_given_routing():
    g = geometry_from_config(GPT_OSS)
    rng = np.random.default_rng(0)
    sticky = np.repeat(rng.permuted(np.tile(np.arange(32), (24, 1)), axis=1)[None, :, :4], 200, axis=0)
    e = estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", trace=sticky)
    assert e.routing_label == "recorded routing trace"
    assert e.row("lru").hit_rate == pytest.approx(1.0)  # the same 4 experts every token: every lookup hits
    with pytest.raises(ValueError, match="trace: expected expert ids"):
        estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", trace=sticky[:, :3])
    assert g.moe_layers == 24


def test_a_routing_trace_is_replayed(tmp_path):
    from specter_lab.traces.trace_file import RoutedSequence, RoutingTrace

    rng = np.random.default_rng(1)
    routes = lambda n: np.stack([np.stack([rng.permutation(32)[:4] for _ in range(24)]) for _ in range(n)])
    seqs = [RoutedSequence(prompt=np.arange(20), tokens=np.arange(100), prefill=routes(20), decode=routes(99))
            for _ in range(2)]
    trace = RoutingTrace(config=json.loads((GPT_OSS / "config.json").read_text()), sequences=seqs,
                         source="test: uniform routing")
    e = estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", trace=trace)
    assert "recorded routing trace (test: uniform routing, 200 tokens)" in e.routing_label
    # uniform routing has no locality: an LRU of 17 of 32 experts hits about 17/32 (the synthetic curve is higher)
    assert e.row("lru").hit_rate == pytest.approx(17 / 32, abs=0.06)
    assert estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", trace=trace.save(tmp_path / "t.npz")).row(
        "lru").hit_rate == pytest.approx(e.row("lru").hit_rate)


@pytest.mark.parametrize("key,shape", [("qwen3_moe", (128, 8)), ("deepseek_v2", (64, 6))])
def test_synthetic_routing_reproduces_the_published_lru_curve(key, shape):
    loc = LOCALITY[key]
    routing = synthetic_routing(4, *shape, 512, loc, seed=3)
    for fraction, published in loc.lru_points.items():
        assert lru_hit_rate(routing, round(fraction * shape[0])) == pytest.approx(published, abs=0.06)
    for fraction, published in loc.hot_points.items():  # a pinned hot set serves little: the hot set moves
        assert hot_coverage(routing, round(fraction * shape[0])) == pytest.approx(published, abs=0.06)


def test_synthetic_routing_is_drawn_once_and_handed_out_as_copies():
    """The draw is cached per process (an explorer re-estimates the same model for every GPU): a caller that writes
    into its routing must not change the next caller's, and another seed or locality is another draw."""
    loc = LOCALITY["qwen3_moe"]
    first = synthetic_routing(2, 16, 2, 64, loc, seed=5)
    expected = first.copy()
    first[:] = 0
    again = synthetic_routing(2, 16, 2, 64, loc, seed=5)
    assert np.array_equal(again, expected) and again.flags.writeable
    assert not np.array_equal(synthetic_routing(2, 16, 2, 64, loc, seed=6), expected)
    assert not np.array_equal(synthetic_routing(2, 16, 2, 64, LOCALITY["deepseek_v2"], seed=5), expected)


def test_cli_estimate_prints_the_command(capsys):
    from specter_lab.cli import main

    e = estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", host="i9-10900x")
    assert main(["estimate", "--config", str(GPT_OSS), "--gpu", "rtx2080", "--vram", "8GiB", "--host", "i9-10900x",
                 "--gguf", "gpt-oss-20b-mxfp4.gguf"]) == 0
    out = capsys.readouterr().out
    assert "llama-server -m gpt-oss-20b-mxfp4.gguf -ngl 99" in out
    assert f"--n-cpu-moe {e.placements['static_split']['n_cpu_moe']}" in out or "--moe-cache-mib" in out
    assert main(["estimate", "--config", str(GPT_OSS), "--gpu", "gtx9"]) == 2
    assert "gpu='gtx9'" in capsys.readouterr().err


def test_emitted_engine_call_names_a_profile_the_engine_takes(family_models):
    import specter_lab as sl
    from specter_lab.pricing.profiles import HOSTS, get_profile

    e = estimate(GPT_OSS, gpu="rtx2080", vram="8GiB", host="i9-10900x")
    hardware = re.search(r"hardware='([^']+)'", e.engine_call()).group(1)
    p = get_profile(hardware)
    assert p.execution == "compiled" and p.cpu_mem_bandwidth == HOSTS["i9-10900x-ddr4-2933"].dram_delivered
    strategy = re.search(r"strategy='([^']+)'", e.engine_call()).group(1)
    r = sl.Engine(family_models["gpt_oss"], None, strategy, expert_budget=0.5, hardware=hardware).generate(
        [1, 2, 3], max_new_tokens=3)
    assert len(r.token_ids) == 3 and hardware.split("@")[0] in r.metrics["clock"]


def test_cli_estimate_json(capsys):
    from specter_lab.cli import main

    assert main(["estimate", "--config", "qwen3-30b-a3b", "--gpu", "gtx1060", "--vram", "6GiB", "--host", "i5-7600k",
                 "--weights", "q2_k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"] == out["table"][0]["strategy"] and "llama-server" in out["llama_cpp"]
    assert any("synthetic routing matched to" in a for a in out["assumptions"])


def test_replays_count_where_experts_run():
    from specter_lab.estimate import replay

    rng = np.random.default_rng(0)
    routing = np.stack([rng.permutation(16)[:2] for _ in range(2 * 100)]).reshape(100, 2, 2)
    plain, shared = replay.global_lru(routing, 8, 20), replay.global_lru(routing, 8, 20, cpu_share=0.5)
    per_token = lambda c: (c.device + c.copied + c.host).sum()
    assert per_token(plain) == per_token(shared) == pytest.approx(4.0)  # every routed expert runs somewhere
    assert plain.host_per_token == 0 and shared.host_per_token > 0
    # every other miss goes to the host (and is not cached)
    share = shared.host_per_token / (shared.host_per_token + shared.copies_per_token)
    assert share == pytest.approx(0.5, abs=0.05)
    static = replay.static_layers([True, False], 2)
    assert list(static.device) == [2, 0] and list(static.host) == [0, 2] and list(static.host_trips) == [0, 1]
    pinned = replay.hot_set(routing, 16, 20)  # every expert pinned: nothing left for the host
    assert pinned.hit_rate == 1.0 and pinned.host_per_token == 0


def test_any_catalog_gpu_with_a_host_described_by_its_memory(capsys):
    from specter_lab.cli import main

    e = estimate(QWEN3, gpu="rtx3060", vram="12GB", host="ddr4-3200x2", weights="q4_k_m")
    assert e.machine.card.key == "rtx3060-12gb" and e.machine.vram_bandwidth == pytest.approx(360e9)
    assert e.machine.host.name == "ddr4-3200x2"
    assert main(["estimate", "--config", "qwen3-30b-a3b", "--gpu", "rtx3060", "--vram", "12GB", "--host",
                 "ddr4-3200x2", "--weights", "q4_k_m"]) == 0
    out = capsys.readouterr().out
    assert "GeForce RTX 3060 12GB" in out and "Band for" in out and "dominates" in out
    # the 8 GB variant: less bandwidth, fewer experts on the GPU
    small = estimate(QWEN3, gpu="rtx3060", vram="8GB", host="ddr4-3200x2", weights="q4_k_m")
    assert small.machine.card.key == "rtx3060-8gb"
    assert small.row("static_split").tokens_per_s < e.row("static_split").tokens_per_s


def test_every_row_has_a_band_around_it_and_names_what_dominates():
    e = estimate(QWEN3, gpu="rtx4060ti", vram="16GB", host="ddr5-5600x2", weights="q4_k_m")
    t = e.table
    assert (t.low_tok_s <= t.tokens_per_s).all() and (t.tokens_per_s <= t.high_tok_s).all()
    assert set(t.dominant_unknown) <= set(e.unknowns) and t.dominant_unknown.str.len().gt(0).all()
    host_bound = e.row("static_split")
    assert host_bound.dominant_unknown.startswith("host")  # the split's host lane is what is least known


def test_a_host_not_given_is_said_and_widens_the_band():
    given = estimate(QWEN3, gpu="rtx4070", host="ddr5-5600x2", weights="q4_k_m", depth=0)
    unknown = estimate(QWEN3, gpu="rtx4070", weights="q4_k_m", depth=0)
    assert given.machine.host is not None and unknown.machine.host is None
    assert any("HOST NOT GIVEN" in a for a in unknown.assumptions) and "Host not given" in str(unknown)
    width = lambda e: e.row("static_split").high_tok_s / e.row("static_split").low_tok_s
    assert width(unknown) > width(given)
    assert unknown.row("static_split").dominant_unknown == "host DRAM bandwidth"


def test_depth_prices_the_kv_cache_and_when_unknown_bands_it():
    deep = estimate(GPT_OSS, gpu="rtx5080", host="ddr5-6000x2", context=32768, depth=32768)
    empty = estimate(GPT_OSS, gpu="rtx5080", host="ddr5-6000x2", context=32768, depth=0)
    unknown = estimate(GPT_OSS, gpu="rtx5080", host="ddr5-6000x2", context=32768)
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
])
def test_bad_input_names_the_argument_and_the_nearest_valid_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate(QWEN3, **kwargs)


def test_the_users_own_flags_are_priced_beside_the_best(capsys):
    from specter_lab.cli import main
    from specter_lab.estimate.placement import parse_placement

    ds = geometry_from_config("deepseek-v2-lite")  # one dense first block: llama.cpp counts blocks, not MoE layers
    assert sum(parse_placement("-ngl 99 --n-cpu-moe 5", ds).host_layers) == 4
    assert all(parse_placement("--cpu-moe", ds).host_layers)
    ot = parse_placement("-ot 'blk\\.(1|2)\\.ffn_.*_exps\\.=CPU'", ds).host_layers
    assert [i for i, h in enumerate(ot) if h] == [0, 1]
    with pytest.raises(ValueError, match="placement=.*--n-cpu-moe takes a number"):
        parse_placement("--n-cpu-moe many", ds)

    base = estimate(QWEN3, gpu="rtx4070", host="ddr5-6000x2", weights="q4_k_m")
    n = base.placements["static_split"]["n_cpu_moe"]
    same = estimate(QWEN3, gpu="rtx4070", host="ddr5-6000x2", weights="q4_k_m", placement=f"--n-cpu-moe {n}")
    assert same.row("yours").tokens_per_s == pytest.approx(same.row("static_split").tokens_per_s)
    worse = estimate(QWEN3, gpu="rtx4070", host="ddr5-6000x2", weights="q4_k_m", placement="--cpu-moe")
    assert worse.row("yours").tokens_per_s < worse.row("static_split").tokens_per_s
    assert worse.best != "yours" and "by changing it" in str(worse)
    cached = estimate(QWEN3, gpu="rtx4070", host="ddr5-6000x2", weights="q4_k_m",
                      placement="--cpu-moe --moe-cache-mib 6000")
    assert cached.row("yours").hit_rate > 0 and cached.placements["yours"]["fits"]
    too_big = estimate(QWEN3, gpu="rtx4070", host="ddr5-6000x2", weights="q4_k_m", placement="--n-cpu-moe 0")
    assert not too_big.placements["yours"]["fits"] and "DOES NOT FIT" in too_big.row("yours").placement
    assert main(["estimate", "--config", "qwen3-30b-a3b", "--gpu", "rtx4070", "--host", "ddr5-6000x2",
                 "--weights", "q4_k_m", "--placement=--n-cpu-moe 30", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(r["strategy"] == "yours" for r in out["table"]) and out["cache_sizing"]["cliff_mib"] > 0


def test_the_cache_cliff_is_one_token_of_every_layer():
    e = estimate(QWEN3, gpu="rtx4060", host="ddr4-3200x2", weights="q4_k_m")
    s = e.cache_sizing()
    g, b = e.model, e.budget
    assert s.token_cycle_mib == pytest.approx(g.moe_layers * g.top_k * b.expert_bytes / 2**20)
    below = s.sweep[s.sweep.cache_mib < s.cliff_mib]
    assert len(below) and (below.hit_rate < 0.01).all()  # sequential flooding: no hits at all
    assert s.cliff_mib <= s.token_cycle_mib * 1.001 and s.cliff_mib <= s.enough_mib
    assert (s.sweep[s.sweep.cache_mib >= s.token_cycle_mib].hit_rate > 0).all()
    assert "--moe-cache-mib" in s.command() and "hits 0 %" in str(e)
    assert estimate(QWEN3, gpu="rtx4090", vram="24GB", weights="q4_k_m").cache_sizing() is None  # all fit


def test_prefill_prices_what_each_placement_moves_per_micro_batch(capsys):
    from specter_lab.cli import main

    w = estimate(QWEN3, gpu="w7800", weights="q4_k_m", host="ddr5-5600x2", depth=0).prefill(512)
    lo, hi = (float(x) for x in w.set_index("strategy").loc["resident", "ttft_band_s"].split("-"))
    assert lo <= 512 / 2254 and 512 / 3186 <= hi  # llama.cpp #24546: W7800 pp512 2254-3186 tok/s (a check)
    e = estimate(QWEN3, gpu="rtx3060", weights="q4_k_m", host="ddr4-3200x2", placement="--cpu-moe")
    p = e.prefill(4096).set_index("strategy")
    assert p.loc["yours", "link_s"] > p.loc["static_split", "link_s"] > 0  # more experts in host memory, more copies
    assert p.loc["yours", "ttft_s"] >= p.loc["static_split", "ttft_s"]
    with pytest.raises(ValueError, match="prompt=0"):
        e.prefill(0)
    s = e.summary(prompt=1024)
    assert s["best"] == e.best and s["prefill"] is not None and s["cache_sizing"].cliff_mib > 0
    assert main(["estimate", "--config", "qwen3-30b-a3b", "--gpu", "rtx3060", "--host", "ddr4-3200x2",
                 "--weights", "q4_k_m", "--prompt", "2048"]) == 0
    assert "Prefill, modelled, at a 2048-token prompt" in capsys.readouterr().out


def test_speculative_strategies_are_priced_with_the_modelled_draft():
    from specter_lab.estimate.speculative import ACCEPTANCE_RANGE, SPECULATIVE, draft_model
    from specter_lab.traces.importing import MEASURED_DRAFT

    e = estimate(QWEN3, gpu="rtx4090", vram="24GB", host="ddr5-5600x2", weights="bf16")
    assert set(SPECULATIVE) <= set(e.table.strategy)
    for name in SPECULATIVE:
        r, p = e.row(name), e.placements[name]
        assert "MODELLED" in r.placement and p["acceptance"] == MEASURED_DRAFT[p["draft_bits"]].acceptance
        assert r.low_tok_s < r.tokens_per_s < r.high_tok_s
    assert e.row("specter").tokens_per_s >= e.row("spec_lru").tokens_per_s  # prefetch hides copies, never adds
    assert any("MODELLED" in a for a in e.assumptions)
    d = draft_model(e.model, e.budget, 16.0)
    assert d.tokens_per_window(8, 1.0) == 9 and d.tokens_per_window(8, 0.0) == 1
    assert ACCEPTANCE_RANGE[0] < d.acceptance <= ACCEPTANCE_RANGE[1] + 0.01
    assert "draft acceptance" in e.unknowns
    # a draft is narrower than the experts: q4_k_m experts get a 3- or 2-bit draft, never an int4 one
    q4 = estimate(QWEN3, gpu="rtx4070", host="ddr5-5600x2", weights="q4_k_m")
    assert all(q4.placements[n]["draft_bits"] < 4 for n in SPECULATIVE if n in q4.placements)


def test_the_emitted_command_read_back_prices_the_same_placement():
    # DeepSeek's dense block 0 counts in llama.cpp's --n-cpu-moe: the emitted flag must say n + 1 for n expert layers
    e = estimate("deepseek-v2-lite", gpu="rtx3060", vram="8GB", host="ddr4-3200x2", weights="q4_k_m")
    split = e.placements["static_split"]
    cmd = e.llama_cpp().splitlines()
    flags = next(line for line in cmd if "--n-cpu-moe" in line and "--moe-cache-mib" not in line)
    flags = flags.split("--no-mmap", 1)[1].split(":")[-1]
    again = estimate("deepseek-v2-lite", gpu="rtx3060", vram="8GB", host="ddr4-3200x2", weights="q4_k_m",
                     placement=flags)
    assert again.placements["yours"]["n_host_layers"] == split["n_cpu_moe"]
    assert again.row("yours").tokens_per_s == pytest.approx(again.row("static_split").tokens_per_s)
