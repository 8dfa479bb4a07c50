"""Every argument of ``sl.Engine`` and ``Engine.generate`` under fuzz (Hypothesis): one argument at a time gets an
odd value (None, a bool, a negative, NaN, an infinity, 2**31, a string, a list, bytes, …) and the call either
works or raises a ``ValueError`` / ``TypeError`` whose message names that argument, within a time bound. A hang
or any other exception is a bug (a 2**31-token request once ran until memory ran out; a string temperature
reached ``float()``).

Seeds are fixed (``derandomize=True``); ``SPECTER_LAB_FUZZ=N`` runs N examples with fresh seeds
(``scripts/fuzz_arguments.py`` tries every argument × value, with counts)."""

import functools
import os
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specter_lab as sl

LARGE = int(os.environ.get("SPECTER_LAB_FUZZ", "0"))
BOUND_S = 60.0  # per example: a tiny model's 6 tokens take well under a second
ODD = [None, True, False, 0, -1, 1, 2, 3, 0.0, 0.5, 1.5, -0.5, 10**12, 2**31, float("nan"), float("inf"),
       -float("inf"), "", "x", "0.5", "1GiB", "-1", "auto", [1, 2], (4, 64), {"a": 1}, b"x", 1e-300]
ENGINE_ARGS = ["expert_budget", "cache_slots", "draft", "k", "hardware", "cost_shape", "eviction", "prefetch",
               "chunking", "shared_slots", "cpu_share", "trace", "host_dtype", "ignore_eos", "verify", "host_budget",
               "record_routing", "verify_lossless"]
GENERATE_ARGS = ["prompt", "max_new_tokens", "do_sample", "temperature", "top_p", "seed"]


@functools.lru_cache(maxsize=1)
def bundled():
    return sl.load_model("tiny")


def call(strategy: str, arg: str, value) -> None:
    """One Engine and one generate() with ``arg=value`` and every other argument at its default."""
    model, tok = bundled()
    engine = sl.Engine(model, tok, strategy, **({arg: value} if arg in ENGINE_ARGS else {}))
    gen = {"prompt": "def f(x):", "max_new_tokens": 6}
    if arg in GENERATE_ARGS:
        gen[arg] = value
    engine.generate(gen.pop("prompt"), **gen)


@settings(max_examples=LARGE or 60, derandomize=not LARGE, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(["lru", "specter"]), arg=st.sampled_from(ENGINE_ARGS + GENERATE_ARGS),
       value=st.sampled_from(ODD))
def test_an_odd_argument_works_or_is_refused_by_name(strategy, arg, value):
    t0 = time.perf_counter()
    try:
        call(strategy, arg, value)
    except (ValueError, TypeError) as e:
        assert arg in str(e) or arg.replace("_", " ") in str(e), f"{arg}={value!r}: {type(e).__name__}: {e}"
    assert time.perf_counter() - t0 < BOUND_S, f"{arg}={value!r} took {time.perf_counter() - t0:.0f} s"


def test_the_cases_the_full_sweep_found():
    """The two kinds the sweep over every argument × value found, always checked: a huge max_new_tokens is refused
    before generating (it ran on and on), and a non-number temperature / top_p names itself."""
    for arg, value in (("max_new_tokens", 2**31), ("max_new_tokens", 10**12), ("temperature", "x"),
                       ("top_p", None), ("temperature", [1, 2])):
        t0 = time.perf_counter()
        try:
            call("lru", arg, value)
        except ValueError as e:
            assert arg in str(e)
        else:
            raise AssertionError(f"{arg}={value!r} was accepted")
        assert time.perf_counter() - t0 < 5.0
