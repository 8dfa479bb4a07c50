"""Host execution of missed experts (``fiddler``, ``host_lru``, ``specter_host``): exact, on its own lane of the
clock, and deciding copy-or-host from the profile. Losslessness on the six families is in test_lossless (every
strategy of ``sl.STRATEGIES``)."""

from dataclasses import replace
from functools import partial
from unittest import mock

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.offload.hostexec import BalancedMisses, ForecastRecall
from specter_lab.pricing.profiles import get_profile
from conftest import COPY_BOUND, bundled_routing, hf_greedy

IDS = [17, 3, 99, 42, 42, 7, 200, 11]
N = 24
HOST_STRATEGIES = [s for s, st in sl.STRATEGIES.items() if st.miss != "copy"]


def _run(model, strategy, hardware="rtx4090-pcie4", budget=0.35, **kw):
    return sl.Engine(model, None, strategy, expert_budget=budget, hardware=hardware, cost_shape="deepseek-v2-lite",
                     **kw).generate(IDS, max_new_tokens=N)


def test_host_strategies_exist_and_are_exact_on_the_bundled_model():
    model, tok = sl.load_model("tiny")
    assert {"fiddler", "host_lru", "specter_host"} <= set(HOST_STRATEGIES)
    ref = hf_greedy(model, IDS, N)
    for s in HOST_STRATEGIES:
        r = _run(model, s)
        assert r.token_ids == ref, s
        assert r.metrics["host_experts_per_token"] > 0, f"{s} computed nothing on the host at budget 0.35"


def test_fiddler_copies_nothing_after_the_prefill(model):
    r = _run(model, "fiddler")
    tr = r.frames()["transfers"]
    assert len(tr[tr.step == 0]) > 0 and len(tr[tr.step >= 1]) == 0  # the prompt fills the cache, then frozen
    ce = r.frames()["cache"]
    dec = ce[ce.step >= 1]
    assert (dec.event == "host").sum() == (dec.event == "miss").sum() > 0  # every decode miss ran on the host


def test_host_lane_overlaps_the_device(model):
    """A host expert runs beside the device's own experts of the same layer, not after them: its span overlaps
    a device expert span of the same forward."""
    r = _run(model, "fiddler", budget=0.5)
    co = r.frames()["compute"]
    co = co[co.step >= 1]
    host, dev = co[co.lane == "host"], co[(co.lane == "device") & (co.expert >= 0)]
    overlapping = 0
    for h in host.itertuples():
        same = dev[(dev.step == h.step) & (dev.layer == h.layer)]
        overlapping += bool(((same.start < h.end) & (same.end > h.start)).any())
    assert len(host) and overlapping > 0.5 * len(host), f"{overlapping} of {len(host)} host spans overlap the device"
    assert (co[co.lane == "host"].copy_id.isna()).all()


def test_host_lru_decides_from_the_profile(model):
    """Where the host is very slow, a copy pays and host_lru copies (few host experts); where the link is very
    slow, nothing pays for its copy and host_lru computes every miss on the host, as fiddler does."""
    base = sl.PROFILES["rtx4090-pcie4"]
    slow_host = replace(base, name="slow-host", cpu_mem_bandwidth=1e8, cpu_flops=1e9)
    slow_link = replace(base, name="slow-link", pcie_bandwidth=1e8)
    copied = _run(model, "host_lru", hardware=slow_host).metrics
    fiddler = _run(model, "fiddler", hardware=slow_host).metrics
    assert copied["host_experts_per_token"] < 0.5 * fiddler["host_experts_per_token"]
    assert copied["tpot_ms"] < fiddler["tpot_ms"]
    on_host = _run(model, "host_lru", hardware=slow_link).metrics
    assert on_host["host_experts_per_token"] == pytest.approx(
        _run(model, "fiddler", hardware=slow_link).metrics["host_experts_per_token"], rel=0.1)


def test_host_time_is_priced_and_labelled(model):
    r = _run(model, "fiddler")
    m = r.metrics
    assert m["host_ms_per_token"] > 0 and m["h2d_bytes_per_token"] == 0
    assert r.trace.meta["simulated"]


