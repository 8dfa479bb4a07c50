"""A decayed LFU's victim without ranking every resident: residents kept in the order of a score that does not age.

:class:`~specter_lab.caching.policies.DecayLFU` ranks a key at its layer's use clock ``u`` by
``r = v · decay ** (u − t)`` (``v``: the key's decayed count when it was last used, at clock ``t``), and evicts
the smallest rank, the least recent on ties. Every use of a layer ages all its keys, so ranking by ``r`` means a
walk over every resident per victim (the replay's largest cost on the decayed-LFU rows: four victims per layer
on ``pregate_split``, each over ~30 residents).

In exact arithmetic ``log r = ls + u · log(decay)`` with ``ls = log v − t · log(decay)``, which does not change
while the key is not used: within a layer the order by ``ls`` *is* the order by rank, at any clock. Floats round,
so the order by ``ls`` is only trusted where it is clear: :class:`TimelessOrder` keeps each layer's residents
sorted by ``ls`` (updated on every load, use and eviction), takes the allowed residents whose log rank is within
:data:`BAND` of the smallest, and ranks only those exactly as the walk does (the same floats: ``v`` times the
same cached power), ties to the least recent. Outside the band a rank is larger by a factor ``e ** BAND``, far
beyond what rounding moves (the log ranks are off by ~1e-11 at most at a billion uses; the exact ranks by two
ulps), so the victim is the walk's, bit for bit. Where the argument does not hold, the walk runs instead:
``decay`` of 0 (``log`` undefined), clocks so long that the log ranks' error could reach the band, and ranks
small enough to underflow (a key whose rank rounds to 0.0 ties with never-used keys, which only the walk sees).
``tests/test_mechanisms.py`` holds the two against each other on random sequences.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from typing import Callable, Container, Hashable

__all__ = ["TimelessOrder", "BAND"]

BAND = 1e-6  # log-rank distance inside which the order by ls is not trusted (ranks within a factor 1 + 1e-6)
_LOG_TINY = math.log(1e-250)  # a rank below this could be subnormal or underflow to 0.0: the walk decides
_MAX_LOG = 1e8  # |ls| past this (e.g. a billion uses at decay 0.9): the log ranks' own error nears BAND


class TimelessOrder:
    """Each layer's residents sorted by ``(ls, stamp, key)``: ``ls`` the log score that does not age (``-inf`` for a
    key never used: rank 0.0), ``stamp`` its recency (larger = more recent). The owner (:class:`DecayLFU`) calls
    :meth:`put` when a key enters or is used and :meth:`drop` when it leaves."""

    def __init__(self, decay: float, layer_of: Callable[[Hashable], Hashable]) -> None:
        self.log_decay = math.log(decay) if decay > 0 else None  # None: decay 0, the walk always decides
        self.layer_of = layer_of
        self.lists: dict[Hashable, list] = {}  # layer → sorted entries
        self.entry: dict[Hashable, tuple] = {}  # key → its entry
        self.clock = 0  # recency stamps

    @property
    def usable(self) -> bool:
        return self.log_decay is not None

    def put(self, key, value: "tuple[float, int] | None", layer) -> None:
        """``key`` (of ``layer``) is resident and became the most recent, with decayed count and clock ``value``
        (None: never used)."""
        if self.log_decay is None:
            return
        lst = self.lists.get(layer)
        if lst is None:
            lst = self.lists[layer] = []
        old = self.entry.get(key)
        if old is not None:
            del lst[bisect_left(lst, old)]
        self.clock += 1
        ls = -math.inf if value is None else math.log(value[0]) - value[1] * self.log_decay
        ent = self.entry[key] = (ls, self.clock, key)
        insort(lst, ent)

    def drop(self, key, layer) -> None:
        ent = self.entry.pop(key, None)
        if ent is not None:
            lst = self.lists[layer]
            del lst[bisect_left(lst, ent)]

    def victim(self, uses, rank: Callable, protected: Container, among: "Container | None"):
        """The resident the walk would evict, or ``NotImplemented`` where the walk must decide (module
        docstring). ``uses``: each layer's use clock; ``rank``: the policy's exact rank of a key."""
        ld = self.log_decay
        zero = None  # the least recent allowed key never used (rank 0.0)
        band = []  # (log rank, stamp, key) of allowed used keys within BAND of their layer's first
        least = math.inf  # the smallest log rank of an allowed used key
        for layer, lst in self.lists.items():
            shift = uses[layer] * ld
            first = None
            for ls, stamp, k in lst:
                if k in protected or (among is not None and k not in among):
                    continue
                if ls == -math.inf:
                    if zero is None or stamp < zero[0]:
                        zero = (stamp, k)
                    continue
                if abs(ls) > _MAX_LOG:
                    return NotImplemented
                lr = ls + shift
                if first is None:
                    first = lr
                elif lr > first + BAND:
                    break
                band.append((lr, stamp, k))
            if first is not None and first < least:
                least = first
        if least < _LOG_TINY:
            return NotImplemented
        if zero is not None:  # rank 0.0, every used allowed key ranks above it (none near underflow)
            return zero[1]
        best, best_key = None, None
        for lr, stamp, k in band:
            if lr > least + BAND:
                continue
            r = (rank(k), stamp)  # the walk's float; equal floats: the least recent
            if best is None or r < best:
                best, best_key = r, k
        return best_key
