"""Experts read from disk when host RAM cannot hold them all: the page cache below the GPU, for ``estimate(ram=)``.

A llama.cpp-class engine maps the model file; the experts it reads on the host (to copy them to the GPU, or to
compute them there) come from the OS page cache while they are in it, else from disk. With RAM for every expert
beside the embeddings nothing is read from disk. Short of that, the page cache holds ``page_slots`` experts and
acts as an LRU over the experts the host reads: the ones the GPU does not hold at that moment. The GPU's expert
slots and the page cache together are read as *one* LRU over every routed expert, of the two capacities added
(an exclusive two-level hierarchy behaves about like one LRU of its total size). A routed expert that this LRU
misses is a disk read, and a row's share of host reads that go to disk is those misses over its host reads (at
most all of them). Layers a row never reads from the host (a static split's GPU layers) stay out of it. Each
read costs the disk's latency plus the expert's bytes at the disk's bandwidth, and the layer waits for it (a
page fault blocks the read that needs it).

The page cache is priced in its steady state: the estimate's routing replayed twice, the misses counted on the
second pass. A cache that starts empty would count every first touch of an expert as a disk read, even where RAM
holds them all, and a prompt's prefill has touched most experts before decoding starts.

Modelled, not measured: the routing is the estimate's, and the page cache is taken as an LRU of whole experts
(the kernel's is of pages, with read-ahead and its own aging).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model.geometry import ModelGeometry
from ..pricing.precision import WeightPrecision
from . import replay

__all__ = ["PageCache", "page_cache"]


class PageCache:
    """The host RAM's expert capacity for one estimate and the disk misses of the GPU + page-cache LRU."""

    def __init__(self, slots: int, routing: np.ndarray) -> None:
        self.slots = slots  # whole experts the page cache holds beside the embeddings
        self._twice = np.concatenate([routing, routing])  # steady state: count the second pass (module doc)
        self._warmup = len(routing)
        self._held = [len(np.unique(routing[:, l])) for l in range(routing.shape[1])]  # experts a layer routes
        self._misses: dict[tuple, float] = {}  # (layers read from the host, LRU slots) → disk reads per token

    def disk_share(self, counts: replay.Counts, gpu_slots: int) -> float:
        """The share of ``counts``' host reads (copied + computed on the host) that miss the page cache, with the
        GPU holding ``gpu_slots`` experts. A layer the row never reads from the host (a static split's GPU layer)
        never passes through the page cache: it is left out of the LRU's routing, and the experts it routes out
        of the GPU's slots."""
        by_layer = counts.copied + counts.host
        reads = float(by_layer.sum())
        if reads <= 0:
            return 0.0
        busy = tuple(int(l) for l in np.flatnonzero(by_layer > 0))
        idle = sum(h for l, h in enumerate(self._held) if l not in busy)
        key = (busy, max(0, int(gpu_slots) - idle) + self.slots)
        if key not in self._misses:
            self._misses[key] = replay.global_lru(self._twice[:, list(busy)], key[1], self._warmup).copies_per_token
        return min(1.0, self._misses[key] / reads)

    def with_disk(self, counts: replay.Counts, gpu_slots: int) -> replay.Counts:
        """``counts`` with their disk reads per layer (a share of each layer's host reads)."""
        return replace(counts, disk=(counts.copied + counts.host) * self.disk_share(counts, gpu_slots))


def page_cache(geom: ModelGeometry, prec: WeightPrecision, ram: float | None,
               routing: np.ndarray) -> PageCache | None:
    """The page cache an estimate prices, or None where nothing is read from disk (``ram`` not given: assumed to
    hold everything; or it holds every routed expert beside the embeddings). Raises a ValueError naming ``ram``
    when it cannot even hold the embeddings, which the host keeps."""
    if ram is None:
        return None
    embed = geom.embed_params * prec.dense.bytes_per_weight
    if ram <= embed:
        raise ValueError(f"ram={ram / 2**30:.2f} GiB cannot hold the embeddings the host keeps "
                         f"({embed / 2**30:.2f} GiB for {geom.name}): give the RAM free for the model's weights.")
    expert_bytes = geom.expert_params * prec.experts.bytes_per_weight
    slots = int((ram - embed) // expert_bytes)
    if slots >= geom.moe_layers * geom.num_experts:
        return None
    return PageCache(slots, routing)
