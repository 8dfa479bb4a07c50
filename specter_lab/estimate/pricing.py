"""Time of one decode token for a placement, priced as a llama.cpp-class engine runs it: graphs, one fused MoE kernel
per layer, the host computing its experts from DRAM, batch 1.

Per MoE layer, serially (llama.cpp runs a layer's device and host parts one after the other at batch 1)::

    device  = kernels * kernel_time + weight bytes / (datasheet VRAM bandwidth * the format's decode efficiency)
              + KV bytes at the stated context / (datasheet VRAM bandwidth * bf16's efficiency)
    link    = copies * (copy_latency + expert bytes / link bandwidth)      (a cache miss, before its matmul)
    host    = host experts * expert bytes / (delivered DRAM bandwidth * HOST_DECODE_EFFICIENCY)
    trips   = 2 * copy_latency for each layer that hands activations to the host and back
    disk    = experts read from disk * (disk latency + expert bytes / disk bandwidth)   (host RAM short: ram=)

``overlap=True`` (ktransformers: the host's experts run while the device computes its own) prices a layer as
device dense part + max(device experts + link, host) + trips. Kernels are counted on a tiny sibling of the family
(:func:`specter_lab.pricing.opcount.op_counts`, compiled: two kernels per matmul) at ``KERNEL_TIME`` each.

``HOST_DECODE_EFFICIENCY`` is the one constant fitted to the consumer rows (``sl.bench.consumer_anchors()``,
leave-one-out there; a test checks it still matches): the fraction of the host's delivered DRAM bandwidth a
batch-1 quantized expert matvec reaches in these engines (dequantization and thread barriers cost the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.geometry import ModelGeometry
from ..pricing.opcount import op_counts
from ..pricing.precision import FORMATS, WeightFormat, WeightPrecision
from ..pricing.gpus import GPU
from ..pricing.hosts import UNKNOWN_DESKTOP
from ..pricing.profiles import HardwareProfile, HostCPU
from .replay import Counts

__all__ = ["Machine", "TokenTime", "price_token", "HOST_DECODE_EFFICIENCY", "HOST_EFFICIENCY_RANGE"]

HOST_DECODE_EFFICIENCY = 0.497  # fitted: consumer.derive_host_efficiency() (tests/test_consumer.py checks it)
# The lowest and highest value a single consumer row reproduces exactly: an estimate's band (tests check it too).
HOST_EFFICIENCY_RANGE = (0.396, 0.671)


@dataclass(frozen=True)
class Machine:
    """One GPU (a profile), its usable VRAM and the host beside it (None: not given, priced as
    :data:`~specter_lab.pricing.hosts.UNKNOWN_DESKTOP` and said so); ``card`` the catalog row of the GPU; ``ram``
    the host RAM free for the model's weights (None: not given, assumed to hold them all) and ``disk`` the disk's
    read bandwidth (None: the profile's, an assumption)."""

    gpu: HardwareProfile
    vram: float  # bytes
    host: HostCPU | None = None
    card: GPU | None = None
    ram: float | None = None  # bytes
    disk: float | None = None  # bytes/s

    @property
    def disk_bandwidth(self) -> float:
        return self.disk if self.disk is not None else self.gpu.disk_bandwidth

    @property
    def host_cpu(self) -> HostCPU:
        """The host that prices the host lane: the one given, else the plausible desktop."""
        return self.host if self.host is not None else UNKNOWN_DESKTOP

    @property
    def host_bandwidth(self) -> float:
        return self.host_cpu.dram_delivered

    @property
    def host_flops(self) -> float:
        return self.host_cpu.flops

    @property
    def vram_bandwidth(self) -> float:
        """Datasheet VRAM bandwidth (the profile's effective figure / 0.8 where no datasheet is recorded)."""
        return self.gpu.hbm_datasheet or self.gpu.hbm_bandwidth / 0.8

    @property
    def label(self) -> str:
        gpu = self.card.name if self.card else self.gpu.name
        host = self.host.name if self.host else "a host not given (a desktop DDR4-2666 to DDR5-6400 x2)"
        ram = f" ({self.ram / 2**30:.1f} GiB RAM for weights)" if self.ram is not None else ""
        return f"{gpu} ({self.vram / 2**30:.1f} GiB VRAM) + {host}{ram}"

    @property
    def hardware_name(self) -> str:
        """The profile name an Engine takes for this machine (``get_profile`` resolves ``<gpu>+<host>``)."""
        return self.gpu.name + (f"+{self.host.name}" if self.host else "")


@dataclass(frozen=True)
class TokenTime:
    """ms of one decode token, by where it is spent (``total_ms`` includes ``disk_ms``)."""

    device_ms: float
    link_ms: float
    host_ms: float
    trips_ms: float
    total_ms: float
    disk_ms: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return 1e3 / self.total_ms


def _device_s(m: Machine, fmt: WeightFormat, params: float, kv_bytes: float, kernels: float) -> float:
    """Weights streamed at the format's decode efficiency; the KV cache (16-bit) at bf16's."""
    stream = params * fmt.bytes_per_weight / (m.vram_bandwidth * fmt.gpu_efficiency)
    stream += kv_bytes / (m.vram_bandwidth * FORMATS["bf16"].gpu_efficiency)
    return kernels * m.gpu.kernel_time + max(2.0 * params / m.gpu.peak_flops, stream)


def _host_s(m: Machine, fmt: WeightFormat, params: float, extra_bytes: float, eta: float) -> float:
    return max(2.0 * params / m.host_flops, (params * fmt.bytes_per_weight + extra_bytes) / (m.host_bandwidth * eta))


def price_token(geom: ModelGeometry, prec: WeightPrecision, m: Machine, counts: Counts, context: int,
                eta_host: float = HOST_DECODE_EFFICIENCY, overlap: bool = False, host_layers: int = 0,
                head_on_host: bool = False) -> TokenTime:
    """One decode token's time with experts placed as ``counts`` says. ``host_layers``: the last that many decoder
    layers run whole on the host (llama.cpp ``-ngl`` short of all layers), ``head_on_host`` the LM head too."""
    ops = op_counts(geom.model_type, "grouped_mm", geom.top_k)
    kern = lambda triple: max(1.0, 2.0 * triple[2])  # compiled: two kernels per matmul (cost.piece_time)
    k_dense, k_block, k_head = kern(ops.moe_layer), kern(ops.experts_fixed), kern(ops.head)
    kv = [b * (context if w is None else min(w, context)) for b, w in zip(geom.kv_bytes_per_token, geom.kv_window)]
    on_host = [i >= geom.decoder_layers - host_layers for i in range(geom.decoder_layers)]
    dev = link = host = trips = disk = 0.0
    for i in range(geom.dense_layers):  # dense first layers (DeepSeek): attention + a dense MLP
        per = geom.dense_layer_params / max(1, geom.dense_layers)
        if on_host[i]:
            host += _host_s(m, prec.dense, per, kv[i], eta_host)
        else:
            dev += _device_s(m, prec.dense, per, kv[i], k_dense)
    expert_bytes = geom.expert_params * prec.experts.bytes_per_weight
    for l in range(geom.moe_layers):
        i = geom.dense_layers + l
        if on_host[i]:  # the whole layer on the host: dense part and all its experts
            host += _host_s(m, prec.dense, geom.dense_params_per_moe_layer, kv[i], eta_host)
            host += _host_s(m, prec.experts, geom.top_k * geom.expert_params, 0.0, eta_host)
            continue
        d_dense = _device_s(m, prec.dense, geom.dense_params_per_moe_layer, kv[i], k_dense)
        n_dev = counts.device[l] + counts.copied[l]
        d_exp = _device_s(m, prec.experts, n_dev * geom.expert_params, 0.0, k_block) if n_dev else 0.0
        l_copy = counts.copied[l] * (m.gpu.copy_latency + expert_bytes / m.gpu.pcie_bandwidth)
        h_exp = _host_s(m, prec.experts, counts.host[l] * geom.expert_params, 0.0, eta_host)
        t_trip = counts.host_trips[l] * 2 * m.gpu.copy_latency
        if counts.disk is not None:  # a page fault blocks the read that needs it: serial in either mode
            disk += counts.disk[l] * (m.gpu.disk_latency + expert_bytes / m.disk_bandwidth)
        if overlap:
            slower = max(d_exp + l_copy, h_exp)
            share = (d_exp + l_copy) / slower if slower else 1.0  # attribute the overlapped time to its lane
            dev, link = dev + d_dense + share * d_exp, link + share * l_copy
            host += slower - share * (d_exp + l_copy)
        else:
            dev, link, host = dev + d_dense + d_exp, link + l_copy, host + h_exp
        trips += t_trip
    # a boundary between device and host layers is one round trip
    trips += 2 * m.gpu.copy_latency * (0 < host_layers < geom.decoder_layers)
    if head_on_host:
        host += _host_s(m, prec.dense, geom.head_params, 0.0, eta_host)
    else:
        dev += _device_s(m, prec.dense, geom.head_params, 0.0, k_head)
    total = dev + link + host + trips + disk
    return TokenTime(*(1e3 * float(np.round(x, 12)) for x in (dev, link, host, trips, total, disk)))
