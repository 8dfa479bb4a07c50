"""Published offloaded decode measurements on consumer machines, reproduced by the estimator
(``sl.bench.consumer_anchors()``, ``specter-lab bench --consumer``).

Each row is one published tokens/s of llama.cpp or ktransformers on a named GPU + host with a named placement
(sources: ``../shared/research/field_2026.md`` §3.2 and the threads named per row). The row is priced on the
llama.cpp-class clock every estimate replays on (:mod:`specter_lab.pricing.llamacpp`), from the model's config
(bundled in ``specter_lab/data/configs``), the weights' format, the GPU profile and host CPU, and the placement:
every published placement is static (each expert always in the same place), where the clock's closed form
(:func:`.lanes.price_token`) is the replay's time (``tests/test_estimate.py`` holds them equal). One constant is
fitted from the rows: the fraction of the host's delivered DRAM bandwidth a batch-1 expert matvec reaches
(``HOST_DECODE_EFFICIENCY``), the geometric mean of each ``fit`` row's own value; ``loo_ratio`` prices each of
those rows with the constant fitted on the others. Rows tagged ``check`` are never in the fit: they are the test
(:func:`consumer_summary` reports the two groups' errors and band coverage apart). A row's band is the estimate's
(:mod:`.bands`): what is not known about its machine, each unknown at its ends, combined in quadrature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import pandas as pd

from .bands import Scenario, combine, on_backend, unknowns
from .lanes import Counts, Machine, price_token, resident, static_layers, uniform_hot_set
from .vram import vram_budget
from ..model.geometry import ModelGeometry, geometry_from_config
from ..pricing.precision import WeightPrecision, get_precision
from ..pricing.profiles import HOST_DECODE_EFFICIENCY, get_host, resolve_gpu, unified_gpu_bytes

__all__ = ["ConsumerRow", "CONSUMER_ROWS", "consumer_anchors", "consumer_summary", "derive_host_efficiency",
           "simulate_consumer_row", "row_band", "TOLERANCE"]

TOLERANCE = 0.30
GiB = 2**30
_QP_LADDER = "FedericoTs/quantprobe MACHINE_LADDER.md@0040d61 (llama.cpp f113e02, tg128 r=2)"


@dataclass(frozen=True)
class ConsumerRow:
    """One published measurement and the placement that reproduces it."""

    model: str
    config: str  # bundled config name
    weights: str
    gpu: str  # profile name or catalog name (specter_lab.pricing.gpus)
    host: str | None  # HOSTS name or memory description; None: not published (a row with no host work)
    vram_gib: float
    engine: str  # engine and placement, as published
    strategy: str  # the placement as our strategy ("whole layers": llama.cpp -ngl short of every layer)
    placement: dict  # static_split: layers_on_gpu; fiddler: gpu_experts; whole layers: gpu_layers (llama.cpp -ngl)
    published_tok_s: tuple[float, float]  # (low, high) as published
    context: int  # mean tokens in the KV cache over the measured decode
    source: str
    role: str  # fit (the host efficiency is fitted on it) | check (never fitted: the test)
    note: str = ""
    backend: str | None = None  # llama.cpp's backend as published (cuda, rocm, vulkan, metal, sycl); None: the card's
    # what a fit row fits: "host" (the host matvec efficiency), "backend" (its vendor and backend's efficiency) or
    # "arch" (its architecture's on its backend)
    fits: str = "host"

    @property
    def split(self) -> str:
        return "fit" if self.role == "fit" else "check"

    @property
    def published_mid(self) -> float:
        return sum(self.published_tok_s) / 2


CONSUMER_ROWS: tuple[ConsumerRow, ...] = (
    ConsumerRow("DeepSeek-V2-Lite Q4_K_M", "deepseek-v2-lite", "q4_k_m", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp expert split (-ot, --no-mmap)", "static_split", {"rule": "vram", "context": 4096},
                (22.87, 22.87), 64, _QP_LADDER, "fit",
                "the split's layer list is not published: placed by the estimator's VRAM rule at 6 GiB (dense + KV "
                "at 4096 + 0.6 GiB overhead, then as many expert layers as fit)"),
    ConsumerRow("DeepSeek-V2-Lite Q4_K_M", "deepseek-v2-lite", "q4_k_m", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp -ngl 13 (whole layers)", "whole layers", {"gpu_layers": 13},
                (18.21, 18.21), 64, _QP_LADDER, "fit",
                "'-ngl 13 / -ngl 20 for the two big models': the last 13 of 27 decoder layers on the GPU, the first "
                "14 and the LM head on the host (llama.cpp offloads from the last layer back)"),
    ConsumerRow("DeepSeek-V2-Lite Q4_K_M", "deepseek-v2-lite", "q4_k_m", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp CPU only (-ngl 0, mmap on)", "whole layers", {"gpu_layers": 0},
                (6.84 - 5.13, 6.84 + 5.13), 64, _QP_LADDER, "check",
                "published as 6.84 +/- 5.13, bimodal: mmap pages the file from disk on the first pass; the model "
                "prices a warm --no-mmap run, so only the upper half of the range can be reproduced"),
    ConsumerRow("Qwen3-30B-A3B Q2_K", "qwen3-30b-a3b", "q2_k", "gtx1060-pcie3", "i5-7600k-ddr4-3000", 6.0,
                "llama.cpp split, 34 % of experts in VRAM", "static_split", {"layers_on_gpu": 16},
                (20.4, 22.2), 64, "FedericoTs/quantprobe README.md@0040d61 (preregs #60/#61)", "fit",
                "the emitted command: -ngl 99 -ot 'blk\\.(16|...|47)\\.ffn_.*_exps\\.=CPU' (16 of 48 expert layers "
                "on the GPU)"),
    ConsumerRow("Qwen3-30B-A3B-2507 BF16", "qwen3-30b-a3b", "bf16", "rtx5090-pcie5", "epyc-9355-ddr5-6400", 32.0,
                "ktransformers 0.5.2 + SGLang, 28 GPU experts per layer", "fiddler",
                {"gpu_experts": 28, "by": "index", "overlap": True}, (44.0, 52.0), 64,
                "kvcache-ai/ktransformers#1914", "fit",
                "28 fixed experts per layer on the GPU chosen without a routing profile (a uniform 28/128 of "
                "routed experts served there), the host's experts overlapped with the GPU's (ktransformers runs "
                "them concurrently); the host's delivered bandwidth is 0.78 x peak, the published desktop "
                "measurements' geometric mean (not measured on this box)"),
    ConsumerRow("gpt-oss-20B MXFP4", "gpt-oss-20b", "mxfp4+q8_0", "rtx2080-pcie3", "i9-10900x-ddr4-2933", 8.0,
                "llama.cpp --n-cpu-moe 12", "static_split", {"layers_on_gpu": 12}, (36.4, 36.4), 64,
                "AlexsJones/llmfit#775", "fit",
                "dense tensors at q8_0: inferred from the size of ggml-org's gpt-oss-20b GGUF (about 12 GB: 10.2 GB "
                "of MXFP4 experts + 1.8B other params at ~8.5 bits), not read from its tensor list"),
    ConsumerRow("gpt-oss-20B MXFP4", "gpt-oss-20b", "mxfp4+q8_0", "rtx4090-pcie4", "i9-10900x-ddr4-2933", 24.0,
                "llama.cpp, all on the GPU (tg128)", "resident", {}, (167.0, 173.0), 64,
                "ggml-org/llama.cpp#16649", "check",
                "no host work: checks the device side alone (datasheet bandwidth x format efficiency + kernels)"),
    ConsumerRow("DeepSeek-Coder-V2-Lite Q4_K_M (V2-Lite arch.)", "deepseek-v2-lite", "q4_k_m", "rtx2080-pcie3",
                "i9-10900x-ddr4-2933", 8.0, "llama.cpp --n-cpu-moe 16 (llmfit bench, warmed, context 4096)",
                "static_split", {"layers_on_gpu": 26 - 15}, (49.6, 49.6), 256,
                "AlexsJones/llmfit#778 (RTX 2080 community benchmarks, batches 2 & 3)", "check",
                "--n-cpu-moe 16 counts blocks: block 0 is DeepSeek's dense layer, so 15 of 26 expert layers on the "
                "host; same box as the gpt-oss fit row, another model and placement"),
    ConsumerRow("Qwen3-30B-A3B Q4_K_M", "qwen3-30b-a3b", "q4_k_m", "radeonprow7800", None, 48.0,
                "llama.cpp HIP (RDNA3), all on the GPU (tg128)", "resident", {}, (121.61, 122.31), 64,
                "ggml-org/llama.cpp#24546 (W7800 sweep, tg128 before/after over ubatch 512-8192)", "check",
                "an AMD card: checks the catalog's datasheet bandwidth x format efficiency (measured on NVIDIA) on "
                "RDNA3; no host work"),
    ConsumerRow("Qwen3-30B-A3B-2507 BF16", "qwen3-30b-a3b", "bf16", "rtx5090-pcie5", "epyc-9355-ddr5-6400", 32.0,
                "ktransformers 0.5.2 + SGLang, 28 GPU experts per layer, decode after a 3846-token prompt", "fiddler",
                {"gpu_experts": 28, "by": "index", "overlap": True}, (50.2, 50.2), 3846 + 64,
                "kvcache-ai/ktransformers#1914 (4K column)", "check",
                "the fit row's box and run at a deeper context: checks decode at depth (the fit row is the mean over "
                "its prompt lengths)"),
    ConsumerRow("Qwen3-30B-A3B-2507 BF16", "qwen3-30b-a3b", "bf16", "rtx5090-pcie5", "epyc-9355-ddr5-6400", 32.0,
                "ktransformers 0.5.2 + SGLang, 28 GPU experts per layer, decode after a 7678-token prompt", "fiddler",
                {"gpu_experts": 28, "by": "index", "overlap": True}, (45.8, 45.8), 7678 + 64,
                "kvcache-ai/ktransformers#1914 (8K column)", "check",
                "as above at 8K: the published decode falls 13 % from 1K to 8K; the model's KV read alone moves it "
                "less (a miss it says)"),
    # issue 53's held-out rows (docs/research/estimates_round2.md: every row's source, and whether it is a repost).
    # Never fitted. Rows read from a tool that times the whole request (llmfit) are a slight lower bound on decode.
    ConsumerRow("Qwen3-30B-A3B-Instruct-2507 Q4_K_M", "qwen3-30b-a3b", "q4_k_m", "rtx2080-pcie3", "i9-10900x-ddr4-2933", 8.0, "llama-server -ngl 99 --n-cpu-moe 36 (llmfit bench --runs 3, single request)", "static_split", {"layers_on_gpu": 12}, (32.86, 36.7), 100, "AlexsJones/llmfit#755 (llmfit-core/data/community/nvidia-geforce-rtx-2080/1784193317-d01967fb.json)", "check", "36 of 48 expert layers on the host; 36.7 is the server's own decode figure, 32.86-34.81 llmfit's min-max (avg 33.72). llmfit's llamacpp TPS = output tokens / whole request wall time (a short prompt's prefill and the HTTP round trip included): a lower bound on decode; same box as the gpt-oss fit row (#775)"),
    ConsumerRow("Qwen3-30B-A3B IQ4_XS experts / Q5_K attention / Q6_K output", "qwen3-30b-a3b", "iq4_xs+q5_k", "rtx4080", None, 16.0, "llama.cpp llama-sweep-bench -c 32768 -t 16 -ngl 100 -fa -ot \"blk\\.3[4-9]\\.ffn=CPU,blk\\.4[0-9]\\.ffn=CPU\"", "static_split", {"layers_on_gpu": 34}, (68.68, 68.68), 64, "ikawrakow/ik_llama.cpp discussion #357 (hybrid GPU+CPU tables; archived in the repo's github-data/discussions/)", "check", "TG128 at N_KV=0; the ffn override also puts those 14 layers' router and FFN norm on the host; host Ryzen 9 7950X (DDR5, speed not stated); weights format not in precision.py (IQ4_XS 4.25 bpw)"),
    ConsumerRow("Qwen3-30B-A3B IQ4_XS experts / Q5_K attention / Q6_K output", "qwen3-30b-a3b", "iq4_xs+q5_k", "rtx4080", None, 16.0, "llama.cpp llama-sweep-bench -c 32768 -t 16 -ngl 100 -fa -ot \"blk\\.3[4-9]\\.ffn=CPU,blk\\.4[0-9]\\.ffn=CPU\"", "static_split", {"layers_on_gpu": 34}, (63.15, 63.15), 4160, "ikawrakow/ik_llama.cpp discussion #357 (hybrid GPU+CPU tables; archived in the repo's github-data/discussions/)", "check", "as above, TG128 starting at N_KV=4096"),
    ConsumerRow("Qwen3-30B-A3B IQ4_XS experts / Q5_K attention / Q6_K output", "qwen3-30b-a3b", "iq4_xs+q5_k", "rtx4080", None, 16.0, "llama.cpp llama-sweep-bench -c 32768 -t 16 -ngl 100 -fa -ot \"blk\\.3[4-9]\\.ffn=CPU,blk\\.4[0-9]\\.ffn=CPU\"", "static_split", {"layers_on_gpu": 34}, (58.68, 58.68), 8256, "ikawrakow/ik_llama.cpp discussion #357 (hybrid GPU+CPU tables; archived in the repo's github-data/discussions/)", "check", "as above, TG128 starting at N_KV=8192"),
    ConsumerRow("Qwen3-30B-A3B IQ4_XS experts / Q5_K attention / Q6_K output", "qwen3-30b-a3b", "iq4_xs+q5_k", "rtx4080", None, 16.0, "ik_llama.cpp llama-sweep-bench -c 32768 -t 16 -ngl 100 -fa -rtr -fmoe -ot \"blk\\.3[4-9]\\.ffn=CPU,blk\\.4[0-9]\\.ffn=CPU\"", "static_split", {"layers_on_gpu": 34}, (76.74, 76.74), 64, "ikawrakow/ik_llama.cpp discussion #357 (hybrid GPU+CPU tables; archived in the repo's github-data/discussions/)", "check", "the same box and split in ik_llama.cpp (run-time repacked host experts, fused MoE): 1.12x mainline at N_KV=0 (69.93 at 4096, 63.75 at 8192)"),
    ConsumerRow("gpt-oss-20b MXFP4 (ggml-org GGUF)", "gpt-oss-20b", "mxfp4+q8_0", "rtx4080", None, 16.0, "llama.cpp llama-sweep-bench -c 30720 -ub 2048 -t 1 -ngl 100 (all on the GPU; default SWA cache)", "resident", {}, (186.13, 186.13), 256, "ikawrakow/ik_llama.cpp discussion #758 (CUDA performance, llama.cpp tables; archived copy in a github-data/ folder)", "check", "TG512 from N_KV=0 (186.09 with --swa-full)"),
    ConsumerRow("gpt-oss-20b MXFP4 (ggml-org GGUF)", "gpt-oss-20b", "mxfp4+q8_0", "rtx4080", None, 16.0, "llama.cpp llama-sweep-bench -c 30720 -ub 2048 -t 1 -ngl 100 (all on the GPU; default SWA cache)", "resident", {}, (165.66, 165.66), 4352, "ikawrakow/ik_llama.cpp discussion #758 (CUDA performance, llama.cpp tables; archived copy in a github-data/ folder)", "check", "TG512 from N_KV=4096: 0.89x of depth 0 (159.87 with --swa-full, 0.86x)"),
    ConsumerRow("gpt-oss-20b MXFP4 (ggml-org GGUF)", "gpt-oss-20b", "mxfp4+q8_0", "rtx4080", None, 16.0, "llama.cpp llama-sweep-bench -c 30720 -ub 2048 -t 1 -ngl 100 (all on the GPU; default SWA cache)", "resident", {}, (162.28, 162.28), 8448, "ikawrakow/ik_llama.cpp discussion #758 (CUDA performance, llama.cpp tables; archived copy in a github-data/ folder)", "check", "TG512 from N_KV=8192: 0.87x of depth 0 (154.43 with --swa-full, 0.83x)"),
    ConsumerRow("gpt-oss-20b Q4_K_M GGUF", "gpt-oss-20b", "mxfp4+q4_k_m", "rtx3060-12gb", None, 12.0, "llama-bench -n 128 -p 512,4096 -pg 4096,128 -ngl 99 -r 2, Vulkan build (tg128)", "resident", {}, (83.96, 83.96), 64, "geerlingguy/ai-benchmarks#40 (README 'gpt-oss 20b' table, Intel Core Ultra 265K host)", "check", "Vulkan on an NVIDIA card; model file named gpt-oss-20b-Q4_K_M.gguf in the issue checklist (#39): its dense-tensor format not read (experts assumed MXFP4, as such GGUFs keep them); 11.6 GB on a 12 GB card: check the fit", backend="vulkan"),
    ConsumerRow("gpt-oss-20b Q4_K_M GGUF", "gpt-oss-20b", "mxfp4+q4_k_m", "rtx4070ti", None, 12.0, "llama-bench -n 128 -p 512,4096 -pg 4096,128 -ngl 99 -r 2, Vulkan build (tg128)", "resident", {}, (163.14, 163.14), 64, "geerlingguy/ai-benchmarks#45 (README 'gpt-oss 20b' table, Intel Core Ultra 265K host)", "check", "as the RTX 3060 row: Vulkan, same file and method", backend="vulkan"),
    ConsumerRow("gpt-oss-20b Q4_K_M GGUF", "gpt-oss-20b", "mxfp4+q4_k_m", "rtx4090", None, 24.0, "llama-bench -n 128 -p 512,4096 -pg 4096,128 -ngl 99 -r 2, Vulkan build 086a63e3a (tg128)", "resident", {}, (279.65, 279.65), 64, "geerlingguy/ai-benchmarks#43 (README 'gpt-oss 20b' table, Intel Core Ultra 265K host)", "check", "1.6x the existing 4090 check row (llama.cpp#16649, CUDA, 167-173): another build and backend", backend="vulkan"),
    ConsumerRow("Qwen3-30B-A3B Q4_K_M", "qwen3-30b-a3b", "q4_k_m", "rtx5090", None, 32.0, "llama-bench -ngl 99 -fa 1 -p 1024 -n 400, b10741 CUDA 13.3 Windows release binaries (tg400)", "resident", {}, (134.18, 134.18), 200, "ggml-org/llama.cpp#28196 (control row, same rig)", "check", "134.18 +/- 1.84 over 5 reps; Windows 11"),
    ConsumerRow("Qwen3-30B-A3B-Instruct-2507 Q4_K_M", "qwen3-30b-a3b", "q4_k_m", "rx7900xt", None, 20.0, "llama-server -ngl 99, Vulkan (RADV, Mesa 25.0.7), ctx 4096 (llmfit bench --runs 3)", "resident", {}, (132.54, 162.7), 100, "AlexsJones/llmfit#808 (llmfit-core/data/community/amd-radeon-rx-7900-xt/1785258762-ee642f2d.json)", "check", "avg 151.77; host i9-10900X (not needed: resident). llmfit's llamacpp TPS = output tokens / whole request wall time (a short prompt's prefill and the HTTP round trip included): a lower bound on decode", backend="vulkan"),
    ConsumerRow("gpt-oss-20b MXFP4", "gpt-oss-20b", "mxfp4+q8_0", "rx7900xt", None, 20.0, "llama-server -ngl 99, Vulkan (RADV, Mesa 25.0.7), ctx 4096 (llmfit bench --runs 3)", "resident", {}, (153.4, 167.53), 150, "AlexsJones/llmfit#808 (llmfit-core/data/community/amd-radeon-rx-7900-xt/1785258762-ee642f2d.json)", "check", "avg 162.61; same file as the RTX 2080 rows (gpt-oss-20b-MXFP4.gguf). llmfit's llamacpp TPS = output tokens / whole request wall time (a short prompt's prefill and the HTTP round trip included): a lower bound on decode", backend="vulkan"),
    ConsumerRow("DeepSeek-Coder-V2-Lite-Instruct Q4_K_M (V2-Lite arch.)", "deepseek-v2-lite", "q4_k_m", "rx7900xt", None, 20.0, "llama-server -ngl 99, Vulkan (RADV, Mesa 25.0.7), ctx 4096 (llmfit bench --runs 3)", "resident", {}, (173.84, 197.07), 130, "AlexsJones/llmfit#808 (llmfit-core/data/community/amd-radeon-rx-7900-xt/1785258762-ee642f2d.json)", "fit", "avg 187.82. llmfit's llamacpp TPS = output tokens / whole request wall time (a short prompt's prefill and the HTTP round trip included): a lower bound on decode", backend="vulkan", fits="backend"),
    ConsumerRow("gpt-oss-20b (converted to GGUF by the user, MXFP4 experts)", "gpt-oss-20b", "mxfp4+q8_0", "rx7900xt", "ddr4-3200x2", 20.0, "llama-server --ctx-size 0 --jinja -b 4096 -ub 4096 -ngl 99 -fa -cmoe (ROCm 6.4.1, b6194)", "static_split", {"layers_on_gpu": 0}, (20.0, 20.0), 500, "ggml-org/llama.cpp discussion #15396 (reply on the AMD part; read from a stored mirror, www.webkkk.net/ggml-org/llama.cpp/discussions/15396)", "check", "'~20tok/s' as reported by the webui; every expert on the host (Ryzen 9 5900X, dual-channel DDR4-3200 CL16, 32 GB); dense tensors' format of the user's own conversion unknown; context not published (500 assumed); repost of the GitHub thread", backend="rocm"),
    ConsumerRow("gpt-oss-20b (converted to GGUF by the user, MXFP4 experts)", "gpt-oss-20b", "mxfp4+q8_0", "rx7900xt", "ddr4-3200x2", 20.0, "llama-server --ctx-size 0 --jinja -b 4096 -ub 4096 -ngl 99 -fa (ROCm 6.4.1, b6194)", "resident", {}, (94.0, 94.0), 500, "ggml-org/llama.cpp discussion #15396 (same reply)", "check", "'~94 tokens/second ... slowly going down as the context fills up' (webui); the full 128K context allocated, VRAM 'filled to the brim'; ROCm where the llmfit row is Vulkan: see backend notes", backend="rocm"),
    ConsumerRow("Qwen3-VL-30B-A3B-Instruct Q4_K_M (unsloth; Qwen3-30B-A3B text stack)", "qwen3-30b-a3b", "q4_k_m", "rx6800", "ddr5-6000x2", 16.0, "llama-server -ngl 60 --n-cpu-moe 8 -c 8192 -ctk q8_0 -ctv q8_0 -fa -b 64 -ub 32 -t 12 --parallel 1 (ROCm)", "static_split", {"layers_on_gpu": 40}, (34.1, 34.1), 256, "mudkipdev/flake modules/models/README.md@42c76cf + modules/models/qwen3-vl.nix@c6495cc", "check", "8 of 48 expert layers on the host (Ryzen 9 9900X, 64 GB DDR5-6000, AM5: 2 channels); how the 34.1 was measured and at what depth is not stated (context 256 assumed); q8_0 KV cache; no mmproj in the flags", backend="rocm"),
    ConsumerRow("openai/gpt-oss-20b GGUF (LM Studio)", "gpt-oss-20b", "mxfp4+q8_0", "rx9070xt", "ddr4-3200x2", 16.0, "LM Studio, Vulkan runtime, GPU offload 24/24, context 8096, flash attention on, KV on GPU", "resident", {}, (130.8, 132.75), 400, "lmstudio-ai/lmstudio-bug-tracker#574 (comment by SimSonic, 2025-10-11)", "check", "4 runs; host Ryzen 7 5700G, 64 GB DDR4-3200 (not needed: resident); published as 'GGUF MXFP8' (the MXFP4 release assumed); context not published (a ~500-word answer: 400 assumed)", backend="vulkan"),
    ConsumerRow("openai/gpt-oss-20b GGUF (LM Studio)", "gpt-oss-20b", "mxfp4+q8_0", "rx9070xt", "ddr4-3200x2", 16.0, "LM Studio, ROCm (beta) runtime, GPU offload 24/24, context 8096, flash attention on, KV on GPU", "resident", {}, (109.27, 111.62), 400, "lmstudio-ai/lmstudio-bug-tracker#574 (comment by SimSonic, 2025-10-11)", "fit", "the same box and prompt as the Vulkan row: ROCm at 0.84x Vulkan", backend="rocm", fits="backend"),
    ConsumerRow("gpt-oss-20b MXFP4", "gpt-oss-20b", "mxfp4+q8_0", "m4pro-24gb", None, 24.0, "llama-server -ngl 999, Metal (commit da5b448), ctx 4096 (llmfit bench --runs 3)", "resident", {}, (64.07, 67.97), 150, "AlexsJones/llmfit#812 (llmfit-core/data/community/apple-m4-pro/1785350891-d9aff26a.json)", "check", "avg 66.51; MacBook Pro Mac16,8, M4 Pro 20-core GPU, 24 GB, High Power Mode; unified memory. llmfit's llamacpp TPS = output tokens / whole request wall time (a short prompt's prefill and the HTTP round trip included): a lower bound on decode", backend="metal"),
    ConsumerRow("Qwen3-30B-A3B-Instruct-2507 Q4_K_M", "qwen3-30b-a3b", "q4_k_m", "m4pro-24gb", None, 24.0, "llama-server -ngl 999, Metal (commit da5b448), ctx 4096 (llmfit bench --runs 3)", "resident", {}, (67.55, 72.06), 100, "AlexsJones/llmfit#812 (llmfit-core/data/community/apple-m4-pro/1785350891-d9aff26a.json)", "check", "avg 70.55; 17.3 GB resident in 24 GB unified memory ('offloaded N/N layers' verified per model). llmfit's llamacpp TPS = output tokens / whole request wall time (a short prompt's prefill and the HTTP round trip included): a lower bound on decode", backend="metal"),
    ConsumerRow("DeepSeek-Coder-V2-Lite-Instruct Q4_K_M (V2-Lite arch.)", "deepseek-v2-lite", "q4_k_m", "m4pro-24gb", None, 24.0, "llama-server -ngl 999, Metal (commit da5b448), ctx 4096 (llmfit bench --runs 3)", "resident", {}, (88.14, 91.82), 130, "AlexsJones/llmfit#812 (llmfit-core/data/community/apple-m4-pro/1785350891-d9aff26a.json)", "fit", "avg 90.59. llmfit's llamacpp TPS = output tokens / whole request wall time (a short prompt's prefill and the HTTP round trip included): a lower bound on decode", backend="metal", fits="backend"),
    ConsumerRow("gpt-oss-20b GGUF", "gpt-oss-20b", "mxfp4+q4_k_m", "m3ultra-512gb", None, 512.0, "llama-bench -n 128 -p 512,4096 -pg 4096,128 -ngl 99 -r 2, Metal (tg128)", "resident", {}, (115.29, 115.29), 64, "geerlingguy/ai-benchmarks#42 (README 'gpt-oss 20b' table)", "check", "Mac Studio M3 Ultra 32-core CPU / 80-core GPU, 512 GB (geerlingguy/sbc-reviews#95); the GGUF's quantization as in the RTX rows (not read)", backend="metal"),
    ConsumerRow("gpt-oss-20b (llama.cpp Vulkan)", "gpt-oss-20b", "mxfp4+q8_0", "arca770-16gb", None, 16.0, "llama.cpp, Vulkan, Windows 11 (flags not published; a 20B model on a 16 GB card: resident assumed)", "resident", {}, (72.0, 72.0), 64, "openvinotoolkit/openvino#35199 (description, 2026-04-07)", "check", "read from the reporter's heading 'A770 llama.cpp (Vulkan) - 72 t/s' over a screenshot; format, flags, host and depth not published: weakest row here", backend="vulkan"),
)


@lru_cache(maxsize=None)
def _geometry(config: str) -> ModelGeometry:
    return geometry_from_config(config)


def _layers_on_gpu(row: ConsumerRow) -> int:
    """Expert layers on the GPU of a static split: published, or the estimator's VRAM rule."""
    g, p = _geometry(row.config), row.placement
    if p.get("layers_on_gpu") is not None:
        return p["layers_on_gpu"]
    b = vram_budget(g, get_precision(row.weights), row.vram_gib * GiB, p["context"])
    return min(g.moe_layers, int(b.experts // (g.num_experts * b.expert_bytes)))


def _placement_label(row: ConsumerRow) -> str:
    g, p = _geometry(row.config), row.placement
    if row.strategy == "resident":
        return "every expert on the GPU"
    if row.strategy == "fiddler":
        return f"{p['gpu_experts']} of {g.num_experts} experts/layer on the GPU ({p['by']}), host overlapped"
    if "gpu_layers" in p:
        return f"{p['gpu_layers']} of {g.decoder_layers} whole layers on the GPU (-ngl {p['gpu_layers']})"
    return f"experts of {_layers_on_gpu(row)} of {g.moe_layers} MoE layers on the GPU"


def _machine(row: ConsumerRow) -> Machine:
    gpu, card = resolve_gpu(row.gpu, row.vram_gib * GiB)
    vram = unified_gpu_bytes(row.vram_gib * GiB) if card is not None and card.unified_memory else row.vram_gib * GiB
    return Machine(gpu, vram, get_host(row.host), card, backend=row.backend)


def _counts(row: ConsumerRow) -> tuple[Counts, dict]:
    """The row's placement as counts per layer, and the pricing options it needs."""
    g, p = _geometry(row.config), row.placement
    L, k = g.moe_layers, g.top_k
    if row.strategy == "resident" or "gpu_layers" in p:
        return resident(L, k), {"gpu_layers": p.get("gpu_layers")}
    if row.strategy == "fiddler":
        return uniform_hot_set(g, p["gpu_experts"]), {"overlap": p.get("overlap", False)}
    on_gpu = _layers_on_gpu(row)
    return static_layers([l >= L - on_gpu for l in range(L)], k), {}


def _central(row: ConsumerRow, eta: float, backend: float | None = None) -> Scenario:
    """The row's scenario: its machine, its weights on its backend (``backend``: that backend's factor instead of
    the fitted one), host efficiency ``eta``, its depth."""
    m = _machine(row)
    p = get_precision(row.weights)
    if backend is None:
        p = on_backend(p, m)
    elif backend != 1.0:
        p = WeightPrecision(replace(p.experts, gpu_efficiency=p.experts.gpu_efficiency * backend),
                            replace(p.dense, gpu_efficiency=p.dense.gpu_efficiency * backend))
    return Scenario(m, p, eta, row.context)


def _priced(row: ConsumerRow, eta: float, scenario: Scenario | None = None) -> float:
    """Simulated ms per token of ``row`` with host efficiency ``eta`` (or at ``scenario``)."""
    g = _geometry(row.config)
    sc = scenario or _central(row, eta)
    counts, extra = _counts(row)
    cost = sc.cost(g, extra.get("gpu_layers"))
    return price_token(cost, counts, g.top_k, sc.depth, extra.get("overlap", False)).total_ms


def row_band(row: ConsumerRow, eta: float = HOST_DECODE_EFFICIENCY) -> tuple[float, float, str]:
    """(low, high, dominant unknown) tokens/s of ``row``: the estimate's band on the row's machine, its depth
    known (the row's context)."""
    central = _central(row, eta)
    mid = 1e3 / _priced(row, eta, central)
    swings = {u.name: (1e3 / _priced(row, eta, u.slow), 1e3 / _priced(row, eta, u.fast))
              for u in unknowns(central, row.context, depth_given=True)}
    return combine(mid, swings)


def _solve(priced, target_ms: float) -> float:
    """The x in [1e-3, 20] at which ``priced(x)`` (falling as x grows) is ``target_ms`` (bisection, log scale)."""
    lo, hi = 1e-3, 20.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if priced(mid) > target_ms else (lo, mid)
    return math.sqrt(lo * hi)


def _row_eta(row: ConsumerRow) -> float:
    """The host efficiency at which ``row`` is reproduced exactly."""
    return _solve(lambda eta: _priced(row, eta), 1e3 / row.published_mid)


def _row_backend(row: ConsumerRow) -> float:
    """The backend efficiency (relative to CUDA's) at which ``row`` is reproduced exactly."""
    return _solve(lambda f: _priced(row, HOST_DECODE_EFFICIENCY, _central(row, HOST_DECODE_EFFICIENCY, f)),
                  1e3 / row.published_mid)


def _fitted_on(row: ConsumerRow) -> str | None:
    return row.fits if row.split == "fit" else None


def derive_host_efficiency(rows: tuple[ConsumerRow, ...] = CONSUMER_ROWS, exclude: int | None = None) -> float:
    """Geometric mean over the ``fit`` rows of the host efficiency each reproduces exactly; ``exclude`` leaves
    that row index out (the leave-one-out check)."""
    etas = [_row_eta(r) for i, r in enumerate(rows) if _fitted_on(r) == "host" and i != exclude]
    return math.exp(sum(math.log(e) for e in etas) / len(etas))


def derive_backend_efficiency(rows: tuple[ConsumerRow, ...] = CONSUMER_ROWS) -> dict[tuple[str, str], float]:
    """Per (vendor, backend) with fit rows: the geometric mean of the backend efficiency each reproduces exactly
    (what ``bands.BACKEND_EFFICIENCY`` holds)."""
    found: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if _fitted_on(r) in ("backend", "arch"):
            m = _machine(r)
            key = (m.card.vendor, m.backend_name, m.card.arch) if r.fits == "arch" else (m.card.vendor, m.backend_name)
            found.setdefault(key, []).append(_row_backend(r))
    return {k: math.exp(sum(math.log(x) for x in v) / len(v)) for k, v in found.items()}


def simulate_consumer_row(row: ConsumerRow, eta: float = HOST_DECODE_EFFICIENCY) -> float:
    """Simulated tokens/s of one row."""
    return 1e3 / _priced(row, eta)


def consumer_anchors(rows: tuple[ConsumerRow, ...] = CONSUMER_ROWS) -> pd.DataFrame:
    """Published consumer tokens/s vs the estimator's, one row per measurement: ratio (simulated / published
    midpoint), leave-one-out ratio for the fitted rows, the row's own host efficiency, the placement and every
    assumption the row needs."""
    out = []
    for i, r in enumerate(rows):
        sim = simulate_consumer_row(r)
        loo = simulate_consumer_row(r, derive_host_efficiency(rows, exclude=i)) / r.published_mid \
            if _fitted_on(r) == "host" else None
        lo, hi = r.published_tok_s
        ratio = sim / r.published_mid
        b_lo, b_hi, dominant = row_band(r)
        out.append({
            "model": r.model, "machine": f"{r.gpu} + {r.host or 'host not published'}",
            "host_known": r.host is not None, "engine": r.engine, "strategy": r.strategy,
            "placement": _placement_label(r),
            "published_tok_s": f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}", "published_mid": r.published_mid,
            "simulated_tok_s": sim, "ratio": ratio, "within_30pct": abs(ratio - 1) <= TOLERANCE,
            "in_published_range": lo * (1 - TOLERANCE) <= sim <= hi * (1 + TOLERANCE), "loo_ratio": loo,
            "band_tok_s": f"{b_lo:.3g}-{b_hi:.3g}", "band_low": b_lo, "band_high": b_hi,
            "in_band": b_lo <= hi and lo <= b_hi, "dominant_unknown": dominant, "abs_error": abs(ratio - 1),
            "row_host_efficiency": _row_eta(r) if _fitted_on(r) == "host" else None,
            "row_backend_efficiency": _row_backend(r) if _fitted_on(r) in ("backend", "arch") else None,
            "role": r.role,
            "split": r.split,
            "weights": r.weights, "source": r.source, "note": r.note,
        })
    return pd.DataFrame(out)


def consumer_summary(df: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``fit`` and ``check`` rows' errors apart: rows, median |simulated / published - 1| (also over the rows
    whose host is published), the largest, and how many published figures (or ranges) meet the printed band
    (``sl.bench.consumer_anchors()`` is ``df``)."""
    df = consumer_anchors() if df is None else df
    out = []
    for split in ("fit", "check"):
        g = df[df.split == split]
        known = g[g.host_known]
        out.append({"split": split, "rows": len(g), "median_abs_error": float(g.abs_error.median()),
                    "median_abs_error_host_known": float(known.abs_error.median()) if len(known) else float("nan"),
                    "max_abs_error": float(g.abs_error.max()), "in_band": int(g.in_band.sum()),
                    "band_coverage": float(g.in_band.mean())})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------ the flags' property

PROPERTY_FAMILIES = ("deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b")
PROPERTY_MACHINES = (("rtx3060", "ddr4-3200x2"), ("rtx4090", "ddr5-6000x2"), ("rtx2080", "i9-10900x-ddr4-2933"),
                     ("gtx1060", "i5-7600k-ddr4-3000"))


def flag_property(n: int = 1000, seed: int = 0, weights: str = "q4_k_m") -> dict:
    """Random llama.cpp flag sets (:func:`~.flags.random_flags`) over four families and four machines, in pairs:
    where one keeps strictly more on the host than the other, it must not be priced faster on the same clock.
    Returns the pairs drawn, those ordered that way, and the violations (each a flag pair)."""
    import numpy as np

    from .flags import keeps_more_on_host, parse_placement, random_flags

    rng = np.random.default_rng(seed)
    ordered, violations = 0, []
    for i in range(n):
        family = PROPERTY_FAMILIES[i % len(PROPERTY_FAMILIES)]
        gpu, host = PROPERTY_MACHINES[(i // len(PROPERTY_FAMILIES)) % len(PROPERTY_MACHINES)]
        g = _geometry(family)
        a, b = (parse_placement(random_flags(g, rng), g) for _ in range(2))
        if keeps_more_on_host(b, a, g):
            a, b = b, a
        if not keeps_more_on_host(a, b, g):
            continue
        ordered += 1
        profile, card = resolve_gpu(gpu)
        sc = Scenario(Machine(profile, card.vram_gb * GiB, get_host(host), card), get_precision(weights),
                      HOST_DECODE_EFFICIENCY, 4096)
        price = lambda p: price_token(sc.cost(g, p.gpu_layers), static_layers([not h for h in p.host_layers],
                                                                               g.top_k), g.top_k, sc.depth).total_ms
        if price(b) < price(a):
            violations.append((family, gpu, a.flags, b.flags))
    return {"pairs": n, "ordered": ordered, "violations": violations}
