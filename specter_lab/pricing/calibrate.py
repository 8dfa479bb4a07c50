"""Measure this machine's profile on CUDA (``specter-lab calibrate``)."""

from __future__ import annotations

from ..atomic import write_atomic
from .profiles import PROFILES, HardwareProfile, profile_dir

__all__ = ["calibrate", "measure_host_op_cost"]


def measure_host_op_cost(device: str = "cuda", family: str = "qwen2_moe", new_tokens: int = 16,
                         repeats: int = 3) -> float:
    """Host seconds per aten op, measured the way the cost model uses it: a tiny random model of ``family`` (its
    width too small for the device to matter, so decoding it is pure host dispatch) generates on ``device``;
    wall-clock per decode token (the difference of a long and a short run, best of ``repeats``) ÷ the aten ops
    one decode token dispatches (counted by :func:`~specter_lab.pricing.opcount.count_model`).

    Needs CUDA: on the CPU the "device" work runs on the host itself, so the figure would not be a host cost."""
    import time

    import torch

    from .opcount import count_model, counting_model

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise RuntimeError("measure_host_op_cost() measures host dispatch in front of a GPU and needs CUDA "
                           f"(device={device!r}, torch.cuda.is_available()={torch.cuda.is_available()}). "
                           "Simulated profiles use the default derived from the published table instead.")
    model = counting_model(family, top_k=4, n_experts=60, layers=24).to(device)
    per_token_ops = sum(r.ops for r in count_model(model, "eager").values())
    ids = torch.tensor([[5, 6, 7, 8]], device=device)

    def run(n: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    run(2)  # warm-up: kernels, allocator
    per_token = (run(2 + new_tokens) - run(2)) / new_tokens
    return per_token / per_token_ops


def calibrate(name: str = "calibrated", save: bool = True, sizes_mb: tuple[int, ...] = (4, 16, 64),
              repeats: int = 20) -> HardwareProfile:
    """Measure this machine's profile on CUDA: pinned and pageable H2D bandwidth, per-copy latency, weight
    streaming bandwidth, matmul throughput and the host cost of one dispatched aten op
    (:func:`measure_host_op_cost`). Saves it so ``hardware=name`` finds it later."""
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
    host_op = measure_host_op_cost("cuda")
    prof = HardwareProfile(name, pinned_bw, latency, hbm, flops, launch, pageable_bw,
                           device_memory=float(torch.cuda.get_device_properties(dev).total_memory),
                           measured=True, notes=f"calibrated on {torch.cuda.get_device_name(dev)}",
                           host_op_cost=host_op,
                           host_source=f"measured by calibrate() on {torch.cuda.get_device_name(dev)}: tiny "
                                       "qwen2_moe decode wall-clock per token / counted aten ops per token")
    if save:
        profile_dir().mkdir(parents=True, exist_ok=True)
        write_atomic(profile_dir() / f"{name}.json", prof.to_json())  # a kill mid-save keeps the last profile
    return prof

