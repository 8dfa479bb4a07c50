"""The llama.cpp flags a user types (estimate(placement=...), estimator/flags.py): each understood the way llama.cpp reads
it, or refused by name; a flag set whose weights do not fit is refused with the nearest set that fits; and a
placement that keeps strictly more on the host is never priced faster, over random flag sets of four families."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specter_lab.estimator.bands import Scenario
from specter_lab.estimator.flags import (PlacementError, keeps_more_on_host, parse_placement, random_flags)
from specter_lab.estimator.lanes import Machine, price_token, static_layers
from specter_lab.model.geometry import geometry_from_config
from specter_lab.pricing.precision import get_precision
from specter_lab.pricing.profiles import HOST_DECODE_EFFICIENCY, get_host, resolve_gpu

FAMILIES = ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b")


@pytest.fixture(scope="module")
def geoms():
    return {f: geometry_from_config(f) for f in FAMILIES}


def test_llama_cpp_reads_blocks_over_every_decoder_layer(geoms):
    ds = geoms["deepseek-v2-lite"]  # one dense first block: llama.cpp counts blocks, not MoE layers
    assert sum(parse_placement("-ngl 99 --n-cpu-moe 5", ds).host_layers) == 4
    assert all(parse_placement("--cpu-moe", ds).host_layers)
    ot = parse_placement("-ot 'blk\\.(1|2)\\.ffn_.*_exps\\.=CPU'", ds).host_layers
    assert [i for i, h in enumerate(ot) if h] == [0, 1]


def test_ngl_keeps_the_first_layers_whole_on_the_host(geoms):
    q = geoms["qwen3-30b-a3b"]  # 48 decoder layers, all MoE
    p = parse_placement("-ngl 20", q)
    assert p.gpu_layers == 20 and p.host_decoder_layers(q) == 28
    assert [i for i, h in enumerate(p.host_layers) if h] == list(range(28))  # their experts too
    assert parse_placement("-ngl 99", q).host_decoder_layers(q) == 0
    assert parse_placement("--n-gpu-layers=all", q).gpu_layers is None
    assert any("-ngl not given" in n for n in parse_placement("--n-cpu-moe 3", q).notes)


def test_ot_places_on_any_buffer_first_rule_first(geoms):
    q = geoms["qwen3-30b-a3b"]
    # the first matching rule wins, as llama.cpp applies them: block 3 stays on CUDA0 although the second says CPU
    p = parse_placement("-ot 'blk\\.3\\.ffn_.*_exps=CUDA0,blk\\.[0-9]\\.ffn_.*_exps=CPU'", q)
    assert [i for i, h in enumerate(p.host_layers) if h] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert not any(parse_placement("--cpu-moe -ot 'exps=Vulkan0'", q).host_layers)


def test_kv_cache_context_mmap_and_batches_are_read(geoms):
    q = geoms["qwen3-30b-a3b"]
    p = parse_placement("-c 16384 -ctk q8_0 -ctv q8_0 -fa on --no-mmap --mlock -ub 256 -t 8 --port 8080", q)
    assert (p.context, p.kv_type, p.ubatch, p.no_mmap, p.mlock) == (16384, "q8_0", 256, True, True)
    assert any("read past" in n and "--port" in n for n in p.notes)
    small = parse_placement("-c 16384 -ctk q4_0 -ctv q4_0 -fa on", q).gpu_bytes(q, get_precision("q4_k_m"), 4096, 0)
    big = parse_placement("-c 16384", q).gpu_bytes(q, get_precision("q4_k_m"), 4096, 0)
    assert small["KV cache"] == pytest.approx(big["KV cache"] * 4.5 / 16)


@pytest.mark.parametrize("flags,match", [
    ("--n-cpu-moe many", r"--n-cpu-moe takes a whole number"),
    ("-sm row", r"-sm: several GPUs"),
    ("--fit on", r"--fit: llama.cpp chooses its own placement"),
    ("--frobnicate 3", r"'--frobnicate' is not a flag this understands"),
    ("-ot 'attn=CPU'", r"also matches 'blk\.0\.attn_q\.weight'"),
    ("-ot 'exps=NPU0'", r"buffer 'NPU0' is neither CPU nor a GPU"),
    ("-ctv q8_0 -fa off", r"a quantized V cache needs flash attention"),
    ("-ctk f13", r"-ctk 'f13' is not a KV cache type"),
    ("--n-cpu-moe 4 --moe-cache-mib 2000", r"--moe-cache-mib with only some layers' experts"),
    ("-ngl 4 -ot 'blk\\.0\\.ffn_.*_exps=CUDA0'", r"keeps block 0's experts on the GPU while -ngl 4"),
])
def test_what_cannot_be_priced_is_refused_by_name(geoms, flags, match):
    with pytest.raises(PlacementError, match=match) as e:
        parse_placement(flags, geoms["qwen3-30b-a3b"])
    assert str(e.value).startswith(f"placement={flags!r}") and isinstance(e.value, ValueError)


# ------------------------------------------------------------------------------------------ the property

MACHINES = [("rtx3060", "ddr4-3200x2", 12), ("rtx4090", "ddr5-6000x2", 24), ("rtx2080", "i9-10900x", 8)]


def _price(geom, flags, machine, weights="q4_k_m") -> float:
    """The placement's TPOT on the machine's clock, in closed form (the replay's for a static placement:
    tests/test_estimate.py holds them equal)."""
    gpu, host, vram = machine
    profile, card = resolve_gpu(gpu)
    sc = Scenario(Machine(profile, vram * 2**30, get_host(host), card), get_precision(weights),
                  HOST_DECODE_EFFICIENCY, 4096)
    counts = static_layers([not h for h in flags.host_layers], geom.top_k)
    return price_token(sc.cost(geom, flags.gpu_layers), counts, geom.top_k, sc.depth).total_ms


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(FAMILIES), machine=st.sampled_from(MACHINES), seed=st.integers(0, 2**31 - 1))
def test_keeping_strictly_more_on_the_host_is_never_faster(geoms, family, machine, seed):
    g = geoms[family]
    rng = np.random.default_rng(seed)
    a, b = (parse_placement(random_flags(g, rng), g) for _ in range(2))
    if keeps_more_on_host(b, a, g):
        a, b = b, a
    if not keeps_more_on_host(a, b, g):
        return  # neither keeps a superset of the other on the host: no order to hold
    assert _price(g, b, machine) >= _price(g, a, machine), (a.flags, b.flags)
