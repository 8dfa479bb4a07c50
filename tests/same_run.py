"""One check for "these two runs are the same schedule": metrics, trace records and frames, equal to the bit.
Shared by the replay tests (replay vs live) and the import tests (recorded vs imported routing)."""

import dataclasses


def assert_same_run(a, b, what: str, metrics: tuple[str, ...], records: tuple[str, ...], frames: tuple[str, ...],
                    tokens: bool = True) -> None:
    """``a`` and ``b`` (GenerationResults) agree on ``metrics`` (NaN equals NaN), on every record of ``records``
    and every frame of ``frames``, and on their token ids if ``tokens``."""
    if tokens:
        assert b.token_ids == a.token_ids, what
    for key in metrics:
        x, y = a.metrics.get(key), b.metrics.get(key)
        assert x == y or (x != x and y != y), f"{what}: {key} {x} vs {y}"
    for name in records:
        got = [dataclasses.astuple(r) for r in getattr(b.trace, name)]
        want = [dataclasses.astuple(r) for r in getattr(a.trace, name)]
        assert got == want, f"{what}: {name} records differ"
    for name in frames:
        assert a.frames()[name].equals(b.frames()[name]), f"{what}: frame {name} differs"
