"""Cache bounds replayed on a recorded trace: LRU replay reproduces the runtime's LRU exactly, and Belady's MIN
is never below it."""

import specter_lab as sl
from specter_lab.analysis.cache_bounds import belady_hits, cache_bounds, lru_hits


def test_belady_beats_lru_on_a_known_sequence():
    reqs = [{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}, {2}]
    assert lru_hits(reqs, 2, count_from=0) == (0, 9)  # cyclic access defeats LRU completely
    assert belady_hits(reqs, 2, count_from=0)[0] >= 3


def test_replay_matches_the_run_and_bounds_it():
    model = sl.tiny_random_model("mixtral", seed=3)
    r = sl.Engine(model, None, "lru", cache_slots=3).generate([5, 6, 7, 8], max_new_tokens=24)
    df = cache_bounds(r)
    per_layer = df[df.layer != "all"]
    assert (per_layer.measured_hit_rate - per_layer.lru_hit_rate).abs().max() < 1e-12
    assert (per_layer.belady_hit_rate >= per_layer.lru_hit_rate - 1e-12).all()
