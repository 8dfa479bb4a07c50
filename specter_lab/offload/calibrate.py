"""Measure this machine's profile on CUDA (``specter-lab calibrate``)."""

from __future__ import annotations

from .profiles import PROFILES, HardwareProfile, profile_dir

__all__ = ["calibrate"]


def calibrate(name: str = "calibrated", save: bool = True, sizes_mb: tuple[int, ...] = (4, 16, 64),
              repeats: int = 20) -> HardwareProfile:
    """Measure this machine's profile on CUDA: pinned and pageable H2D bandwidth, per-copy latency, weight
    streaming bandwidth and matmul throughput. Saves it so ``hardware=name`` finds it later."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("calibrate() measures a real GPU and needs CUDA; torch.cuda.is_available() is False. "
                           f"Use a simulated profile instead: {sorted(PROFILES)}.")
    dev = torch.device("cuda")

    def timed(fn, n=repeats) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / n

    def h2d(pinned: bool) -> float:
        bws = []
        for mb in sizes_mb:
            src = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=pinned)
            dst = torch.empty(mb << 20, dtype=torch.uint8, device=dev)
            bws.append((mb << 20) / timed(lambda: dst.copy_(src, non_blocking=True)))
        return max(bws)

    pinned_bw, pageable_bw = h2d(True), h2d(False)
    tiny_src = torch.empty(256, dtype=torch.uint8, pin_memory=True)
    tiny_dst = torch.empty(256, dtype=torch.uint8, device=dev)
    latency = timed(lambda: tiny_dst.copy_(tiny_src, non_blocking=True), n=200)
    big = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    big2 = torch.empty_like(big)
    hbm = 2 * big.numel() / timed(lambda: big2.copy_(big), n=10)  # read + write
    a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    flops = 2 * 4096**3 / timed(lambda: a @ b, n=10)
    x = torch.randn(1, 8, device=dev)
    launch = timed(lambda: x.add_(1.0), n=500)
    prof = HardwareProfile(name, pinned_bw, latency, hbm, flops, launch, pageable_bw,
                           device_memory=float(torch.cuda.get_device_properties(dev).total_memory),
                           measured=True, notes=f"calibrated on {torch.cuda.get_device_name(dev)}")
    if save:
        profile_dir().mkdir(parents=True, exist_ok=True)
        (profile_dir() / f"{name}.json").write_text(prof.to_json())
    return prof

