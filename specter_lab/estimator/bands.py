"""Honest bands: what an estimate does not know about the machine, each unknown's range, and the low-high tokens/s
that follows.

Each :class:`Unknown` moves one input of the llama.cpp-class clock (:meth:`Scenario.cost`) to its slow and its
fast end while the others stay central. The band combines the swings in quadrature on a log scale (the
unknowns are independent: a box's DRAM does not set its GPU kernels' efficiency), and the unknown with the widest
single swing is named as the one that dominates. The unknowns:

* **host DRAM bandwidth**: the host's delivered band (:attr:`HostCPU.delivered_band`): a memory description
  spans the published desktop measurements of delivered / peak, a measured figure +/-10 %, a host not given
  the whole desktop range;
* **host matvec efficiency**: the fraction of delivered bandwidth a batch-1 expert matvec reaches: the lowest
  to the highest a single ``fit`` row reproduces (``HOST_EFFICIENCY_RANGE``);
* **GPU format efficiency**: the fraction of datasheet VRAM bandwidth a decode kernel reaches in the weights'
  format: measured on one card for q4_0 / q4_k_m / q2_k (+/-15 % carried to another card), assumed for the
  others (+/-25 %); a laptop part adds its OEM memory clock (``LAPTOP_SPREAD``);
* **backend efficiency**: the format efficiencies are measured with llama.cpp's CUDA backend; on another backend
  (ROCm, Vulkan, Metal, SYCL) nothing here measures them, so the central figure keeps CUDA's and the band spans
  ``BACKEND_RANGE`` of it (said so: never silently borrowed);
* **link bandwidth**: pinned PCIe copies at ``LINK_EFFICIENCY_RANGE`` of raw (only strategies that copy);
* **context depth**: tokens in the KV cache while decoding, when ``depth=`` is not given: from empty (fast) to
  the full ``context`` (slow, the central figure);
* **disk bandwidth**: only where host RAM is short (``ram=``) and experts are read from disk: ``DISK_RANGE``
  when ``disk=`` is not given, a measured figure +/-10 %.

Beside these, two unknowns are read from the row's own replay, not from the clock (``estimator/core.py``): the
draft's **acceptance** (speculative rows), and the **decode length**: a generation longer than the tokens replayed
runs at about the rate the replay's later half ran at (a placement chosen from the prompt goes stale as the
routing drifts; a cache warms), so that rate is the swing's other end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..model.geometry import ModelGeometry
from ..pricing.gpus import LAPTOP_SPREAD, LINK_EFFICIENCY, LINK_EFFICIENCY_RANGE
from ..pricing.llamacpp import LlamaCppCost, cost_of_geometry
from ..pricing.precision import WeightFormat, WeightPrecision
from ..pricing.profiles import HOST_EFFICIENCY_RANGE
from .lanes import Machine

__all__ = ["Scenario", "Unknown", "unknowns", "disk_unknown", "combine", "MEASURED_FORMATS", "FORMAT_SPREAD",
           "DISK_RANGE", "BACKEND_RANGE", "BACKEND_EFFICIENCY", "backend_factor", "on_backend"]

# Reading multi-MB experts from a desktop NVMe drive: a PCIe 3.0 drive to a PCIe 4.0 one (sequential-class reads;
# the central figure is the profile's DISK_BANDWIDTH, 5 GB/s). An assumption, not a measurement.
DISK_RANGE = (2e9, 7e9)
MEASURED_FORMATS = ("q4_0", "q4_k_m", "q2_k", "bf16", "fp16")  # bf16: the profiles' effective/datasheet ratio
FORMAT_SPREAD = {"measured": 0.15, "assumed": 0.25}
MEASURED_ARCH = "pascal"  # the one card the formats' efficiencies were measured on (quantprobe's GTX 1060)
NEWER_ARCH_UPSIDE = 0.35  # another architecture's kernels may reach this much more (an assumption)
# Device time per kernel beyond its bytes: the profiles' KERNEL_TIME is transformers' compiled figure (an A100
# row); llama.cpp launches its graph's kernels faster on a recent card (about 1 us a kernel: an assumption)
KERNEL_RANGE = (1.0e-6, 3.6e-6)
# A backend without a measurement of its own: its kernels' share of what CUDA's reach, from much slower to a little
# faster. Published rows on one card and model disagree by this much between backends (RX 9070 XT gpt-oss-20b:
# ROCm 0.84x of Vulkan, lmstudio-bug-tracker#574; RTX 4090: Vulkan 1.6x an older CUDA build): an assumption.
BACKEND_RANGE = (0.6, 1.1)
# A backend with a fit row of its own (consumer.py's rows with fits="backend"): its kernels' efficiency in the
# weights' format relative to the CUDA-measured figures, the value that row reproduces exactly
# (consumer.derive_backend_efficiency(); tests/test_consumer.py checks they still match). Banded +/-15 %, as a
# format measured on one card.
BACKEND_EFFICIENCY = {("amd", "vulkan"): 1.098, ("amd", "rocm"): 0.931, ("apple", "metal"): 1.123}
BACKEND_SPREAD = 0.15


def backend_factor(m: Machine) -> tuple[float, bool]:
    """(the machine's backend efficiency relative to the CUDA-measured formats, whether a fit row measured it):
    the card's architecture's own where a row fitted one, else its vendor and backend's, else CUDA's (1.0)."""
    vendor = m.card.vendor if m.card is not None else "nvidia"
    arch = m.card.arch if m.card is not None else ""
    for key in ((vendor, m.backend_name, arch), (vendor, m.backend_name)):
        if key in BACKEND_EFFICIENCY:
            return BACKEND_EFFICIENCY[key], True
    return 1.0, m.backend_name == "cuda"


def on_backend(p: WeightPrecision, m: Machine) -> WeightPrecision:
    """``p`` with its efficiencies on the machine's backend (CUDA's, scaled by the backend's fitted factor)."""
    f, _ = backend_factor(m)
    return p if f == 1.0 else WeightPrecision(_scale_format(p.experts, f), _scale_format(p.dense, f))


@dataclass(frozen=True)
class Scenario:
    """The inputs one pricing reads: the machine, the weights' formats, host efficiency, KV depth."""

    machine: Machine
    precision: WeightPrecision
    eta: float
    depth: int

    def cost(self, geom: ModelGeometry, gpu_layers: "int | None" = None) -> LlamaCppCost:
        """The llama.cpp-class clock of this scenario for ``geom``'s model (what its replay prices with)."""
        return cost_of_geometry(geom, self.machine.profile(self.eta), self.precision, self.depth, gpu_layers)


@dataclass(frozen=True)
class Unknown:
    """One input the estimate does not know: its slow and fast scenarios, and why it spans what it spans."""

    name: str
    slow: Scenario
    fast: Scenario
    why: str


def _scale_format(f: WeightFormat, s: float) -> WeightFormat:
    return replace(f, gpu_efficiency=f.gpu_efficiency * s)


def _with_host(m: Machine, delivered: float) -> Machine:
    return replace(m, host=replace(m.host_cpu, dram_delivered=delivered))


def unknowns(c: Scenario, context: int, depth_given: bool) -> list[Unknown]:
    """The unknowns of an estimate centred on ``c`` (``context``: the KV cache's size)."""
    m, p = c.machine, c.precision
    out = []
    lo, hi = m.host_cpu.delivered_band
    if hi > lo:
        why = (m.host_cpu.source if m.host is None else
               f"{m.host_cpu.name}: {lo / 1e9:.0f}-{hi / 1e9:.0f} GB/s delivered")
        out.append(Unknown("host DRAM bandwidth", replace(c, machine=_with_host(m, lo)),
                           replace(c, machine=_with_host(m, hi)), why))
    e_lo, e_hi = HOST_EFFICIENCY_RANGE
    out.append(Unknown("host matvec efficiency", replace(c, eta=e_lo), replace(c, eta=e_hi),
                       f"{e_lo}-{e_hi} of delivered bandwidth: the lowest and highest a single fit row reproduces"))
    measured = p.experts.name in MEASURED_FORMATS and p.dense.name in MEASURED_FORMATS
    spread = FORMAT_SPREAD["measured" if measured else "assumed"]
    laptop = bool(m.card and m.card.laptop)
    # measured on one Pascal card: a newer architecture's kernels may reach more (never past the datasheet)
    newer = m.card is not None and m.card.arch != MEASURED_ARCH
    s_lo = (1 - spread) * ((1 - LAPTOP_SPREAD) if laptop else 1.0)
    s_hi = min((1 + spread + (NEWER_ARCH_UPSIDE if newer else 0.0)) * ((1 + LAPTOP_SPREAD) if laptop else 1.0),
               1.0 / max(p.experts.gpu_efficiency, p.dense.gpu_efficiency))
    slow_p = WeightPrecision(_scale_format(p.experts, s_lo), _scale_format(p.dense, s_lo))
    fast_p = WeightPrecision(_scale_format(p.experts, s_hi), _scale_format(p.dense, s_hi))
    out.append(Unknown("GPU format efficiency", replace(c, precision=slow_p), replace(c, precision=fast_p),
                       f"{p.label}: {'measured on one card' if measured else 'assumed'}, +/-{spread:.0%}"
                       + (f" (up to +{spread + NEWER_ARCH_UPSIDE:.0%} on {m.card.arch}: measured on {MEASURED_ARCH})"
                          if newer else "")
                       + (f", laptop memory clock +/-{LAPTOP_SPREAD:.0%}" if laptop else "")))
    k_lo, k_hi = KERNEL_RANGE
    if m.gpu.kernel_time != k_lo:
        out.append(Unknown("kernel overhead", replace(c, machine=replace(m, gpu=replace(m.gpu, kernel_time=max(
            k_hi, m.gpu.kernel_time)))), replace(c, machine=replace(m, gpu=replace(m.gpu, kernel_time=k_lo))),
            f"{k_lo * 1e6:g}-{max(k_hi, m.gpu.kernel_time) * 1e6:g} us a kernel: the central is transformers' "
            "compiled figure; llama.cpp's CUDA graphs launch faster on a recent card"))
    f, fitted = backend_factor(m)
    if m.backend_name != "cuda" or f != 1.0:
        lo, hi = (1 - BACKEND_SPREAD, 1 + BACKEND_SPREAD) if fitted else BACKEND_RANGE
        why = (f"{m.backend_name} on {m.card.vendor if m.card else 'this GPU'}: {f:.2f}x CUDA's efficiency, fitted on one "
               f"published row, +/-{BACKEND_SPREAD:.0%}" if fitted else
               f"{m.backend_name}: no measurement of its kernels here; the central figure keeps CUDA's, the band "
               f"{lo}-{hi} of it")
        out.append(Unknown("backend efficiency",
                           replace(c, precision=WeightPrecision(_scale_format(p.experts, lo), _scale_format(p.dense, lo))),
                           replace(c, precision=WeightPrecision(_scale_format(p.experts, hi), _scale_format(p.dense, hi))),
                           why))
    link = lambda r: replace(m, gpu=replace(m.gpu, pcie_bandwidth=m.gpu.pcie_bandwidth * r / LINK_EFFICIENCY))
    out.append(Unknown("link bandwidth", replace(c, machine=link(LINK_EFFICIENCY_RANGE[0])),
                       replace(c, machine=link(LINK_EFFICIENCY_RANGE[1])),
                       f"pinned copies at {LINK_EFFICIENCY_RANGE[0]}-{LINK_EFFICIENCY_RANGE[1]} of raw PCIe"))
    if not depth_given:
        out.append(Unknown("context depth", replace(c, depth=context), replace(c, depth=0),
                           f"depth not given: KV cache from empty to the full {context} tokens"))
    return out


def disk_unknown(c: Scenario) -> Unknown:
    """The disk's read bandwidth, for an estimate that reads experts from disk: the given figure +/-10 %, else
    ``DISK_RANGE``."""
    m = c.machine
    lo, hi = (m.disk * 0.9, m.disk * 1.1) if m.disk is not None else DISK_RANGE
    why = (f"measured {m.disk / 1e9:.1f} GB/s +/-10 %" if m.disk is not None else
           f"disk not given: {lo / 1e9:.0f}-{hi / 1e9:.0f} GB/s, a PCIe 3.0 to a PCIe 4.0 NVMe drive")
    return Unknown("disk bandwidth", replace(c, machine=replace(m, disk=lo)), replace(c, machine=replace(m, disk=hi)),
                   why)


def combine(central: float, swings: dict[str, tuple[float, float]]) -> tuple[float, float, str]:
    """(low, high, dominant) tokens/s: each unknown's (slow, fast) tokens/s combined in quadrature on a log scale;
    ``dominant`` the unknown with the widest swing (none: "")."""
    lo2 = sum(math.log(central / max(1e-12, s)) ** 2 for s, _ in swings.values() if s < central)
    hi2 = sum(math.log(max(1e-12, f) / central) ** 2 for _, f in swings.values() if f > central)
    width = {k: math.log(max(f, central) / max(1e-12, min(s, central))) for k, (s, f) in swings.items()}
    dominant = max(width, key=width.get) if width and max(width.values()) > 1e-6 else ""
    return central * math.exp(-math.sqrt(lo2)), central * math.exp(math.sqrt(hi2)), dominant
