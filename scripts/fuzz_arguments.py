"""Fuzz the arguments: every argument of ``sl.Engine`` and ``Engine.generate``, one at a time, with every odd
value of ``tests/test_fuzz_arguments.py`` (the test samples 60 of these cases), under ``lru`` and ``specter`` on
the bundled model. Prints the counts (worked / refused naming the argument / refused without naming it /
crashed / hung) and every case that is not one of the first two.

    nice python scripts/fuzz_arguments.py            # 2 strategies × 24 arguments × 28 values, about 15 min

A case is "hung" after ``--limit`` seconds (SIGALRM); the run goes on with the next case.
"""

from __future__ import annotations

import argparse
import signal
import sys
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from test_fuzz_arguments import ENGINE_ARGS, GENERATE_ARGS, ODD, call  # noqa: E402


class Hung(Exception):
    pass


def _alarm(*_) -> None:
    raise Hung()


def outcome(strategy: str, arg: str, value, limit: int) -> tuple[str, str]:
    signal.alarm(limit)
    try:
        call(strategy, arg, value)
        return "worked", ""
    except (ValueError, TypeError) as e:
        named = arg in str(e) or arg.replace("_", " ") in str(e)
        return ("refused, named" if named else "refused, unnamed"), f"{type(e).__name__}: {str(e)[:160]}"
    except Hung:
        return "hung", f"> {limit} s"
    except Exception as e:  # noqa: BLE001 - the point is to see anything else
        where = traceback.extract_tb(e.__traceback__)[-1]
        return "crashed", f"{type(e).__name__}: {str(e)[:160]} ({where.filename}:{where.lineno})"
    finally:
        signal.alarm(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=60, help="seconds before a case counts as hung")
    a = ap.parse_args()
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    counts, bad = Counter(), []
    for strategy in ("lru", "specter"):
        for arg in ENGINE_ARGS + GENERATE_ARGS:
            for value in ODD:
                kind, why = outcome(strategy, arg, value, a.limit)
                counts[kind] += 1
                if kind not in ("worked", "refused, named"):
                    bad.append(f"{strategy} · {arg}={value!r}: {kind}: {why}")
    print(f"{sum(counts.values())} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print("\n".join(bad))


if __name__ == "__main__":
    main()