def test_calibrate_host_and_the_plus_host_profile(model, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTER_LAB_PROFILES", str(tmp_path))
    with pytest.raises(ValueError, match="calibrate_host"):
        sl.Engine(model, None, "fiddler", hardware="rtx4090-pcie4+host")  # nothing saved yet: says how
    host = sl.calibrate_host(hidden=256, intermediate=128, k=3, dtypes=("float32",))
    assert (tmp_path / "host.json").is_file() and host.tokens == [1, 4]
    assert all(t > 0 for t in host.expert_s["float32"]) and host.dram_bandwidth > 0
    prof = get_profile("rtx4090-pcie4+host")
    assert prof.name == "rtx4090-pcie4+host" and prof.cpu_mem_bandwidth == host.cpu_mem_bandwidth
    r = sl.Engine(model, None, "fiddler", hardware="rtx4090-pcie4+host", expert_budget=0.35).generate(IDS, max_new_tokens=6)
    assert r.metrics["profile"] == "rtx4090-pcie4+host" and r.trace.meta["clock"] == "simulated:rtx4090-pcie4+host (eager)"
    # the fitted fields reproduce what was measured, through the cost model's own formula
    cost = sl.Engine(model, None, "fiddler", hardware=prof).cost
    cost_p = 3 * 256 * 128
    t1 = max(2 * cost_p / prof.cpu_flops, cost_p * 4 / prof.cpu_mem_bandwidth)
    assert t1 == pytest.approx(host.expert_s["float32"][0], rel=0.05)
    assert cost.profile is prof or cost.profile.name == prof.name


def test_static_split_is_llama_cpp_n_cpu_moe(model):
    """Whole layers: the last ones that fit keep every expert on the device (loaded before the prompt), the
    first N compute all theirs on the host; nothing moves while decoding."""
    info = sl.inspect_model(model)
    eng = sl.Engine(model, None, "static_split", expert_budget=0.5)
    e = info.layers[0].num_experts
    assert eng.split.slots_per_layer == [0] * (info.num_layers - info.num_layers // 2) + [e] * (info.num_layers // 2)
    r = eng.generate(IDS, max_new_tokens=N)
    tr = r.frames()["transfers"]
    assert set(tr.reason) == {"preload"} and (tr.step == 0).all() and len(tr) == e * (info.num_layers // 2)
    ce = r.frames()["cache"]
    host_layers = set(ce[ce.event == "host"].layer)
    assert host_layers == set(range(info.num_layers - info.num_layers // 2))
    with pytest.raises(ValueError, match="expert_budget="):
        sl.Engine(model, None, "static_split", cache_slots=2)


def test_timeline_draws_the_host_lane(model):
    from specter_lab import viz

    r = _run(model, "fiddler")
    fig = viz.timeline_figure(r)
    host = [t for t in fig.data if t.name == "compute: host CPU"]
    assert host and len(host[0].x) == (r.frames()["compute"].lane == "host").sum() > 0


def test_host_dtype_is_a_knob_on_the_gpu_and_refused_where_it_breaks_exactness(model, monkeypatch):
    import torch

    with pytest.raises(ValueError, match="host_dtype="):
        sl.Engine(model, None, "fiddler", host_dtype="int8")
    with pytest.raises(sl.NotExact, match="bit-identical"):
        sl.Engine(model, None, "fiddler", host_dtype="bfloat16")  # fp32 experts, CPU path: would not be exact
    same = sl.Engine(model, None, "fiddler", host_dtype="float32", expert_budget=0.35)
    assert same.host_dtype is None  # the experts' own: no copy, exact
    assert same.generate(IDS, max_new_tokens=N).token_ids == hf_greedy(model, IDS, N)
    # On a GPU (here: the device check says so) a bf16 host keeps its own copy, at half the fp32 bytes; an fp32
    # host on the priced bf16 deployment reads twice the bytes per expert
    eng = sl.Engine(model, None, "fiddler", expert_budget=0.35, hardware="rtx4090-pcie4", cost_shape="deepseek-v2-lite")
    # a bf16 host lane, as resolve() sets it up on a GPU (the CPU binding refuses it: exactness is promised there)
    eng.setup = replace(eng.setup, host_dtype=torch.bfloat16)
    r = eng.generate(IDS, max_new_tokens=N)
    fp32 = sum(t.numel() * 4 for l in sl.inspect_model(model).layers for n in l.param_names
               for t in [getattr(l.experts, n)])
    assert r.metrics["host_copy_bytes"] == fp32 // 2 and r.metrics["host_dtype"] == "bfloat16"
    base = _run(model, "fiddler").metrics  # priced as the bf16 deployment: the same bytes as the bf16 copy
    assert r.metrics["host_ms_per_token"] == pytest.approx(base["host_ms_per_token"])
    eng.setup, eng._host_exec = replace(eng.setup, host_dtype=torch.float32), None
    wide = eng.generate(IDS, max_new_tokens=N).metrics
    assert wide["host_ms_per_token"] > 1.5 * base["host_ms_per_token"] and wide["host_copy_bytes"] == fp32


def test_the_pregated_split_prefetches_what_it_would_copy_not_every_forecast():
    """Copy-bound (a100 compiled, DeepSeek-V2-Lite at full depth: a copy outlasts two layers), a perfect next-layer
    forecast (modelled on an import of the bundled model's routing): gate_lookahead prefetches every forecast
    expert and floods the link; pregate_split places the forecast first and prefetches only what it would copy,
    so it moves a fraction of the bytes and, at 0.25 of the experts, beats split_lfu, which has no forecast. Every
    prefetch of a perfect forecast serves its lookup, also where the host computed it while its copy landed (that
    use counts for eviction too: before it did not, and 18 % of the prefetched bytes went unused in the
    DeepSeek-V2-Lite-local rtx4090 compiled 0.5 cell of docs/measured/closer_to_bound.md)."""
    trace = sl.import_routing(*bundled_routing(2, 48), k_max=0, gate_recall=1.0)
    kw = COPY_BOUND
    rows = {s: s for s in ("split_lfu", "pregate_split", "gate_lookahead")}
    rows["pre-gating alone"] = sl.STRATEGIES["pregate_split"].with_options(refresh=False)  # its prefetches only
    got = {name: sl.replay(trace, s, **kw) for name, s in rows.items()}
    mean = {s: {k: np.mean([r.metrics[k] for r in runs]) for k in ("tpot_ms", "h2d_bytes_per_token",
                                                                      "prefetch_used_fraction")}
            for s, runs in got.items()}
    assert mean["pre-gating alone"]["prefetch_used_fraction"] == 1.0
    assert all(r.metrics["prefetch_waste_bytes"] == 0 for r in got["pre-gating alone"])
    for row in ("pregate_split", "pre-gating alone"):
        assert mean[row]["tpot_ms"] < mean["split_lfu"]["tpot_ms"] < mean["gate_lookahead"]["tpot_ms"]
        assert mean[row]["h2d_bytes_per_token"] < mean["gate_lookahead"]["h2d_bytes_per_token"] / 2


def test_a_forecast_that_keeps_missing_stops_moving_bytes():
    """The pre-gated split measures its forecast's recall as it goes (ForecastRecall) and stops prefetching on a
    layer whose forecast keeps naming the wrong experts: a forecast that is never right moves a fraction of the
    bytes it moves when trusted regardless (trust=0), and a right one is trusted throughout."""
    fr = ForecastRecall()
    for _ in range(10):
        fr.observe(1, {0, 1}, [2, 3])
        fr.observe(2, {0, 1}, [0, 1, -1])
    assert fr.of(1) < 0.4 < fr.of(2) == 1.0 and fr.of(3) == 1.0  # never seen: trusted
    routing, config, segs = bundled_routing(1, 48)
    kw = COPY_BOUND
    pregating = sl.STRATEGIES["pregate_split"].with_options(refresh=False)  # its gate prefetches only
    moved = {}
    for recall in (0.0, 1.0):
        trace = sl.import_routing(routing, config, segs, k_max=0, gate_recall=recall)
        for trust in (0.0, BalancedMisses.trust):
            with mock.patch("specter_lab.run.assembly.BalancedMisses", partial(BalancedMisses, trust=trust)):
                (run,) = sl.replay(trace, pregating, **kw)
            moved[recall, trust] = run.metrics["prefetch_bytes_per_token"]
    assert moved[0.0, BalancedMisses.trust] < moved[0.0, 0.0] / 3
    assert moved[1.0, BalancedMisses.trust] == moved[1.0, 0.0] > 0
