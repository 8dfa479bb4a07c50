"""The user's own placement: the llama.cpp flags someone runs today, read the way llama.cpp reads them, priced as
given beside the other rows, so "what do I gain by changing it" is one line.

Every flag is understood, read past as one that does not change decode speed, or refused by name:

* ``-ngl N`` / ``--n-gpu-layers N`` / ``--gpu-layers N``: decoder layers on the GPU, counted from the last one
  back (``N`` >= the layers: all, and the LM head too; ``all`` / ``auto``: all); the first ones run whole on the
  host, attention and every expert. Not given: every layer on the GPU (recent llama.cpp's default; said so).
* ``--cpu-moe`` / ``-cmoe`` (every routed expert in host memory), ``--n-cpu-moe N`` / ``-ncmoe N`` (the experts of
  blocks 0..N-1, blocks counted over every decoder layer as llama.cpp numbers them).
* ``-ot`` / ``--override-tensor PATTERN=BUFFER[,...]`` (repeatable): the first rule whose pattern
  ``std::regex_search`` finds in a tensor's name places it, as llama.cpp does. ``CPU`` keeps a layer's
  ``blk.N.ffn_{up,gate,down}_exps.weight`` in host memory; a GPU buffer (``CUDA0``, ``ROCm0``, ``Vulkan0``,
  ``SYCL0``, ``Metal``) keeps them on the device. A rule that moves anything else (attention, the output) is
  refused by name: only experts are placed here.
* ``--moe-cache-mib M`` with ``--moe-cache-cpu-share F``: the expert cache (a global LRU of M MiB over the experts in
  host memory: with ``--cpu-moe`` every layer's; with only some layers' experts there it is refused).
* ``-c N`` / ``--ctx-size N``: the KV cache's size (what VRAM reserves); ``-ctk`` / ``-ctv`` /
  ``--cache-type-k`` / ``--cache-type-v``: its type (f16, q8_0, q4_0, ...: its bytes in VRAM and read per token);
  ``-fa`` / ``--flash-attn``: read (quantized V needs it, as llama.cpp says).
* ``--no-mmap`` (the whole file read into RAM: refused where ``ram=`` cannot hold it) and ``--mlock`` (pinned in
  RAM); ``-ub N`` / ``-b N``: the prompt's micro-batch (the TTFT table prices one micro-batch at a time).
* read past, not changing decode speed: ``-m``, ``-t``, ``--port``, ``--host``, ``-np``, ``-n``, ``-p``, ``--temp``,
  ``-s``, ``--jinja``, ``--numa``, ``-tb``, ``--no-warmup``, ``--verbose``, ...
* refused: several GPUs (``-sm``, ``-ts``, ``-mg``, ``-dev``), ``--fit`` (llama.cpp chooses its own placement: give
  the flags it printed), and any flag not listed here.

A flag set whose weights do not fit the card's free VRAM is refused with the numbers and the nearest set that
fits (:meth:`UserPlacement.check_fit`).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field, replace

from ..model.geometry import ModelGeometry
from ..pricing.llamacpp import KV_BITS
from ..pricing.precision import WeightPrecision
from ..run import STRATEGIES, Strategy

__all__ = ["UserPlacement", "parse_placement", "KV_TYPES", "PlacementError"]

MiB = 2**20
_EXPERT_TENSORS = ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps")
KV_TYPES = KV_BITS  # bits a KV cache value takes in each type llama.cpp's -ctk / -ctv accept
_GPU_BUFFER = re.compile(r"(CUDA|ROCm|ROCM|Vulkan|VULKAN|SYCL|Metal|METAL|GPU|BLAS)\d*")
_READ_PAST_VALUED = {"-m", "--model", "-t", "--threads", "-tb", "--threads-batch", "--port", "--host", "-np",
                     "--parallel", "-n", "--n-predict", "-p", "--prompt", "--temp", "-s", "--seed", "--top-k",
                     "--top-p", "--min-p", "--numa", "-a", "--alias", "--chat-template", "-f", "--file",
                     "--repeat-penalty", "-r", "--reverse-prompt", "--api-key", "-to", "--timeout", "-hf",
                     "--hf-repo", "-hff", "--hf-file", "--log-file", "-mu", "--model-url", "--poll", "-C",
                     "--cpu-mask", "--prio", "-pps", "-o", "--output"}
_READ_PAST = {"--jinja", "--no-warmup", "--verbose", "-v", "--no-webui", "--cont-batching", "-cb", "--no-perf",
              "--log-disable", "-i", "--interactive", "-cnv", "--conversation", "-no-cnv", "--no-conversation",
              "-e", "--escape", "--metrics", "--slots", "--no-display-prompt", "-st", "--single-turn"}
_REFUSED = {"-sm": "several GPUs (--split-mode): an estimate is for one GPU",
            "--split-mode": "several GPUs: an estimate is for one GPU",
            "-ts": "several GPUs (--tensor-split): an estimate is for one GPU",
            "--tensor-split": "several GPUs: an estimate is for one GPU",
            "-mg": "several GPUs (--main-gpu): an estimate is for one GPU",
            "--main-gpu": "several GPUs: an estimate is for one GPU",
            "-dev": "several devices (--device): an estimate is for one GPU",
            "--device": "several devices: an estimate is for one GPU",
            "--fit": "llama.cpp chooses its own placement with --fit: give the -ngl / --n-cpu-moe flags it printed",
            "-fit": "llama.cpp chooses its own placement with -fit: give the flags it printed",
            "--no-op-offload": "keeps the prompt's host experts on the CPU: the prefill it implies is not priced",
            "-dt": "speculative decoding with a draft model (-md): not a placement this prices",
            "-md": "a separate draft model: not a placement this prices",
            "--model-draft": "a separate draft model: not a placement this prices"}


class PlacementError(ValueError):
    """A placement= flag set that cannot be priced: names the flag and what is understood."""


@dataclass(frozen=True)
class UserPlacement:
    """What the flags place where: per MoE layer whether its routed experts live in host memory; how many decoder
    layers are on the GPU (``-ngl``; None: all); the expert cache (MiB, None without one) and its CPU share; the KV
    cache's size and type; the prompt's micro-batch; how the file is held in RAM."""

    flags: str
    host_layers: tuple[bool, ...]  # per MoE layer: experts in host memory
    gpu_layers: int | None = None  # -ngl (None: every layer)
    cache_mib: float | None = None
    cpu_share: float = 0.0
    context: int | None = None  # -c
    kv_type: str = "f16"  # -ctk / -ctv (the wider of the two prices both)
    ubatch: int | None = None  # -ub (or -b)
    no_mmap: bool = False
    mlock: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def n_host(self) -> int:
        return sum(self.host_layers)

    @property
    def strategy(self) -> Strategy:
        """The row that runs these flags: the expert cache (``global_lru``) or whole layers placed once
        (``static_split``)."""
        return STRATEGIES["global_lru" if self.cache_mib else "static_split"]

    def replay_options(self, budget) -> dict:
        """The replay options of these flags (``budget``: the estimate's VRAM split, for the expert bytes). A
        static placement names its host layers (its VRAM was checked by :meth:`check_fit`), so its budget is every
        expert's."""
        kv = {"kv_type": self.kv_type} if self.kv_type != "f16" else {}
        if self.cache_mib:
            slots = max(1, int(self.cache_mib * MiB // budget.expert_bytes))
            return {"expert_budget": int(slots * math.ceil(budget.expert_bytes)), "cpu_share": self.cpu_share or None,
                    **kv}
        return {"expert_budget": 1.0, "host_layers": [l for l, h in enumerate(self.host_layers) if h],
                "gpu_layers": self.gpu_layers, **kv}

    def host_decoder_layers(self, geom: ModelGeometry) -> int:
        """Decoder layers ``-ngl`` leaves whole on the host (the first ones)."""
        return 0 if self.gpu_layers is None else max(0, geom.decoder_layers - self.gpu_layers)

    def gpu_bytes(self, geom: ModelGeometry, prec: WeightPrecision, context: int, overhead: float) -> dict:
        """What these flags put in VRAM, by part (bytes): dense weights of the GPU layers (+ the LM head when
        it is there), their experts, their KV cache at ``-c`` (or ``context``) in its type, the expert cache, the
        runtime's overhead."""
        host_dec = self.host_decoder_layers(geom)
        on_gpu_dec = geom.decoder_layers - host_dec
        head_on_gpu = self.gpu_layers is None or self.gpu_layers > geom.decoder_layers
        per_moe_dense = geom.dense_params_per_moe_layer
        dense_layers = [i for i in range(geom.decoder_layers) if i not in set(geom.moe_decoder_index)]
        per_dense = geom.dense_layer_params / max(1, len(dense_layers))
        dense = sum(per_moe_dense for d in geom.moe_decoder_index if d >= host_dec)
        dense += sum(per_dense for d in dense_layers if d >= host_dec)
        dense = dense * prec.dense.bytes_per_weight + (geom.head_params * prec.dense.bytes_per_weight if head_on_gpu else 0)
        on_gpu = [not h and d >= host_dec for h, d in zip(self.host_layers, geom.moe_decoder_index)]
        experts = sum(on_gpu) * geom.num_experts * geom.expert_params * prec.experts.bytes_per_weight
        ctx = self.context or context
        kv = sum(b * (ctx if w is None else min(w, ctx)) for i, (b, w) in
                 enumerate(zip(geom.kv_bytes_per_token, geom.kv_window)) if i >= host_dec) * KV_TYPES[self.kv_type] / 16
        return {"dense weights": dense, "experts": experts, "KV cache": kv,
                "expert cache": (self.cache_mib or 0.0) * MiB, "runtime overhead": overhead,
                "layers on the GPU": on_gpu_dec}

    def check_fit(self, geom: ModelGeometry, prec: WeightPrecision, vram: float, context: int,
                  overhead: float) -> None:
        """Refuse (:class:`PlacementError`) flags whose weights do not fit ``vram``, with the numbers and the
        nearest flag set that fits."""
        parts = self.gpu_bytes(geom, prec, context, overhead)
        need = sum(v for k, v in parts.items() if k != "layers on the GPU")
        if need <= vram:
            return
        GiB = 2**30
        said = ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in parts.items() if k != "layers on the GPU" and v)
        raise PlacementError(f"placement={self.flags!r} puts {need / GiB:.2f} GiB in VRAM ({said}), more than the "
                             f"{vram / GiB:.2f} GiB the card has: {self._nearest(geom, prec, vram, context, overhead)}")

    def _nearest(self, geom: ModelGeometry, prec: WeightPrecision, vram: float, context: int, overhead: float) -> str:
        """The nearest flag set that fits: more expert layers on the host (``--n-cpu-moe``), else fewer layers on
        the GPU (``-ngl``)."""
        offset = geom.dense_layers
        fits = lambda p: sum(v for k, v in p.gpu_bytes(geom, prec, context, overhead).items()
                             if k != "layers on the GPU") <= vram
        keep = [f for f in _kept_flags(self.flags)]
        for n in range(geom.moe_layers + 1):  # experts of the first n MoE layers on the host, the rest as given
            host = tuple(h or l < n for l, h in enumerate(self.host_layers))
            if fits(replace(self, host_layers=host)):
                return (f"the nearest that fits keeps the experts of the first {n} MoE layers on the host: "
                        f"{' '.join(keep + [f'--n-cpu-moe {n + offset if n else 0}'])}")
        for ngl in range((self.gpu_layers if self.gpu_layers is not None else geom.decoder_layers + 1), -1, -1):
            cand = replace(self, gpu_layers=ngl, host_layers=tuple(True for _ in self.host_layers))
            if fits(cand):
                return f"even every expert on the host does not fit; the nearest that fits: -ngl {ngl} --cpu-moe"
        return "nothing fits: use a GPU with more memory, a smaller context (-c), or narrower weights"

    def describe(self, geom: ModelGeometry, slots: list[int]) -> str:
        parts = [f"{self.flags}:"]
        if self.gpu_layers is not None and self.host_decoder_layers(geom):
            parts.append(f"{self.host_decoder_layers(geom)} of {geom.decoder_layers} decoder layers whole on the host,")
        parts.append(f"experts of {self.n_host} of {geom.moe_layers} MoE layers in host memory")
        if self.cache_mib:
            parts.append(f"with an expert cache of {self.cache_mib:g} MiB")
        return " ".join(parts)


def _bad(flags: str, what: str) -> PlacementError:
    return PlacementError(f"placement={flags!r}: {what}. Understood: -ngl N, --cpu-moe, --n-cpu-moe N, "
                          "-ot 'PATTERN=CPU|CUDA0', --moe-cache-mib M, --moe-cache-cpu-share F, -c N, -ctk/-ctv TYPE, "
                          "-fa, --no-mmap, --mlock, -ub/-b N (llama.cpp's flags; specter_lab/estimator/flags.py).")


def _kept_flags(flags: str) -> list[str]:
    """The flags other than the expert placement ones (what a suggestion keeps as typed)."""
    out, argv, i = [], shlex.split(flags), 0
    while i < len(argv):
        a = argv[i].partition("=")[0] if argv[i].startswith("--") else argv[i]
        if a in ("--cpu-moe", "-cmoe"):
            pass
        elif a in ("--n-cpu-moe", "-ncmoe", "-ot", "--override-tensor"):
            i += 0 if "=" in argv[i] and argv[i].startswith("--") else 1
        else:
            out.append(shlex.quote(argv[i]))
        i += 1
    return out


def parse_placement(flags: str, geom: ModelGeometry) -> UserPlacement:
    """Read llama.cpp flags for ``geom``'s layers; a :class:`PlacementError` names ``placement=``, the flag, and
    what is understood."""
    if not isinstance(flags, str) or not flags.strip():
        raise _bad(str(flags), "give the llama.cpp flags as one string")
    try:
        argv = shlex.split(flags)
    except ValueError as e:
        raise _bad(flags, f"cannot split it as a shell line ({e})") from None
    if argv and not argv[0].startswith("-"):  # the program itself (llama-server ...)
        argv = argv[1:]
    state = _Read(flags, geom)
    i = 0
    while i < len(argv):
        i = state.read(argv, i)
    return state.placement()


class _Read:
    """The flags read so far (one pass over argv, llama.cpp's order)."""

    def __init__(self, flags: str, geom: ModelGeometry) -> None:
        self.flags, self.geom = flags, geom
        self.cpu_moe = False
        self.n_cpu_moe = 0
        self.rules: list[tuple[re.Pattern, str, str]] = []  # (pattern, buffer, rule as typed)
        self.gpu_layers: int | None = None
        self.cache = None
        self.share = 0.0
        self.context = None
        self.kv = {"k": "f16", "v": "f16"}
        self.fa = None
        self.ubatch = None
        self.no_mmap = self.mlock = False
        self.notes: list[str] = []
        self.read_past: list[str] = []

    def _value(self, argv: list[str], i: int, name: str) -> tuple[str, int]:
        """(the flag's value, the next index): ``--flag=value`` or ``--flag value``."""
        a = argv[i]
        if a.startswith("--") and "=" in a:
            return a.partition("=")[2], i + 1
        if i + 1 >= len(argv):
            raise _bad(self.flags, f"{name} needs a value")
        return argv[i + 1], i + 2

    def _int(self, raw: str, name: str, allow: tuple = ()) -> int | None:
        if raw.lower() in allow:
            return None
        if not re.fullmatch(r"-?\d+", raw):
            raise _bad(self.flags, f"{name} takes a whole number, got {raw!r}")
        return int(raw)

    def read(self, argv: list[str], i: int) -> int:
        a = argv[i].partition("=")[0] if argv[i].startswith("--") else argv[i]
        if a in ("--cpu-moe", "-cmoe"):
            self.cpu_moe = True
            return i + 1
        if a in ("--n-cpu-moe", "-ncmoe"):
            raw, j = self._value(argv, i, a)
            n = self._int(raw, a)
            if n < 0:
                raise _bad(self.flags, f"{a} {raw}: a count of blocks cannot be negative")
            self.n_cpu_moe = n
            return j
        if a in ("-ngl", "--n-gpu-layers", "--gpu-layers"):
            raw, j = self._value(argv, i, a)
            n = self._int(raw, a, ("all", "auto"))
            if n is not None and n < 0:
                n = None  # -1: every layer, as llama.cpp reads it
            self.gpu_layers = n
            return j
        if a in ("-ot", "--override-tensor"):
            raw, j = self._value(argv, i, a)
            for rule in raw.split(","):
                self._rule(rule)
            return j
        if a == "--moe-cache-mib":
            raw, j = self._value(argv, i, a)
            try:
                self.cache = float(raw)
            except ValueError:
                raise _bad(self.flags, f"--moe-cache-mib takes MiB, got {raw!r}") from None
            if not math.isfinite(self.cache) or self.cache < 0:
                raise _bad(self.flags, f"--moe-cache-mib {raw}: a size in MiB >= 0")
            return j
        if a == "--moe-cache-cpu-share":
            raw, j = self._value(argv, i, a)
            try:
                self.share = float(raw)
            except ValueError:
                raise _bad(self.flags, f"--moe-cache-cpu-share takes a fraction, got {raw!r}") from None
            if not 0 <= self.share < 1:
                raise _bad(self.flags, f"--moe-cache-cpu-share {raw}: a fraction in [0, 1)")
            return j
        if a in ("-c", "--ctx-size"):
            raw, j = self._value(argv, i, a)
            n = self._int(raw, a)
            if n < 0:
                raise _bad(self.flags, f"{a} {raw}: a context of tokens >= 0")
            self.context = n or None  # 0: the model's own (the estimate's context)
            return j
        if a in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
            raw, j = self._value(argv, i, a)
            if raw.lower() not in KV_TYPES:
                raise _bad(self.flags, f"{a} {raw!r} is not a KV cache type llama.cpp has: use one of {sorted(KV_TYPES)}")
            self.kv["k" if a in ("-ctk", "--cache-type-k") else "v"] = raw.lower()
            return j
        if a in ("-fa", "--flash-attn"):
            if i + 1 < len(argv) and argv[i + 1].lower() in ("on", "off", "auto", "1", "0"):
                self.fa = argv[i + 1].lower() in ("on", "1", "auto")
                return i + 2
            self.fa = True
            return i + 1
        if a in ("-ub", "--ubatch-size", "-b", "--batch-size"):
            raw, j = self._value(argv, i, a)
            n = self._int(raw, a)
            if n < 1:
                raise _bad(self.flags, f"{a} {raw}: a batch of tokens >= 1")
            if a in ("-ub", "--ubatch-size") or self.ubatch is None:
                self.ubatch = n if a in ("-ub", "--ubatch-size") else min(n, 512)
            return j
        if a == "--no-mmap":
            self.no_mmap = True
            return i + 1
        if a == "--mlock":
            self.mlock = True
            return i + 1
        if a in _REFUSED:
            raise _bad(self.flags, f"{a}: {_REFUSED[a]}")
        if a in _READ_PAST_VALUED:
            _, j = self._value(argv, i, a)
            self.read_past.append(a)
            return j
        if a in _READ_PAST:
            self.read_past.append(a)
            return i + 1
        raise _bad(self.flags, f"{argv[i]!r} is not a flag this understands (a placement flag it does not know "
                               "would be priced wrong)")

    def _rule(self, rule: str) -> None:
        pattern, sep, buffer = rule.rpartition("=")
        if not sep or not pattern:
            raise _bad(self.flags, f"-ot {rule!r} is not PATTERN=BUFFER")
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise _bad(self.flags, f"-ot pattern {pattern!r} is not a regex ({e})") from None
        if buffer.upper() != "CPU" and not _GPU_BUFFER.fullmatch(buffer):
            raise _bad(self.flags, f"-ot {rule!r}: buffer {buffer!r} is neither CPU nor a GPU (CUDA0, ROCm0, "
                                   "Vulkan0, SYCL0, Metal)")
        others = [n for n in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                              "blk.0.attn_output.weight", "blk.0.ffn_gate_inp.weight", "output.weight",
                              "token_embd.weight", "blk.0.ffn_up_shexp.weight", "blk.0.ffn_up.weight")
                  if rx.search(n)]
        if others:
            raise _bad(self.flags, f"-ot {rule!r} also matches {others[0]!r}: only the routed experts' tensors "
                                   "(blk.N.ffn_*_exps) are placed here; narrow the pattern to them")
        self.rules.append((rx, "cpu" if buffer.upper() == "CPU" else "gpu", rule))

    def placement(self) -> UserPlacement:
        g = self.geom
        host_dec = 0 if self.gpu_layers is None else max(0, g.decoder_layers - self.gpu_layers)
        host = []
        for l, block in enumerate(g.moe_decoder_index):
            where = None
            names = [f"blk.{block}.{t}.weight" for t in _EXPERT_TENSORS]
            for rx, buffer, rule in self.rules:  # the first matching rule places a tensor
                hits = [bool(rx.search(n)) for n in names]
                if any(hits):
                    if not all(hits):
                        self.notes.append(f"-ot {rule}: block {block} moves some of its expert tensors only; "
                                          "priced as if all did")
                    where = buffer
                    break
            if where is None:
                where = "cpu" if (self.cpu_moe or block < self.n_cpu_moe) else "gpu"
            if block < host_dec and where == "gpu" and any(b == "gpu" for _, b, _ in self.rules):
                raise _bad(self.flags, f"-ot keeps block {block}'s experts on the GPU while -ngl {self.gpu_layers} "
                                       "runs that layer on the host: not a placement the runtime prices")
            host.append(where == "cpu" or block < host_dec)
        cache = self.cache or None
        if cache is not None and not any(host):
            self.notes.append("--moe-cache-mib with every expert layer on the GPU: the cache has nothing to serve")
            cache = None
        if cache is not None and not all(host):
            raise _bad(self.flags, "--moe-cache-mib with only some layers' experts in host memory: the expert cache "
                                   "priced here serves every layer (give --cpu-moe with it)")
        if cache is None and self.share:
            self.notes.append("--moe-cache-cpu-share without --moe-cache-mib does nothing")
        if self.kv["v"] not in ("f16", "bf16", "f32") and self.fa is False:
            raise _bad(self.flags, f"-ctv {self.kv['v']}: a quantized V cache needs flash attention (-fa on), as "
                                   "llama.cpp says")
        if self.gpu_layers is None:
            self.notes.append("-ngl not given: every layer on the GPU (recent llama.cpp's default)")
        if self.read_past:
            self.notes.append(f"read past (no effect on decode speed): {' '.join(sorted(set(self.read_past)))}")
        kv = max(self.kv.values(), key=lambda t: KV_TYPES[t])
        return UserPlacement(self.flags, tuple(host), self.gpu_layers, cache, self.share, self.context, kv,
                             self.ubatch, self.no_mmap, self.mlock, tuple(self.notes))


# ------------------------------------------------------------------------------------------ the flags' property

def random_flags(geom: ModelGeometry, rng) -> str:
    """A random llama.cpp flag set for ``geom``'s model: -ngl, --n-cpu-moe, --cpu-moe and -ot rules in any mix."""
    parts = []
    if rng.random() < 0.5:
        parts.append(f"-ngl {int(rng.integers(0, geom.decoder_layers + 2))}")
    roll = rng.random()
    if roll < 0.15:
        parts.append("--cpu-moe")
    elif roll < 0.6:
        parts.append(f"--n-cpu-moe {int(rng.integers(0, geom.decoder_layers + 1))}")
    if rng.random() < 0.4:
        blocks = sorted({int(b) for b in rng.choice(geom.moe_decoder_index, size=int(rng.integers(1, 4)))})
        parts.append("-ot 'blk\\.(" + "|".join(map(str, blocks)) + ")\\.ffn_.*_exps\\.=CPU'")
    if rng.random() < 0.3:
        parts.append(f"-c {int(rng.choice([2048, 4096, 8192]))}")
    return " ".join(parts) or "-ngl 99"


def keeps_more_on_host(a: UserPlacement, b: UserPlacement, geom: ModelGeometry) -> bool:
    """Does ``b`` keep everything ``a`` keeps on the host, and strictly more?"""
    experts = all(hb or not ha for ha, hb in zip(a.host_layers, b.host_layers))
    dec_a, dec_b = a.host_decoder_layers(geom), b.host_decoder_layers(geom)
    head_a = a.gpu_layers is not None and a.gpu_layers <= geom.decoder_layers
    head_b = b.gpu_layers is not None and b.gpu_layers <= geom.decoder_layers
    if not (experts and dec_b >= dec_a and (head_b or not head_a)):
        return False
    return b.host_layers != a.host_layers or dec_b > dec_a or head_b != head_a
