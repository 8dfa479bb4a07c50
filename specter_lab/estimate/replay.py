"""Where each routed expert of a decode token is computed, per placement: a replay of a routing array through the
placement's cache logic (the idea of llama.cpp's ``scripts/moe-cache-tune.py``, which replays recorded routing
through a copy of its cache to predict other sizes).

Each placement returns :class:`Counts`: per MoE layer, the mean experts a token computes on the device from
resident weights, copies over the link (then computes on the device), and computes on the host. The first
``warmup`` tokens are replayed but not counted (the prompt warms a cache before decode starts). The caches are
:func:`specter_lab.caching.simulate.simulate`'s, the runtime's rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..caching.simulate import CacheStats, simulate

__all__ = ["Counts", "resident", "static_layers", "hot_set", "layer_lru", "global_lru", "on_demand"]


@dataclass(frozen=True)
class Counts:
    """Per MoE layer, mean per decode token: experts computed on the device (resident), copied then computed on the
    device, computed on the host; ``host_trips`` the fraction of tokens whose layer hands work to the host;
    ``disk`` how many of the copied and host ones the host first reads from disk (None: none; ``page_cache.py``)."""

    device: np.ndarray
    copied: np.ndarray
    host: np.ndarray
    host_trips: np.ndarray
    disk: "np.ndarray | None" = None

    @property
    def hit_rate(self) -> float:
        total = float((self.device + self.copied + self.host).sum())
        return float(self.device.sum()) / total if total else 1.0

    @property
    def copies_per_token(self) -> float:
        return float(self.copied.sum())

    @property
    def host_per_token(self) -> float:
        return float(self.host.sum())


def _counts(dev, cop, host, trips) -> Counts:
    return Counts(*(np.asarray(a, dtype=float) for a in (dev, cop, host, trips)))


def resident(layers: int, top_k: int) -> Counts:
    """Every expert on the device."""
    z = np.zeros(layers)
    return _counts(np.full(layers, float(top_k)), z, z, z)


def static_layers(on_device: list[bool], top_k: int) -> Counts:
    """Whole layers' experts on the device or on the host (llama.cpp ``--n-cpu-moe`` / ``-ot``)."""
    dev = np.array([top_k if d else 0.0 for d in on_device])
    host = top_k - dev
    return _counts(dev, np.zeros(len(on_device)), host, (host > 0).astype(float))


def _from_stats(s: CacheStats) -> Counts:
    n = max(1, s.steps)
    return _counts(s.hits / n, s.loads / n, s.bypassed / n, s.bypass_steps / n)


def hot_set(routing: np.ndarray, slots: int, warmup: int, by: str = "frequency") -> Counts:
    """``slots`` fixed experts per layer on the device, every other routed expert computed on the host
    (ktransformers' GPU experts, Fiddler). ``by="frequency"``: the most routed experts of the warm-up tokens (a
    profile); ``by="index"``: experts 0..slots-1 (no profile)."""
    layers = routing.shape[1]
    keep = {}
    for layer in range(layers):
        if by == "frequency":
            freq = np.bincount(routing[:warmup, layer].ravel(), minlength=routing.max() + 1)
            keep[layer] = np.argsort(-freq, kind="stable")[:slots].tolist()
        else:
            keep[layer] = list(range(slots))
    return _from_stats(simulate(routing, slots, policy="static", initial=keep, warmup=warmup))


def layer_lru(routing: np.ndarray, slots: int, warmup: int, miss: str = "copy", reuse_window: int = 4) -> Counts:
    """A per-layer LRU of ``slots`` experts, with the runtime's rule (:func:`~specter_lab.caching.simulate.simulate`:
    a token's resident experts are used first, a miss never evicts one the token needs). ``miss="copy"``: every
    miss is copied and cached (``lru``); ``"reuse"``: a miss is copied only if a slot is free or the layer routed
    that expert in the last ``reuse_window`` tokens (its reuse pays for the copy), else computed on the host
    (``host_lru``, whose per-miss rule is approximated here by recent reuse)."""
    rows = routing.tolist()

    def reused(layer: int, e: int, t: int, free: int) -> bool:  # a free slot costs nothing
        return free > 0 or any(e in rows[u][layer] for u in range(max(0, t - reuse_window), t))

    return _from_stats(simulate(routing, slots, warmup=warmup, admit=None if miss == "copy" else reused))


def global_lru(routing: np.ndarray, slots: int, warmup: int, cpu_share: float = 0.0) -> Counts:
    """One LRU over (layer, expert) with ``slots`` slots in all (llama.cpp ``--moe-cache-mib``): a miss is copied
    and cached, evicting the least recently used expert of any layer (never one the token's layer needs); with
    ``cpu_share`` that share of the misses (every n-th, deterministically) is computed on the host instead and
    not cached (``--moe-cache-cpu-share``)."""
    owed = 0.0  # misses owed to the host so far

    def admit(layer: int, e: int, t: int, free: int) -> bool:
        nonlocal owed
        owed += cpu_share
        if owed >= 1.0:
            owed -= 1.0
            return False
        return True

    return _from_stats(simulate(routing, slots, pool="global", warmup=warmup, admit=admit if cpu_share else None))


def on_demand(layers: int, top_k: int) -> Counts:
    """Nothing kept: every routed expert copied every token."""
    z = np.zeros(layers)
    return _counts(z, np.full(layers, float(top_k)), z, z)
