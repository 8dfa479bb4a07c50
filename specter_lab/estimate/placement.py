"""The user's own placement: the llama.cpp flags someone runs today, priced as given beside the best placement, so
"what do I gain by changing it" is one line.

Understood flags (llama.cpp's meaning): ``--cpu-moe`` / ``-cmoe`` (every layer's routed experts in host memory),
``--n-cpu-moe N`` / ``-ncmoe N`` (the experts of blocks 0..N-1, blocks counted over all decoder layers as
llama.cpp numbers them), ``-ot`` / ``--override-tensor PATTERN=BUFFER`` (repeatable; a layer's experts are on the
host when a pattern ending ``=CPU`` matches any of its ``blk.N.ffn_{up,gate,down}_exps.weight`` tensors, searched
as ``std::regex_search`` does), ``--moe-cache-mib M`` (the expert cache: a global LRU of M MiB over the experts
left in host memory) with ``--moe-cache-cpu-share F``. Other flags (``-ngl``, ``-c``, ``-m``, ...) are read past.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import numpy as np

from ..model.geometry import ModelGeometry

__all__ = ["UserPlacement", "parse_placement"]

MiB = 2**20
_EXPERT_TENSORS = ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps")
_VALUED = {"-ngl", "--n-gpu-layers", "-c", "--ctx-size", "-m", "--model", "-t", "--threads", "-b", "--batch-size",
           "-ub", "--ubatch-size", "-fa", "--flash-attn", "-ctk", "-ctv", "--cache-type-k", "--cache-type-v",
           "--port", "--host", "-np", "--parallel", "-sm", "--split-mode", "-mg", "--main-gpu", "-ts",
           "--tensor-split", "--temp", "-n", "--n-predict", "-p", "--prompt"}


@dataclass(frozen=True)
class UserPlacement:
    """What the flags place where: per MoE layer, whether its routed experts live in host memory; the expert
    cache's size (MiB, None without one) and CPU share."""

    flags: str
    host_layers: tuple[bool, ...]  # per MoE layer
    cache_mib: float | None = None
    cpu_share: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def n_host(self) -> int:
        return sum(self.host_layers)

    def gpu_expert_bytes(self, geom: ModelGeometry, expert_bytes: float) -> float:
        """Bytes of routed experts these flags put in VRAM (resident layers + the cache)."""
        resident = (len(self.host_layers) - self.n_host) * geom.num_experts * expert_bytes
        return resident + (self.cache_mib or 0.0) * MiB


def _bad(flags: str, what: str) -> ValueError:
    return ValueError(f"placement={flags!r}: {what}. Understood: --cpu-moe, --n-cpu-moe N, -ot 'blk\\.(0|1)\\."
                      "ffn_.*_exps\\.=CPU', --moe-cache-mib M, --moe-cache-cpu-share F (llama.cpp's flags).")


def parse_placement(flags: str, geom: ModelGeometry) -> UserPlacement:
    """Read llama.cpp placement flags for ``geom``'s layers; a ValueError names ``placement=`` and what it
    understands."""
    if not isinstance(flags, str) or not flags.strip():
        raise _bad(str(flags), "give the llama.cpp flags as one string")
    try:
        argv = shlex.split(flags)
    except ValueError as e:
        raise _bad(flags, f"cannot split it as a shell line ({e})") from None
    L, offset = geom.moe_layers, geom.dense_layers  # llama.cpp numbers blocks over all decoder layers
    host = [False] * L
    cache, share, notes = None, 0.0, []
    i = 0

    def value(name: str) -> str:
        if i + 1 >= len(argv):
            raise _bad(flags, f"{name} needs a value")
        return argv[i + 1]

    while i < len(argv):
        a, eq, inline = argv[i].partition("=") if argv[i].startswith("--") else (argv[i], "", "")
        if a in ("--cpu-moe", "-cmoe"):
            host = [True] * L
        elif a in ("--n-cpu-moe", "-ncmoe"):
            raw = inline if eq else value(a)
            i += 0 if eq else 1
            if not re.fullmatch(r"\d+", raw):
                raise _bad(flags, f"{a} takes a number of blocks, got {raw!r}")
            n = int(raw)
            host = [h or (offset + l) < n for l, h in enumerate(host)]
        elif a in ("-ot", "--override-tensor"):
            raw = inline if eq else value(a)
            i += 0 if eq else 1
            for rule in raw.split(","):
                pattern, sep, buffer = rule.rpartition("=")
                if not sep:
                    raise _bad(flags, f"-ot {rule!r} is not PATTERN=BUFFER")
                try:
                    rx = re.compile(pattern)
                except re.error as e:
                    raise _bad(flags, f"-ot pattern {pattern!r} is not a regex ({e})") from None
                if buffer.upper() != "CPU":
                    notes.append(f"-ot {rule}: a buffer other than CPU keeps the tensors on a GPU")
                    continue
                for l in range(L):
                    names = [f"blk.{offset + l}.{t}.weight" for t in _EXPERT_TENSORS]
                    hits = [bool(rx.search(n)) for n in names]
                    if any(hits) and not all(hits):
                        notes.append(f"block {offset + l}: -ot moves some of its expert tensors only; priced as "
                                     "if all were on the host")
                    host[l] = host[l] or any(hits)
        elif a == "--moe-cache-mib":
            raw = inline if eq else value(a)
            i += 0 if eq else 1
            try:
                cache = float(raw)
            except ValueError:
                raise _bad(flags, f"--moe-cache-mib takes MiB, got {raw!r}") from None
            if cache < 0:
                raise _bad(flags, f"--moe-cache-mib {raw}: a size cannot be negative")
        elif a == "--moe-cache-cpu-share":
            raw = inline if eq else value(a)
            i += 0 if eq else 1
            try:
                share = float(raw)
            except ValueError:
                raise _bad(flags, f"--moe-cache-cpu-share takes a fraction, got {raw!r}") from None
            if not 0 <= share <= 1:
                raise _bad(flags, f"--moe-cache-cpu-share {raw}: a fraction in [0, 1]")
        elif a in _VALUED and not eq:
            i += 1
        i += 1
    if cache is not None and not any(host):
        notes.append("--moe-cache-mib with every expert layer on the GPU: the cache has nothing to serve")
        cache = None
    return UserPlacement(flags, tuple(host), cache, share, tuple(notes))


def cache_slots(p: UserPlacement, expert_bytes: float) -> int:
    return int((p.cache_mib or 0.0) * MiB // expert_bytes)


def host_mask(p: UserPlacement) -> np.ndarray:
    return np.array(p.host_layers, dtype=bool)
