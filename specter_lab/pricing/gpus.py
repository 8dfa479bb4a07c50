"""Every common GPU as the estimator sees it: datasheet VRAM, memory bandwidth, PCIe generation x lanes, shader
FP32 rate, and where each number comes from.

The data are keyword rows, one per card (the way gpt-fast keeps its model-name tables), grouped by family with
the NVIDIA spec page the family's numbers come from. Memory bandwidth is stored as NVIDIA's pages give it, the
memory interface width (bits) and data rate (Gbps per pin), so each figure can be checked by hand:
bandwidth = bits / 8 x Gbps (RTX 3060 12GB: 192 / 8 x 15 = 360 GB/s). ``tflops`` (FP32 shader rate at boost
clock) only prices prefill, which is compute-bound; decode at batch 1 is bandwidth-bound and never reads it.

Laptop parts: NVIDIA's laptop pages give the memory size, type and interface; the memory clock (and the PCIe
lanes) are the OEM's. The row holds the common clock, and an estimate on a laptop part widens its VRAM-bandwidth
band (``LAPTOP_SPREAD``). The FP32 rates of the laptop and RTX PRO Blackwell rows are approximate (prefill only).
The rows were entered from the vendors' pages as published, not fetched when this file was written (no network
on the build machine): a number found wrong is a one-line fix, with its source.

Other vendors (``vendor``, ``backends``): AMD Radeon RX 6000/7000/9000 and Radeon PRO (ROCm/HIP and Vulkan builds of
llama.cpp), Intel Arc A/B and Arc Pro (SYCL and Vulkan), Apple M1-M4 (Metal). AMD and Intel rows state memory as
AMD/Intel do (bus width x data rate), FP32 at boost clock as the vendor's "peak single precision" figure (RDNA3/RDNA4:
the dual-issue figure AMD quotes). ``tensor_cores`` marks matrix units llama.cpp can use for prefill GEMMs: RDNA3/RDNA4
WMMA (HIP MMQ/rocWMMA flash attention, Vulkan KHR_coopmat where the driver exposes it), Intel XMX (SYCL oneDNN/oneMKL
GEMM, Vulkan coopmat on Battlemage); RDNA2 has none. Which backend a user runs, and how much of the datasheet bandwidth
it reaches, is not a catalog number: ``backends`` lists what runs on the card, nothing more.

Apple Silicon rows are unified memory (``unified_memory=True``): one row per memory size Apple sells for the chip
(keyed ``m4max-64gb`` like the other "-<N>gb" rows; for the Max chips the size also picks the GPU bin and with it
the bandwidth), the bandwidth as Apple states it, no PCIe link (``pcie_gen == pcie_lanes == 0``, ``link_raw == 0``).
``vram_gb`` is the whole unified memory: macOS lets the GPU wire only part of it (Metal's recommended working set,
about 2/3-3/4 by default), which is the estimator's business, not the catalog's. Apple publishes GPU TFLOPS for M1/M2
only; the M3/M4 figures are approximate (cores x 128 FP32 lanes x 2 x clock, secondary sources), prefill only.

:func:`specter_lab.pricing.profiles.gpu_profile` turns a row into the :class:`~specter_lab.pricing.profiles.HardwareProfile` the cost model
prices (effective link = raw PCIe x ``LINK_EFFICIENCY``, effective VRAM = 0.8 x datasheet as the hand-set
profiles do); a card that already has a hand-set profile (the GPUs of the published rows) returns that one.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

GB = 1e9

__all__ = ["GPU", "CARDS", "GPU_FAMILIES", "find_gpu", "LINK_EFFICIENCY", "LINK_EFFICIENCY_RANGE", "LAPTOP_SPREAD", "PCIE_LANE_GBPS"]

GiB = 2**30
# Raw PCIe bandwidth per lane and direction, GB/s (128b/130b encoding): 3.0 8 GT/s, 4.0 16 GT/s, 5.0 32 GT/s.
# Generation 0: no PCIe link (Apple unified memory); GPU.link_raw is 0 there.
PCIE_LANE_GBPS = {0: 0.0, 3: 0.985, 4: 1.969, 5: 3.938}
# Pinned cudaMemcpyAsync reaches ~0.76-0.79 of raw on the hand-set profiles (12 of 15.75 GB/s on PCIe 3.0 x16,
# 25 of 31.5 on 4.0 x16, 50 of 63 on 5.0 x16); the band spans what bandwidthTest reports on healthy desktops.
LINK_EFFICIENCY = 0.78
LINK_EFFICIENCY_RANGE = (0.70, 0.85)
LAPTOP_SPREAD = 0.12  # +/- on a laptop part's VRAM bandwidth: the OEM sets the memory clock

_NV = "https://www.nvidia.com/en-us/"
_GF = _NV + "geforce/graphics-cards/"
_TPU = "cross-checked against the TechPowerUp GPU database"
_AMD = "https://www.amd.com/en/products/graphics/desktops/radeon/"
_INTEL = "https://www.intel.com/content/www/us/en/products/docs/discrete-gpus/arc/desktop/"
_APPLE = "https://support.apple.com/en-us/specs"
# One source per family: NVIDIA's spec page (memory size, interface width, memory type/speed, PCIe).
SOURCES = {
    "gtx10": _GF + "compare/?section=compare-specs (GeForce 10 series specs)",
    "gtx16": _GF + "gtx-1660-super/ and the GTX 16 series compare page",
    "rtx20": _GF + "compare/?section=compare-20 (GeForce RTX 20 series specs)",
    "rtx30": _GF + "30-series/ (rtx-3050, rtx-3060-3060ti, rtx-3070-3070ti, rtx-3080-3080ti, rtx-3090-3090ti)",
    "rtx40": _GF + "40-series/ (rtx-4060-4060ti, rtx-4070-family, rtx-4080-family, rtx-4090)",
    "rtx50": _GF + "50-series/ (rtx-5050, rtx-5060-family, rtx-5070-family, rtx-5080, rtx-5090)",
    "laptop30": _NV + "geforce/laptops/30-series/ (memory size and interface; clock set by the OEM)",
    "laptop40": _NV + "geforce/laptops/40-series/ (memory size and interface; clock set by the OEM)",
    "laptop50": _NV + "geforce/laptops/50-series/ (memory size and interface; clock set by the OEM)",
    "ampere-pro": _NV + "design-visualization/ (rtx-a2000, rtx-a4000, rtx-a4500, rtx-a5000, rtx-a5500, rtx-a6000 "
                        "datasheets: memory bandwidth stated)",
    "ada-pro": _NV + "design-visualization/ (rtx-2000, rtx-4000, rtx-4500, rtx-5000, rtx-6000 Ada datasheets)",
    "blackwell-pro": _NV + "products/workstations/ (RTX PRO 4000/4500/5000/6000 Blackwell datasheets)",
    "turing-pro": _NV + "design-visualization/quadro/ (Quadro RTX 4000/5000/6000/8000 datasheets)",
    "amd-pro": "https://www.amd.com/en/products/graphics/workstations/radeon-pro/w7800.html (AMD spec page: 48 GB "
               "GDDR6, 256-bit, 864 GB/s, PCIe 4.0 x16); in the catalog because a published row runs on it",
    "datacenter": _NV + "data-center/ (T4, A10, A40, L4, L40, L40S, A100, H100, H200 datasheets: bandwidth stated; "
                        "P40/P100/V100 from the Tesla datasheets)",
    # ---- added for issue 53. Entered from the vendors' spec pages as remembered (no network on the build machine),
    # except where a stored copy was read: each family says which. A number found wrong is a one-line fix.
    "amd-rdna2": _AMD + "6000-series/ (amd-radeon-rx-6600, -6600-xt, -6650-xt, -6700-xt, -6750-xt, -6800, -6800-xt, "
                        "-6900-xt, -6950-xt spec pages: memory size, interface, effective memory speed, bandwidth, "
                        "PCIe 4.0 x8 on the 66x0 cards, peak single precision at boost); from memory of those pages, "
                        "not re-read here",
    "amd-rdna3": _AMD + "7000-series/ (amd-radeon-rx-7600, -7600-xt, -7700-xt, -7800-xt, -7900-gre, -7900xt, -7900xtx "
                        "spec pages; PCIe 4.0 x8 on the 7600/7600 XT; FP32 is AMD's dual-issue peak); from memory of "
                        "those pages, not re-read here (the 7900 XT's 20 GB agrees with the 19.98 GB that llmfit's "
                        "community files record for it)",
    "amd-rdna4": _AMD + "9000-series/ (amd-radeon-rx-9060xt, -9070, -9070xt spec pages); RX 9060 XT cross-checked "
                        "against a stored TechPowerUp review "
                        "(techpowerup.com/review/asus-radeon-rx-9060-xt-prime-oc-16-gb: 128-bit 20 Gbps GDDR6, 320 "
                        "GB/s) and AMD's launch figures as reported (PCIe 5.0 x16, 25.6 TFLOPS at 3.13 GHz boost); RX "
                        "9070/9070 XT from memory of AMD's pages",
    "amd-rdna3-pro": "https://www.amd.com/en/products/graphics/workstations/radeon-pro/w7900.html (AMD spec page: 48 "
                     "GB GDDR6 ECC, 384-bit, 864 GB/s, PCIe 4.0 x16, 61.3 TFLOPS FP32); from memory of that page",
    "intel-arc-a": _INTEL + "a-series/ and the Arc A380/A580/A750/A770 ark pages (memory size, interface, speed, "
                            "bandwidth, PCIe 4.0 x8 on the A380; FP32 = Xe cores x 128 lanes x 2 x graphics clock); "
                            "from memory of those pages, not re-read here",
    "intel-arc-b": _INTEL + "b-series/ and the Arc B570/B580 ark pages (both PCIe 4.0 x8); from memory of those "
                            "pages, not re-read here",
    "intel-arc-pro": "https://www.intel.com/content/www/us/en/products/docs/discrete-gpus/arc/workstations/"
                     "b-series/overview.html (Arc Pro B50 16 GB 128-bit, B60 24 GB 192-bit, both PCIe 5.0 x8); "
                     "B50 clock and FP32 (2600 MHz, 10.65 TFLOPS) cross-checked against stored spec-aggregator pages "
                     "(chipversus.com, hmc-tech.com); B60 from memory",
    "apple-m1": _APPLE + " (MacBook Air/Pro M1, MacBook Pro 14/16 M1 Pro/Max, Mac Studio M1 Max/Ultra tech specs) and "
                         "the Apple newsroom launch posts: unified memory sizes sold, memory bandwidth as Apple "
                         "states it (68.25 / 200 / 400 / 800 GB/s), GPU TFLOPS as Apple states them (2.6 / 5.2 / 10.4 "
                         "/ 21; the 48-core Ultra scaled by core count); from memory of those pages",
    "apple-m2": _APPLE + " (MacBook Air M2, MacBook Pro M2 Pro/Max, Mac Studio M2 Ultra tech specs) and newsroom "
                         "posts: 100 / 200 / 400 / 800 GB/s, GPU TFLOPS as Apple states them (3.6 / 6.8 / 13.6 / "
                         "27.2; the 60-core Ultra scaled by core count); from memory of those pages",
    "apple-m3": _APPLE + " (MacBook Air/Pro M3, MacBook Pro M3 Pro/Max, Mac Studio M3 Ultra tech specs) and newsroom "
                         "posts: 100 / 150 / 300 (30-core GPU) or 400 (40-core GPU) / 819 GB/s; Apple publishes no "
                         "TFLOPS for M3: the figures are approximate (secondary sources; smaller GPU bins scaled by "
                         "core count), prefill only; from memory",
    "apple-m4": _APPLE + " (MacBook Air/Pro M4, Mac mini/MacBook Pro M4 Pro, MacBook Pro/Mac Studio M4 Max tech "
                         "specs) and newsroom posts: 120 / 273 / 410 (32-core GPU) or 546 (40-core GPU) GB/s; there "
                         "is no M4 Ultra (the 2025 Mac Studio pairs M4 Max with M3 Ultra); Apple publishes no TFLOPS "
                         "for M4: approximate (secondary sources; the 32-core Max scaled by core count), prefill "
                         "only; from memory",
}


@dataclass(frozen=True)
class GPU:
    """One card of the catalog: datasheet numbers and their source."""

    key: str  # catalog id: family name, then "-<N>gb" where a family sells several memory sizes
    name: str
    vram_gb: float  # marketed memory size (GiB of physical memory)
    bandwidth_gbs: float  # datasheet memory bandwidth
    pcie_gen: int
    pcie_lanes: int
    tflops: float  # FP32 shader TFLOPS at boost clock (prefill only)
    arch: str
    source: str
    laptop: bool = False
    tensor_cores: bool = True
    profile: str | None = None  # a hand-set profile in PROFILES stands for this card
    memory: str = ""
    vendor: str = "nvidia"  # nvidia | amd | intel | apple
    backends: tuple[str, ...] = ("cuda", "vulkan")  # llama.cpp backends that run on the card
    unified_memory: bool = False  # GPU and host share one memory (Apple): no PCIe link, vram_gb is the whole memory

    @property
    def family(self) -> str:
        return re.sub(r"-\d+gb$", "", self.key)

    @property
    def pcie(self) -> str:
        if not self.pcie_gen:
            return "no PCIe link (unified memory)"
        return f"PCIe {self.pcie_gen}.0 x{self.pcie_lanes}"

    @property
    def link_raw(self) -> float:
        """Raw host-to-device bandwidth, bytes/s (0 for unified memory: there is no link to cross)."""
        if not self.pcie_gen or not self.pcie_lanes:
            return 0.0
        return PCIE_LANE_GBPS.get(self.pcie_gen, 0.0) * self.pcie_lanes * GB


def _row(key, name, vram, src, arch, pcie, tflops, bus=None, gbps=None, bw=None, mem="GDDR6", note="", **kw) -> GPU:
    """A catalog row: bandwidth from bus width x data rate (as NVIDIA's pages state them), or as stated (``bw``).
    ``pcie`` is "<gen>x<lanes>", or "none" for unified memory (no link)."""
    gen, lanes = (0, 0) if pcie == "none" else (int(x) for x in pcie.split("x"))
    bandwidth = bw if bw is not None else bus / 8 * gbps
    memory = f"{vram} GB {mem}" + (f", {bus}-bit at {gbps:g} Gbps" if bus else "") + (f"; {note}" if note else "")
    # the rows added for issue 53 say in their own SOURCES text what was cross-checked, and against what
    source = SOURCES[src] if src.startswith(("amd-rdna", "intel-", "apple-")) else SOURCES[src] + "; " + _TPU
    return GPU(key, name, float(vram), float(bandwidth), gen, lanes, float(tflops), arch, source, memory=memory, **kw)


def _amd(*a, **kw) -> GPU:
    """An AMD Radeon row: ROCm (HIP) and Vulkan builds of llama.cpp."""
    return _row(*a, vendor="amd", backends=("rocm", "vulkan"), **kw)


def _intel(*a, **kw) -> GPU:
    """An Intel Arc row: SYCL and Vulkan builds of llama.cpp."""
    return _row(*a, vendor="intel", backends=("sycl", "vulkan"), **kw)


def _apple(key, name, mem_gb, src, arch, bw, tflops, mem, note="") -> GPU:
    """An Apple Silicon row: unified memory of ``mem_gb``, bandwidth as Apple states it, Metal, no PCIe link."""
    return _row(key, name, mem_gb, src, arch, "none", tflops, bw=bw, mem=mem, note=note, vendor="apple",
                backends=("metal",), unified_memory=True)


_ROWS: list[GPU] = [
    # ---- GeForce 10 / 16 (Pascal, Turing without tensor cores): llama.cpp decodes them in fp32 / dp4a
    _row("gtx1060", "GeForce GTX 1060 6GB", 6, "gtx10", "pascal", "3x16", 4.4, 192, 8, mem="GDDR5",
         tensor_cores=False, profile="gtx1060-pcie3"),
    _row("gtx1070", "GeForce GTX 1070", 8, "gtx10", "pascal", "3x16", 6.5, 256, 8, mem="GDDR5", tensor_cores=False),
    _row("gtx1080", "GeForce GTX 1080", 8, "gtx10", "pascal", "3x16", 8.9, 256, 10, mem="GDDR5X", tensor_cores=False),
    _row("gtx1080ti", "GeForce GTX 1080 Ti", 11, "gtx10", "pascal", "3x16", 11.3, 352, 11, mem="GDDR5X",
         tensor_cores=False),
    _row("gtx1650", "GeForce GTX 1650 (GDDR5)", 4, "gtx16", "turing", "3x16", 3.0, 128, 8, mem="GDDR5",
         tensor_cores=False),
    _row("gtx1660", "GeForce GTX 1660", 6, "gtx16", "turing", "3x16", 5.0, 192, 8, mem="GDDR5", tensor_cores=False),
    _row("gtx1660super", "GeForce GTX 1660 SUPER", 6, "gtx16", "turing", "3x16", 5.0, 192, 14, tensor_cores=False),
    _row("gtx1660ti", "GeForce GTX 1660 Ti", 6, "gtx16", "turing", "3x16", 5.4, 192, 12, tensor_cores=False),
    # ---- GeForce RTX 20 (Turing), PCIe 3.0 x16
    _row("rtx2060-6gb", "GeForce RTX 2060 6GB", 6, "rtx20", "turing", "3x16", 6.5, 192, 14),
    _row("rtx2060-12gb", "GeForce RTX 2060 12GB", 12, "rtx20", "turing", "3x16", 7.2, 192, 14),
    _row("rtx2060super", "GeForce RTX 2060 SUPER", 8, "rtx20", "turing", "3x16", 7.2, 256, 14),
    _row("rtx2070", "GeForce RTX 2070", 8, "rtx20", "turing", "3x16", 7.5, 256, 14),
    _row("rtx2070super", "GeForce RTX 2070 SUPER", 8, "rtx20", "turing", "3x16", 9.1, 256, 14),
    _row("rtx2080", "GeForce RTX 2080", 8, "rtx20", "turing", "3x16", 10.1, 256, 14, profile="rtx2080-pcie3"),
    _row("rtx2080super", "GeForce RTX 2080 SUPER", 8, "rtx20", "turing", "3x16", 11.2, 256, 15.5),
    _row("rtx2080ti", "GeForce RTX 2080 Ti", 11, "rtx20", "turing", "3x16", 13.4, 352, 14),
    _row("titanrtx", "TITAN RTX", 24, "rtx20", "turing", "3x16", 16.3, 384, 14),
    # ---- GeForce RTX 30 (Ampere), PCIe 4.0 (the 3050 x8)
    _row("rtx3050-8gb", "GeForce RTX 3050 8GB", 8, "rtx30", "ampere", "4x8", 9.1, 128, 14),
    _row("rtx3050-6gb", "GeForce RTX 3050 6GB", 6, "rtx30", "ampere", "4x8", 6.8, 96, 14),
    _row("rtx3060-12gb", "GeForce RTX 3060 12GB", 12, "rtx30", "ampere", "4x16", 12.7, 192, 15),
    _row("rtx3060-8gb", "GeForce RTX 3060 8GB", 8, "rtx30", "ampere", "4x16", 12.7, 128, 15),
    _row("rtx3060ti", "GeForce RTX 3060 Ti (GDDR6)", 8, "rtx30", "ampere", "4x16", 16.2, 256, 14),
    _row("rtx3060tigddr6x", "GeForce RTX 3060 Ti GDDR6X", 8, "rtx30", "ampere", "4x16", 16.2, 256, 19, mem="GDDR6X"),
    _row("rtx3070", "GeForce RTX 3070", 8, "rtx30", "ampere", "4x16", 20.3, 256, 14),
    _row("rtx3070ti", "GeForce RTX 3070 Ti", 8, "rtx30", "ampere", "4x16", 21.7, 256, 19, mem="GDDR6X"),
    _row("rtx3080-10gb", "GeForce RTX 3080 10GB", 10, "rtx30", "ampere", "4x16", 29.8, 320, 19, mem="GDDR6X"),
    _row("rtx3080-12gb", "GeForce RTX 3080 12GB", 12, "rtx30", "ampere", "4x16", 30.6, 384, 19, mem="GDDR6X"),
    _row("rtx3080ti", "GeForce RTX 3080 Ti", 12, "rtx30", "ampere", "4x16", 34.1, 384, 19, mem="GDDR6X"),
    _row("rtx3090", "GeForce RTX 3090", 24, "rtx30", "ampere", "4x16", 35.6, 384, 19.5, mem="GDDR6X",
         profile="rtx3090-pcie4"),
    _row("rtx3090ti", "GeForce RTX 3090 Ti", 24, "rtx30", "ampere", "4x16", 40.0, 384, 21, mem="GDDR6X"),
    # ---- GeForce RTX 40 (Ada), PCIe 4.0 (the 4060 / 4060 Ti x8)
    _row("rtx4060", "GeForce RTX 4060", 8, "rtx40", "ada", "4x8", 15.1, 128, 17),
    _row("rtx4060ti-8gb", "GeForce RTX 4060 Ti 8GB", 8, "rtx40", "ada", "4x8", 22.1, 128, 18),
    _row("rtx4060ti-16gb", "GeForce RTX 4060 Ti 16GB", 16, "rtx40", "ada", "4x8", 22.1, 128, 18),
    _row("rtx4070", "GeForce RTX 4070", 12, "rtx40", "ada", "4x16", 29.1, 192, 21, mem="GDDR6X"),
    _row("rtx4070super", "GeForce RTX 4070 SUPER", 12, "rtx40", "ada", "4x16", 35.5, 192, 21, mem="GDDR6X"),
    _row("rtx4070ti", "GeForce RTX 4070 Ti", 12, "rtx40", "ada", "4x16", 40.1, 192, 21, mem="GDDR6X"),
    _row("rtx4070tisuper", "GeForce RTX 4070 Ti SUPER", 16, "rtx40", "ada", "4x16", 44.1, 256, 21, mem="GDDR6X"),
    _row("rtx4080", "GeForce RTX 4080", 16, "rtx40", "ada", "4x16", 48.7, 256, 22.4, mem="GDDR6X"),
    _row("rtx4080super", "GeForce RTX 4080 SUPER", 16, "rtx40", "ada", "4x16", 52.2, 256, 23, mem="GDDR6X"),
    _row("rtx4090", "GeForce RTX 4090", 24, "rtx40", "ada", "4x16", 82.6, 384, 21, mem="GDDR6X",
         profile="rtx4090-pcie4"),
    # ---- GeForce RTX 50 (Blackwell), PCIe 5.0 (the 5050 / 5060 / 5060 Ti x8)
    _row("rtx5050", "GeForce RTX 5050", 8, "rtx50", "blackwell", "5x8", 13.2, 128, 20),
    _row("rtx5060", "GeForce RTX 5060", 8, "rtx50", "blackwell", "5x8", 19.2, 128, 28, mem="GDDR7"),
    _row("rtx5060ti-16gb", "GeForce RTX 5060 Ti 16GB", 16, "rtx50", "blackwell", "5x8", 23.7, 128, 28, mem="GDDR7"),
    _row("rtx5060ti-8gb", "GeForce RTX 5060 Ti 8GB", 8, "rtx50", "blackwell", "5x8", 23.7, 128, 28, mem="GDDR7"),
    _row("rtx5070", "GeForce RTX 5070", 12, "rtx50", "blackwell", "5x16", 30.9, 192, 28, mem="GDDR7"),
    _row("rtx5070ti", "GeForce RTX 5070 Ti", 16, "rtx50", "blackwell", "5x16", 43.9, 256, 28, mem="GDDR7"),
    _row("rtx5080", "GeForce RTX 5080", 16, "rtx50", "blackwell", "5x16", 56.3, 256, 30, mem="GDDR7"),
    _row("rtx5090", "GeForce RTX 5090", 32, "rtx50", "blackwell", "5x16", 104.8, 512, 28, mem="GDDR7",
         profile="rtx5090-pcie5"),
    # ---- laptop parts (memory clock: the common one; the OEM may set another)
    _row("rtx2050laptop", "GeForce RTX 2050 Laptop", 4, "laptop30", "ampere", "4x4", 5.0, 64, 14, laptop=True),
    _row("rtx3050laptop", "GeForce RTX 3050 Laptop", 4, "laptop30", "ampere", "4x8", 5.5, 128, 12, laptop=True),
    _row("rtx3050tilaptop", "GeForce RTX 3050 Ti Laptop", 4, "laptop30", "ampere", "4x8", 6.0, 128, 12, laptop=True),
    _row("rtx3060laptop", "GeForce RTX 3060 Laptop", 6, "laptop30", "ampere", "4x16", 10.9, 192, 14, laptop=True),
    _row("rtx3070laptop", "GeForce RTX 3070 Laptop", 8, "laptop30", "ampere", "4x16", 16.0, 256, 14, laptop=True),
    _row("rtx3070tilaptop", "GeForce RTX 3070 Ti Laptop", 8, "laptop30", "ampere", "4x16", 17.8, 256, 14, laptop=True),
    _row("rtx3080laptop-8gb", "GeForce RTX 3080 Laptop 8GB", 8, "laptop30", "ampere", "4x16", 19.0, 256, 14,
         laptop=True),
    _row("rtx3080laptop-16gb", "GeForce RTX 3080 Laptop 16GB", 16, "laptop30", "ampere", "4x16", 19.0, 256, 14,
         laptop=True),
    _row("rtx3080tilaptop", "GeForce RTX 3080 Ti Laptop", 16, "laptop30", "ampere", "4x16", 23.0, 256, 16,
         laptop=True),
    _row("rtx4050laptop", "GeForce RTX 4050 Laptop", 6, "laptop40", "ada", "4x8", 9.0, 96, 16, laptop=True),
    _row("rtx4060laptop", "GeForce RTX 4060 Laptop", 8, "laptop40", "ada", "4x8", 11.6, 128, 16, laptop=True),
    _row("rtx4070laptop", "GeForce RTX 4070 Laptop", 8, "laptop40", "ada", "4x8", 15.6, 128, 16, laptop=True),
    _row("rtx4080laptop", "GeForce RTX 4080 Laptop", 12, "laptop40", "ada", "4x16", 24.7, 192, 18, laptop=True),
    _row("rtx4090laptop", "GeForce RTX 4090 Laptop", 16, "laptop40", "ada", "4x16", 33.0, 256, 18, laptop=True),
    _row("rtx5060laptop", "GeForce RTX 5060 Laptop", 8, "laptop50", "blackwell", "5x8", 15.0, 128, 24, mem="GDDR7",
         laptop=True),
    _row("rtx5070laptop", "GeForce RTX 5070 Laptop", 8, "laptop50", "blackwell", "5x8", 16.0, 128, 24, mem="GDDR7",
         laptop=True),
    _row("rtx5070tilaptop", "GeForce RTX 5070 Ti Laptop", 12, "laptop50", "blackwell", "5x16", 23.0, 192, 24,
         mem="GDDR7", laptop=True),
    _row("rtx5080laptop", "GeForce RTX 5080 Laptop", 16, "laptop50", "blackwell", "5x16", 30.0, 256, 28, mem="GDDR7",
         laptop=True),
    _row("rtx5090laptop", "GeForce RTX 5090 Laptop", 24, "laptop50", "blackwell", "5x16", 32.0, 256, 28, mem="GDDR7",
         laptop=True),
    # ---- workstation: Turing Quadro, Ampere RTX A, Ada RTX, Blackwell RTX PRO
    _row("quadrortx4000", "Quadro RTX 4000", 8, "turing-pro", "turing", "3x16", 7.1, 256, 13),
    _row("quadrortx5000", "Quadro RTX 5000", 16, "turing-pro", "turing", "3x16", 11.2, 256, 14),
    _row("quadrortx6000", "Quadro RTX 6000", 24, "turing-pro", "turing", "3x16", 16.3, 384, 14),
    _row("quadrortx8000", "Quadro RTX 8000", 48, "turing-pro", "turing", "3x16", 16.3, 384, 14),
    _row("rtxa2000-6gb", "RTX A2000 6GB", 6, "ampere-pro", "ampere", "4x16", 8.0, 192, 12),
    _row("rtxa2000-12gb", "RTX A2000 12GB", 12, "ampere-pro", "ampere", "4x16", 8.0, 192, 12),
    _row("rtxa4000", "RTX A4000", 16, "ampere-pro", "ampere", "4x16", 19.2, 256, 14),
    _row("rtxa4500", "RTX A4500", 20, "ampere-pro", "ampere", "4x16", 23.7, 320, 16),
    _row("rtxa5000", "RTX A5000", 24, "ampere-pro", "ampere", "4x16", 27.8, 384, 16),
    _row("rtxa5500", "RTX A5500", 24, "ampere-pro", "ampere", "4x16", 34.1, 384, 16),
    _row("rtxa6000", "RTX A6000", 48, "ampere-pro", "ampere", "4x16", 38.7, 384, 16),
    _row("rtx2000ada", "RTX 2000 Ada", 16, "ada-pro", "ada", "4x8", 12.0, 128, 14),
    _row("rtx4000ada", "RTX 4000 Ada", 20, "ada-pro", "ada", "4x16", 26.7, 160, 18),
    _row("rtx4000sffada", "RTX 4000 SFF Ada", 20, "ada-pro", "ada", "4x16", 19.2, 160, 14),
    _row("rtx4500ada", "RTX 4500 Ada", 24, "ada-pro", "ada", "4x16", 39.6, 192, 18),
    _row("rtx5000ada", "RTX 5000 Ada", 32, "ada-pro", "ada", "4x16", 65.3, 256, 18),
    _row("rtx6000ada", "RTX 6000 Ada", 48, "ada-pro", "ada", "4x16", 91.1, 384, 20),
    _row("rtxpro4000", "RTX PRO 4000 Blackwell", 24, "blackwell-pro", "blackwell", "5x16", 46.9, 192, 28,
         mem="GDDR7"),
    _row("rtxpro4500", "RTX PRO 4500 Blackwell", 32, "blackwell-pro", "blackwell", "5x16", 54.9, 256, 28,
         mem="GDDR7"),
    _row("rtxpro5000", "RTX PRO 5000 Blackwell", 48, "blackwell-pro", "blackwell", "5x16", 73.7, 384, 28,
         mem="GDDR7"),
    _row("rtxpro6000", "RTX PRO 6000 Blackwell", 96, "blackwell-pro", "blackwell", "5x16", 125.0, 512, 28,
         mem="GDDR7"),
    # ---- AMD Radeon PRO (RDNA3 workstation): the W7800 because a published row runs on it
    _amd("radeonprow7800", "AMD Radeon PRO W7800", 48, "amd-pro", "rdna3", "4x16", 45.2, bw=864),
    _amd("radeonprow7900", "AMD Radeon PRO W7900", 48, "amd-rdna3-pro", "rdna3", "4x16", 61.3, 384, 18),
    # ---- AMD Radeon RX 6000 (RDNA2, PCIe 4.0; the 66x0 cards x8): no matrix units, llama.cpp runs dp4a-class kernels
    _amd("rx6600", "AMD Radeon RX 6600", 8, "amd-rdna2", "rdna2", "4x8", 8.93, 128, 14, tensor_cores=False),
    _amd("rx6600xt", "AMD Radeon RX 6600 XT", 8, "amd-rdna2", "rdna2", "4x8", 10.6, 128, 16, tensor_cores=False),
    _amd("rx6650xt", "AMD Radeon RX 6650 XT", 8, "amd-rdna2", "rdna2", "4x8", 10.8, 128, 17.5, tensor_cores=False),
    _amd("rx6700xt", "AMD Radeon RX 6700 XT", 12, "amd-rdna2", "rdna2", "4x16", 13.21, 192, 16, tensor_cores=False),
    _amd("rx6750xt", "AMD Radeon RX 6750 XT", 12, "amd-rdna2", "rdna2", "4x16", 13.31, 192, 18, tensor_cores=False),
    _amd("rx6800", "AMD Radeon RX 6800", 16, "amd-rdna2", "rdna2", "4x16", 16.17, 256, 16, tensor_cores=False),
    _amd("rx6800xt", "AMD Radeon RX 6800 XT", 16, "amd-rdna2", "rdna2", "4x16", 20.74, 256, 16, tensor_cores=False),
    _amd("rx6900xt", "AMD Radeon RX 6900 XT", 16, "amd-rdna2", "rdna2", "4x16", 23.04, 256, 16, tensor_cores=False),
    _amd("rx6950xt", "AMD Radeon RX 6950 XT", 16, "amd-rdna2", "rdna2", "4x16", 23.65, 256, 18, tensor_cores=False),
    # ---- AMD Radeon RX 7000 (RDNA3, PCIe 4.0; the 7600 / 7600 XT x8): WMMA units
    _amd("rx7600", "AMD Radeon RX 7600", 8, "amd-rdna3", "rdna3", "4x8", 21.75, 128, 18),
    _amd("rx7600xt", "AMD Radeon RX 7600 XT", 16, "amd-rdna3", "rdna3", "4x8", 22.57, 128, 18),
    _amd("rx7700xt", "AMD Radeon RX 7700 XT", 12, "amd-rdna3", "rdna3", "4x16", 35.17, 192, 18),
    _amd("rx7800xt", "AMD Radeon RX 7800 XT", 16, "amd-rdna3", "rdna3", "4x16", 37.32, 256, 19.5),
    _amd("rx7900gre", "AMD Radeon RX 7900 GRE", 16, "amd-rdna3", "rdna3", "4x16", 45.98, 256, 18),
    _amd("rx7900xt", "AMD Radeon RX 7900 XT", 20, "amd-rdna3", "rdna3", "4x16", 51.48, 320, 20),
    _amd("rx7900xtx", "AMD Radeon RX 7900 XTX", 24, "amd-rdna3", "rdna3", "4x16", 61.39, 384, 20),
    # ---- AMD Radeon RX 9000 (RDNA4, PCIe 5.0 x16): WMMA units
    _amd("rx9060xt-16gb", "AMD Radeon RX 9060 XT 16GB", 16, "amd-rdna4", "rdna4", "5x16", 25.64, 128, 20),
    _amd("rx9060xt-8gb", "AMD Radeon RX 9060 XT 8GB", 8, "amd-rdna4", "rdna4", "5x16", 25.64, 128, 20),
    _amd("rx9070", "AMD Radeon RX 9070", 16, "amd-rdna4", "rdna4", "5x16", 36.13, 256, 20),
    _amd("rx9070xt", "AMD Radeon RX 9070 XT", 16, "amd-rdna4", "rdna4", "5x16", 48.66, 256, 20),
    # ---- Intel Arc A (Alchemist / Xe-HPG, PCIe 4.0; the A380 x8) and B (Battlemage / Xe2, PCIe 4.0 x8): XMX units
    _intel("arca380", "Intel Arc A380", 6, "intel-arc-a", "xe-hpg", "4x8", 4.1, 96, 15.5),
    _intel("arca580", "Intel Arc A580", 8, "intel-arc-a", "xe-hpg", "4x16", 10.4, 256, 16),
    _intel("arca750", "Intel Arc A750", 8, "intel-arc-a", "xe-hpg", "4x16", 14.7, 256, 16),
    _intel("arca770-16gb", "Intel Arc A770 16GB", 16, "intel-arc-a", "xe-hpg", "4x16", 17.2, 256, 17.5),
    _intel("arca770-8gb", "Intel Arc A770 8GB", 8, "intel-arc-a", "xe-hpg", "4x16", 17.2, 256, 16),
    _intel("arcb570", "Intel Arc B570", 10, "intel-arc-b", "xe2", "4x8", 11.5, 160, 19),
    _intel("arcb580", "Intel Arc B580", 12, "intel-arc-b", "xe2", "4x8", 13.7, 192, 19),
    _intel("arcprob50", "Intel Arc Pro B50", 16, "intel-arc-pro", "xe2", "5x8", 10.65, 128, 14),
    _intel("arcprob60", "Intel Arc Pro B60", 24, "intel-arc-pro", "xe2", "5x8", 12.3, 192, 19),
    # ---- Apple Silicon: unified memory, one row per size sold; bandwidth as Apple states it; Metal; no PCIe link
    _apple("m1-8gb", "Apple M1 (8-core GPU) 8GB", 8, "apple-m1", "m1", 68.25, 2.6, "LPDDR4X-4266, 128-bit"),
    _apple("m1-16gb", "Apple M1 (8-core GPU) 16GB", 16, "apple-m1", "m1", 68.25, 2.6, "LPDDR4X-4266, 128-bit"),
    _apple("m1pro-16gb", "Apple M1 Pro (16-core GPU) 16GB", 16, "apple-m1", "m1", 200, 5.2, "LPDDR5-6400, 256-bit",
           note="a 14-core GPU bin has the same bandwidth"),
    _apple("m1pro-32gb", "Apple M1 Pro (16-core GPU) 32GB", 32, "apple-m1", "m1", 200, 5.2, "LPDDR5-6400, 256-bit"),
    _apple("m1max-32gb", "Apple M1 Max (32-core GPU) 32GB", 32, "apple-m1", "m1", 400, 10.4, "LPDDR5-6400, 512-bit",
           note="a 24-core GPU bin has the same bandwidth"),
    _apple("m1max-64gb", "Apple M1 Max (32-core GPU) 64GB", 64, "apple-m1", "m1", 400, 10.4, "LPDDR5-6400, 512-bit"),
    _apple("m1ultra-64gb", "Apple M1 Ultra (48-core GPU) 64GB", 64, "apple-m1", "m1", 800, 15.9,
           "LPDDR5-6400, 1024-bit", note="48-core GPU bin (Apple quotes 21 TFLOPS for the 64-core one)"),
    _apple("m1ultra-128gb", "Apple M1 Ultra (64-core GPU) 128GB", 128, "apple-m1", "m1", 800, 21.0,
           "LPDDR5-6400, 1024-bit"),
    _apple("m2-8gb", "Apple M2 (10-core GPU) 8GB", 8, "apple-m2", "m2", 100, 3.6, "LPDDR5-6400, 128-bit"),
    _apple("m2-16gb", "Apple M2 (10-core GPU) 16GB", 16, "apple-m2", "m2", 100, 3.6, "LPDDR5-6400, 128-bit"),
    _apple("m2-24gb", "Apple M2 (10-core GPU) 24GB", 24, "apple-m2", "m2", 100, 3.6, "LPDDR5-6400, 128-bit"),
    _apple("m2pro-16gb", "Apple M2 Pro (19-core GPU) 16GB", 16, "apple-m2", "m2", 200, 6.8, "LPDDR5-6400, 256-bit"),
    _apple("m2pro-32gb", "Apple M2 Pro (19-core GPU) 32GB", 32, "apple-m2", "m2", 200, 6.8, "LPDDR5-6400, 256-bit"),
    _apple("m2max-32gb", "Apple M2 Max (38-core GPU) 32GB", 32, "apple-m2", "m2", 400, 13.6, "LPDDR5-6400, 512-bit",
           note="a 30-core GPU bin has the same bandwidth"),
    _apple("m2max-64gb", "Apple M2 Max (38-core GPU) 64GB", 64, "apple-m2", "m2", 400, 13.6, "LPDDR5-6400, 512-bit"),
    _apple("m2max-96gb", "Apple M2 Max (38-core GPU) 96GB", 96, "apple-m2", "m2", 400, 13.6, "LPDDR5-6400, 512-bit"),
    _apple("m2ultra-64gb", "Apple M2 Ultra (60-core GPU) 64GB", 64, "apple-m2", "m2", 800, 21.5,
           "LPDDR5-6400, 1024-bit", note="60-core GPU bin (Apple quotes 27.2 TFLOPS for the 76-core one)"),
    _apple("m2ultra-128gb", "Apple M2 Ultra (76-core GPU) 128GB", 128, "apple-m2", "m2", 800, 27.2,
           "LPDDR5-6400, 1024-bit"),
    _apple("m2ultra-192gb", "Apple M2 Ultra (76-core GPU) 192GB", 192, "apple-m2", "m2", 800, 27.2,
           "LPDDR5-6400, 1024-bit"),
    _apple("m3-8gb", "Apple M3 (10-core GPU) 8GB", 8, "apple-m3", "m3", 100, 4.1, "LPDDR5-6400, 128-bit"),
    _apple("m3-16gb", "Apple M3 (10-core GPU) 16GB", 16, "apple-m3", "m3", 100, 4.1, "LPDDR5-6400, 128-bit"),
    _apple("m3-24gb", "Apple M3 (10-core GPU) 24GB", 24, "apple-m3", "m3", 100, 4.1, "LPDDR5-6400, 128-bit"),
    _apple("m3pro-18gb", "Apple M3 Pro (18-core GPU) 18GB", 18, "apple-m3", "m3", 150, 7.4, "LPDDR5-6400, 192-bit",
           note="a 14-core GPU bin has the same bandwidth"),
    _apple("m3pro-36gb", "Apple M3 Pro (18-core GPU) 36GB", 36, "apple-m3", "m3", 150, 7.4, "LPDDR5-6400, 192-bit"),
    _apple("m3max-36gb", "Apple M3 Max (30-core GPU) 36GB", 36, "apple-m3", "m3", 300, 12.3, "LPDDR5-6400, 384-bit"),
    _apple("m3max-48gb", "Apple M3 Max (40-core GPU) 48GB", 48, "apple-m3", "m3", 400, 16.4, "LPDDR5-6400, 512-bit"),
    _apple("m3max-64gb", "Apple M3 Max (40-core GPU) 64GB", 64, "apple-m3", "m3", 400, 16.4, "LPDDR5-6400, 512-bit"),
    _apple("m3max-96gb", "Apple M3 Max (30-core GPU) 96GB", 96, "apple-m3", "m3", 300, 12.3, "LPDDR5-6400, 384-bit"),
    _apple("m3max-128gb", "Apple M3 Max (40-core GPU) 128GB", 128, "apple-m3", "m3", 400, 16.4,
           "LPDDR5-6400, 512-bit"),
    _apple("m3ultra-96gb", "Apple M3 Ultra (60-core GPU) 96GB", 96, "apple-m3", "m3", 819, 24.6,
           "LPDDR5-6400, 1024-bit", note="60-core GPU bin; 256 GB with the 80-core GPU also sold"),
    _apple("m3ultra-256gb", "Apple M3 Ultra (80-core GPU) 256GB", 256, "apple-m3", "m3", 819, 32.8,
           "LPDDR5-6400, 1024-bit"),
    _apple("m3ultra-512gb", "Apple M3 Ultra (80-core GPU) 512GB", 512, "apple-m3", "m3", 819, 32.8,
           "LPDDR5-6400, 1024-bit"),
    _apple("m4-16gb", "Apple M4 (10-core GPU) 16GB", 16, "apple-m4", "m4", 120, 4.3, "LPDDR5X-7500, 128-bit",
           note="an 8-core GPU bin has the same bandwidth"),
    _apple("m4-24gb", "Apple M4 (10-core GPU) 24GB", 24, "apple-m4", "m4", 120, 4.3, "LPDDR5X-7500, 128-bit"),
    _apple("m4-32gb", "Apple M4 (10-core GPU) 32GB", 32, "apple-m4", "m4", 120, 4.3, "LPDDR5X-7500, 128-bit"),
    _apple("m4pro-24gb", "Apple M4 Pro (20-core GPU) 24GB", 24, "apple-m4", "m4", 273, 9.2,
           "LPDDR5X-8533, 256-bit", note="a 16-core GPU bin has the same bandwidth"),
    _apple("m4pro-48gb", "Apple M4 Pro (20-core GPU) 48GB", 48, "apple-m4", "m4", 273, 9.2,
           "LPDDR5X-8533, 256-bit"),
    _apple("m4pro-64gb", "Apple M4 Pro (20-core GPU) 64GB", 64, "apple-m4", "m4", 273, 9.2,
           "LPDDR5X-8533, 256-bit"),
    _apple("m4max-36gb", "Apple M4 Max (32-core GPU) 36GB", 36, "apple-m4", "m4", 410, 14.7,
           "LPDDR5X-8533, 384-bit"),
    _apple("m4max-48gb", "Apple M4 Max (40-core GPU) 48GB", 48, "apple-m4", "m4", 546, 18.4,
           "LPDDR5X-8533, 512-bit"),
    _apple("m4max-64gb", "Apple M4 Max (40-core GPU) 64GB", 64, "apple-m4", "m4", 546, 18.4,
           "LPDDR5X-8533, 512-bit"),
    _apple("m4max-128gb", "Apple M4 Max (40-core GPU) 128GB", 128, "apple-m4", "m4", 546, 18.4,
           "LPDDR5X-8533, 512-bit"),
    # ---- data-center / server cards people run at home or rent (bandwidth as the datasheet states it)
    _row("p40", "Tesla P40", 24, "datacenter", "pascal", "3x16", 11.8, bw=347, mem="GDDR5", tensor_cores=False),
    _row("p100", "Tesla P100 16GB", 16, "datacenter", "pascal", "3x16", 9.3, bw=732, mem="HBM2", tensor_cores=False),
    _row("v100", "Tesla V100 PCIe", 16, "datacenter", "volta", "3x16", 14.0, bw=900, mem="HBM2"),
    _row("t4", "T4", 16, "datacenter", "turing", "3x16", 8.1, 256, 10, profile="t4-pcie3"),
    _row("a10", "A10", 24, "datacenter", "ampere", "4x16", 31.2, 384, 12.5),
    _row("a40", "A40", 48, "datacenter", "ampere", "4x16", 37.4, bw=696),
    _row("l4", "L4", 24, "datacenter", "ada", "4x16", 30.3, bw=300),
    _row("l40", "L40", 48, "datacenter", "ada", "4x16", 90.5, 384, 18),
    _row("l40s", "L40S", 48, "datacenter", "ada", "4x16", 91.6, 384, 18),
    _row("a100-40gb", "A100 40GB PCIe", 40, "datacenter", "ampere", "4x16", 19.5, bw=1555, mem="HBM2",
         profile="a100-40g-pcie4"),
    _row("a100-80gb", "A100 80GB PCIe", 80, "datacenter", "ampere", "4x16", 19.5, bw=1935, mem="HBM2e"),
    _row("h100", "H100 PCIe", 80, "datacenter", "hopper", "5x16", 51.0, bw=2000, mem="HBM2e", profile="h100-pcie5"),
    _row("h200", "H200 NVL", 141, "datacenter", "hopper", "5x16", 60.0, bw=4800, mem="HBM3e", profile="h200-pcie5"),
]

CARDS: dict[str, GPU] = {g.key: g for g in _ROWS}
GPU_FAMILIES: dict[str, list[GPU]] = {}
for _g in _ROWS:
    GPU_FAMILIES.setdefault(_g.family, []).append(_g)


def _norm(name: str) -> str:
    s = str(name).lower()
    for word in ("nvidia", "geforce", "tesla", "amd", "intel", "apple", "(tm)", "(r)"):
        s = s.replace(word, "")
    s = re.sub(r"[\s_\-]", "", s).replace("mobile", "laptop").replace("notebook", "laptop")
    # "Radeon RX 7900 XTX" is the RX 7900 XTX (the Radeon PRO cards keep their "radeonpro" keys)
    return s.replace("blackwell", "").replace("radeonrx", "rx")


_BY_NORM = {_norm(k): k for k in CARDS} | {_norm(f): f for f in GPU_FAMILIES}


def _suggest(key: str) -> list[str]:
    names = sorted(set(GPU_FAMILIES) | set(CARDS))
    close = difflib.get_close_matches(key, names, n=5, cutoff=0.5)
    return close or difflib.get_close_matches(key, names, n=5, cutoff=0.0)


def find_gpu(name: str, vram: float | None = None) -> GPU:
    """The catalog card ``name`` names (``"rtx3060"``, ``"RTX 4060 Ti 16GB"``, ``"a4000"``, ``"4070 laptop"``,
    ``"RX 7900 XTX"``, ``"arc b580"``, ``"M2 Max 64GB"``).
    A family with several memory sizes picks the one ``name`` ends in (``-8gb``), else the one nearest ``vram``
    bytes, else the first listed (the common one). Unknown: a ValueError naming ``gpu=`` and the closest names."""
    key = _norm(name)
    hint = None
    m = re.fullmatch(r"(.+?)(\d+)gb?", key)
    if key not in _BY_NORM and m and m.group(1) in _BY_NORM:
        key, hint = m.group(1), float(m.group(2))
    if key not in _BY_NORM:
        for prefix in ("rtx", "gtx", "rtxa", "radeonpro", "radeon", "rx", "arc", "arcpro"):
            if prefix + key in _BY_NORM:
                key = prefix + key
                break
    if key not in _BY_NORM:
        raise ValueError(f"gpu={name!r} is not a GPU the catalog knows ({len(CARDS)} cards): closest "
                         f"{_suggest(key)}; or pass a HardwareProfile with your card's numbers.")
    card = _BY_NORM[key]
    if card in CARDS:
        return CARDS[card]
    family = GPU_FAMILIES[card]
    want = hint if hint is not None else (vram / GiB if vram else None)
    if want is None:
        return family[0]
    return min(family, key=lambda g: (abs(g.vram_gb - want), family.index(g)))
