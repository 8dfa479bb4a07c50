"""Refresh (``Strategy.refresh``, ``offload/refresh.py``): on an idle link, a layer's most used missing expert is
copied in place of the policy's victim. Its rule, that it waits for an idle link, what it buys where a split keeps
the prompt's experts, and which strategies may ask for it. Losslessness and replay = live: test_lossless and
test_replay run every row, ``pregate_split`` (which refreshes) among them."""

from unittest import mock

import numpy as np
import pytest

import specter_lab as sl
from specter_lab.offload.clock import SimClock
from specter_lab.offload.refresh import Refresh
from specter_lab.run.strategies import Strategy
from conftest import COPY_BOUND, bundled_routing


def test_the_rule_copies_the_most_used_missing_expert_only_where_it_beats_the_victim():
    r = Refresh([6], decay=0.5, margin=2.0)
    r.observe(0, [1, 2, -1])  # rates 0.5 for experts 1 and 2; -1 is no expert
    r.observe(0, [2, 3])  # 1: 0.25, 2: 0.75, 3: 0.5
    assert r.candidate(0, resident=[0], victim=None, full=False) == 2  # a free slot: the most used
    assert r.candidate(0, resident=[0, 2], victim=0, full=True) == 3  # 0.5 against a victim never used
    assert r.candidate(0, resident=[1, 2, 4, 5], victim=1, full=True) == 3  # 0.5: twice the victim's 0.25
    assert r.candidate(0, resident=[3, 2, 4, 5], victim=2, full=True) is None  # 1 (0.25) is used less than 2
    assert r.candidate(0, resident=[3, 2, 4, 5], victim=None, full=True) is None  # nothing may be evicted
    assert r.candidate(0, resident=range(6), victim=0, full=True) is None  # everything resident
    assert Refresh([4]).candidate(0, resident=[], victim=None, full=False) is None  # nothing used yet


@pytest.fixture(scope="module")
def copy_bound():
    """The bundled model's routing, imported, where a copy outlasts two layers (a100 compiled, DeepSeek-V2-Lite at
    full depth) and a quarter of the experts fit: a split computes most misses on the host."""
    return sl.import_routing(*bundled_routing(2, 48), k_max=0), COPY_BOUND


def _mean(runs, key):
    return float(np.mean([r.metrics[key] for r in runs]))


def test_refresh_moves_the_cache_to_the_decodes_experts(copy_bound):
    """split_lfu keeps what its prefill left (its misses mostly run on the host and never enter the cache); with
    refresh, popular experts come in on the idle link: more hits and a lower TPOT (simulated)."""
    trace, kw = copy_bound
    plain = sl.replay(trace, "split_lfu", **kw)
    refreshed = sl.replay(trace, sl.STRATEGIES["split_lfu"].with_options(refresh=True), **kw)
    assert _mean(plain, "prefetch_bytes_per_token") == 0 < _mean(refreshed, "prefetch_bytes_per_token")
    assert _mean(refreshed, "hit_rate") > _mean(plain, "hit_rate") + 0.03
    assert _mean(refreshed, "tpot_ms") < _mean(plain, "tpot_ms")


def test_refresh_waits_for_an_idle_link(copy_bound):
    """A link that is never idle gets no refresh copy (the run is then split_lfu's, to the float)."""
    trace, kw = copy_bound
    with mock.patch.object(SimClock, "copy_idle", lambda self, now: False):
        busy = sl.replay(trace, sl.STRATEGIES["split_lfu"].with_options(refresh=True), **kw)
    plain = sl.replay(trace, "split_lfu", **kw)
    assert _mean(busy, "prefetch_bytes_per_token") == 0
    assert [r.metrics["tpot_ms"] for r in busy] == [r.metrics["tpot_ms"] for r in plain]


@pytest.mark.parametrize("fields", [dict(speculative=True), dict(pool="global"), dict(static=True, miss="host"),
                                    dict(keep=False), dict(refresh="yes")])
def test_refresh_is_refused_where_it_has_no_slots_of_its_own(fields):
    with pytest.raises((ValueError, TypeError), match="refresh"):
        Strategy("x", refresh=fields.pop("refresh", True), **fields)


def test_a_refresh_copy_is_its_own_reason_in_the_frames_metrics_and_timeline(copy_bound):
    """A user reading a timeline asks why a copy happened: a refresh is drawn as its own kind of copy, beside a
    forecast's prefetch and a demand copy, and counted apart in the metrics (and within the prefetched bytes,
    since it is copied ahead of its lookup too)."""
    from specter_lab import viz
    from specter_lab.viz import style

    _, kw = copy_bound
    (run,) = sl.replay(sl.import_routing(*bundled_routing(1, 48), k_max=0, gate_recall=0.6), "pregate_split",
                       **kw)
    tr = run.frames()["transfers"]
    assert {"refresh", "prefetch"} <= set(tr.reason)
    decode = tr[tr.step >= 1]
    tokens = run.metrics["new_tokens"] - 1
    m = run.metrics
    assert m["refresh_bytes_per_token"] == pytest.approx(decode[decode.reason == "refresh"].bytes.sum() / tokens)
    assert m["prefetch_bytes_per_token"] == pytest.approx(
        decode[decode.reason.isin(["prefetch", "refresh"])].bytes.sum() / tokens)
    step = int(tr[tr.reason == "refresh"].step.iloc[0])
    fig = viz.timeline_figure(run, step=step)
    drawn = next(t for t in fig.data if t.name == "copy: refresh")
    assert len(drawn.x) == int(((tr.step == step) & (tr.reason == "refresh")).sum()) > 0
    assert drawn.marker.color == style.COPY_COLORS["refresh"] != style.COPY_COLORS["prefetch"]
