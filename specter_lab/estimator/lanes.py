"""A decode token's time by lane, in closed form, for a placement given as counts: where each routed expert of a
token runs (resident on the device, copied then computed there, computed on the host), per MoE layer.

The prices are the llama.cpp-class engine's own pieces (:class:`~specter_lab.pricing.llamacpp.LlamaCppCost`, the
clock every estimate replays on), summed per layer one after the other::

    layer = dense part + experts on the device + copies + experts on the host + a round trip if any ran there

``overlap=True`` (ktransformers: the host's experts run while the device computes its own) prices a layer as
dense part + max(device experts + copies, host experts) + round trip. For a static placement (every expert of a
layer always in the same place: everything resident, whole layers' experts on the host, llama.cpp's ``-ngl``)
this *is* the replay's time on that clock (``tests/test_estimate.py`` holds them equal), so it prices the published
rows (:mod:`.consumer`) and moves an estimate's band (:mod:`.bands`) without replaying at every unknown's end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..caching.simulate import simulate
from ..model.geometry import ModelGeometry
from ..pricing.gpus import GPU
from ..pricing.hosts import UNKNOWN_DESKTOP
from ..pricing.llamacpp import LlamaCppCost
from ..pricing.profiles import HardwareProfile, HostCPU

__all__ = ["Machine", "TokenTime", "Counts", "price_token", "resident", "static_layers", "hot_set", "uniform_hot_set"]


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
    backend: str | None = None  # llama.cpp's backend (cuda, rocm, vulkan, metal, sycl); None: the card's first

    @property
    def backend_name(self) -> str:
        """The backend that runs the GPU's kernels: the one given, else the card's first (CUDA on NVIDIA)."""
        if self.backend:
            return self.backend
        return self.card.backends[0] if self.card is not None else "cuda"

    @property
    def disk_bandwidth(self) -> float:
        return self.disk if self.disk is not None else self.gpu.disk_bandwidth

    @property
    def host_cpu(self) -> HostCPU:
        """The host that prices the host lane: the one given, else the plausible desktop."""
        return self.host if self.host is not None else UNKNOWN_DESKTOP

    @property
    def vram_bandwidth(self) -> float:
        """Datasheet VRAM bandwidth (the profile's effective figure / 0.8 where no datasheet is recorded)."""
        return self.gpu.hbm_datasheet or self.gpu.hbm_bandwidth / 0.8

    @property
    def label(self) -> str:
        gpu = self.card.name if self.card else self.gpu.name
        if self.card is not None and self.card.unified_memory:
            return (f"{gpu} ({self.vram / 2**30:.1f} GiB of {self.card.vram_gb:g} GiB unified memory for the GPU, "
                    f"{self.backend_name})")
        host = self.host.name if self.host else "a host not given (a desktop DDR4-2666 to DDR5-6400 x2)"
        ram = f" ({self.ram / 2**30:.1f} GiB RAM for weights)" if self.ram is not None else ""
        return f"{gpu} ({self.vram / 2**30:.1f} GiB VRAM) + {host}{ram}"

    @property
    def hardware_name(self) -> str:
        """The profile name an Engine takes for this machine (``get_profile`` resolves ``<gpu>+<host>``)."""
        return self.gpu.name + (f"+{self.host.name}" if self.host else "")

    def profile(self, eta: float) -> HardwareProfile:
        """This machine as the llama.cpp-class clock prices it: the GPU's profile with the host's delivered DRAM
        and FLOP/s, the host matvec efficiency ``eta`` and the disk's bandwidth (``<gpu>+<host>@llama.cpp``)."""
        h = self.host_cpu
        return replace(self.gpu, name=self.hardware_name, cpu_mem_bandwidth=h.dram_delivered, cpu_flops=h.flops,
                       host_efficiency=eta, disk_bandwidth=self.disk_bandwidth, execution="llama.cpp")


@dataclass(frozen=True)
class TokenTime:
    """ms of one decode token, by lane (``total_ms`` includes ``disk_ms``)."""

    device_ms: float
    link_ms: float
    host_ms: float
    trips_ms: float
    total_ms: float
    disk_ms: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return 1e3 / self.total_ms


@dataclass(frozen=True)
class Counts:
    """Per MoE layer, mean per decode token: experts computed on the device from resident weights, copied then
    computed on the device, computed on the host; ``host_trips`` the share of tokens whose layer hands work to the
    host; ``disk`` how many of the copied and host ones are first read from disk (None: none)."""

    device: np.ndarray
    copied: np.ndarray
    host: np.ndarray
    host_trips: np.ndarray
    disk: "np.ndarray | None" = None

    @property
    def hit_rate(self) -> float:
        total = float((self.device + self.copied + self.host).sum())
        return float(self.device.sum()) / total if total else 1.0


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


def hot_set(routing: np.ndarray, slots: int, warmup: int) -> Counts:
    """``slots`` fixed experts per layer on the device (the most routed of the first ``warmup`` tokens), every
    other routed expert on the host (ktransformers' GPU experts, Fiddler): the cache simulator's static pool."""
    keep = {}
    for layer in range(routing.shape[1]):
        freq = np.bincount(routing[:warmup, layer].ravel(), minlength=routing.max() + 1)
        keep[layer] = np.argsort(-freq, kind="stable")[:slots].tolist()
    s = simulate(routing, slots, policy="static", initial=keep, warmup=warmup)
    n = max(1, s.steps)
    return _counts(s.hits / n, s.loads / n, s.bypassed / n, s.bypass_steps / n)


def uniform_hot_set(g: ModelGeometry, gpu_experts: int) -> Counts:
    """Experts fixed on the GPU without a routing profile: each routed expert is on the GPU with probability
    E_gpu / E (ktransformers' ``--kt-num-gpu-experts`` by index)."""
    share = min(1.0, gpu_experts / g.num_experts)
    L, k = g.moe_layers, g.top_k
    dev = np.full(L, k * share)
    return Counts(dev, np.zeros(L), k - dev, np.full(L, 1.0 - share ** k))


def price_token(cost: LlamaCppCost, counts: Counts, top_k: int, context: int = 0,
                overlap: bool = False) -> TokenTime:
    """One decode token's time with experts placed as ``counts`` says, at ``context`` tokens in the KV cache (the
    cost's ``depth`` when it has one), on ``cost``'s clock (module docstring). A layer ``gpu_layers`` leaves on the
    host runs whole there: its ``top_k`` experts too, whatever ``counts`` says."""
    dev = link = host = trips = disk = 0.0
    copy = cost.copy_time(cost.expert_bytes)
    on_dev, on_host = cost.expert_time(1), cost.host_expert_time(1)
    read = cost.disk_time(cost.expert_bytes)
    for l in range(len(counts.device)):
        d_dense = cost.dense_layer_time(1, context, l)
        if cost.layer_on_host(l):
            host += d_dense + top_k * on_host
            continue
        d_exp = (counts.device[l] + counts.copied[l]) * on_dev
        l_copy = counts.copied[l] * copy
        h_exp = counts.host[l] * on_host
        if counts.disk is not None:  # a page fault blocks the read that needs it: serial either way
            disk += counts.disk[l] * read
        if overlap:
            slower = max(d_exp + l_copy, h_exp)
            share = (d_exp + l_copy) / slower if slower else 1.0  # attribute the overlapped time to its lane
            dev, link = dev + d_dense + share * d_exp, link + share * l_copy
            host += slower - share * (d_exp + l_copy)
        else:
            dev, link, host = dev + d_dense + d_exp, link + l_copy, host + h_exp
        trips += counts.host_trips[l] * cost.host_trip_time(l)
    h_dev, h_host, h_trip = cost.head_parts(1, context)
    dev, host, trips = dev + h_dev, host + h_host, trips + h_trip
    total = dev + link + host + trips + disk
    return TokenTime(*(1e3 * float(np.round(x, 12)) for x in (dev, link, host, trips, total, disk)))
