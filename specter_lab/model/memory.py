"""What a run will hold in memory, known before anything is loaded: from ``config.json`` and the safetensors
headers alone (:mod:`.checkpoint_check`), never a tensor read.

Terms (bytes at the dtype the run uses):

* **dense weights**: attention, routers, shared experts, norms, embeddings, head; resident (read every token). A
  quantized checkpoint (``quantization_config``, e.g. MXFP4) is dequantized at load, so its terms are the model's
  parameter counts at the run's dtype rather than the file's bytes;
* **routed experts**: *mapped* when the file already holds them as the model's fused ``[E, ...]`` tensors in the
  run's dtype (transformers maps such a tensor from the file without a copy; the OS pages it in when an expert is
  read and may drop it again, so it need not fit in RAM; the draft's quantizer hands each chunk's pages back once
  it has read them, :mod:`.pages`), otherwise *copied*: then they must fit. A per-expert checkpoint in its own
  dtype is read once into the fused parameters without mapping (:mod:`.expert_read`: the copy and nothing else;
  transformers' own concatenation also left the mapped pages it read resident), another dtype is a converted
  copy;
* **draft**: the low-bit copies of the routed experts the speculative draft keeps; on the CPU a small model's are
  dequantized once to the run's dtype (``DraftExperts``' ``dense`` layout: as many bytes as the experts, under
  :data:`DENSE_DRAFT_LIMIT`), a real-size model's and a GPU's packed
  (``QuantSpec.packed_bytes``: codes + an fp16 scale and zero per group);
* **quantizer working set**: while the draft is made it quantizes a chunk of one fused tensor at a time in float32
  about three times over: counted as 8 bytes per parameter of one layer's experts, at most four
  :data:`QUANT_CHUNK_BYTES` chunks (measured: 3.3 chunks at 256 MiB, 2.9 at 64 MiB, for [E, 2048, 2048] bf16
  chunks with their int4 repacking; the C heap is trimmed after each chunk, :func:`.pages.trim_heap`;
  ``scripts/real_checkpoint.py`` measures the whole run's peak);
* **KV cache** for the asked context (at the run's dtype; sliding layers capped at their window);
* **store slots**: the expert budget's device slots (on the CPU they are separate host memory while they stay
  under :data:`CPU_SLOT_COPY_LIMIT`, views of the host copies past it); counted at the
  whole budget, an upper bound (the budget also pays for the packed draft on a GPU);
* **host expert cache** (the disk tier, ``host_budget=``): at most that many bytes of expert weights in host RAM,
  every other expert read from the files on demand (:mod:`specter_lab.offload.hostcache`). The routed experts
  are then neither copied nor paged in by a run; the store's slots are real copies (never views of a cache slot
  that a refill overwrites). A per-expert checkpoint is still concatenated by transformers at load, so it must
  fit or be fused first (``sl.fuse_experts``).

The allowance is ``memory_limit`` when given, else the memory available now (``psutil`` when installed, else
``/proc/meminfo``'s MemAvailable). Nothing here is measured; it is arithmetic on header sizes, and the checkpoint
test compares it with the bytes a loaded model actually holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import NotEnoughMemory
from ..units import format_bytes, parse_budget, parse_bytes
from .checkpoint_check import CheckpointInfo, check_checkpoint

__all__ = ["MemoryPlan", "plan_memory", "available_memory", "check_fits", "DENSE_DRAFT_LIMIT",
           "CPU_SLOT_COPY_LIMIT", "QUANT_CHUNK_BYTES"]

# On the CPU a draft is dequantized once only while that copy stays this small (run/quant.py reads it): past it
# a dequantized copy would double a real-size model's resident memory (12 GiB of OLMoE-1B-7B experts), and the
# packed codes (a quarter of that at 4 bits) are dequantized per expert instead. Same values either way.
DENSE_DRAFT_LIMIT = 1 << 30
# On the CPU the store's "device" slots are real copies (a stale or wrong slot then changes the output, and the
# lossless tests catch it) while they stay this small; past it they are views of the host copies (offload/store.py
# reads it): the same floats, without a second host copy of half a real-size model's experts.
CPU_SLOT_COPY_LIMIT = 1 << 30
# The draft's quantizer works on as many experts at once as keep one chunk's float32 copy under this (run/quant.py;
# a tiny model's fused tensor is one chunk): its transient memory is about four chunks, whatever the model's size.
# 32 MiB (two OLMoE gate_up experts) rather than 256: about 0.1 GiB transient instead of 0.85 GiB (measured: 3.3
# chunks at 256 MiB, 2.9 at 64 MiB), at the same speed per expert on this 2-core box; a per-expert checkpoint's
# real-size draft sits 0.01x under 1.3x the checkpoint once made (docs/measured/real_checkpoint_olmoe.md).
QUANT_CHUNK_BYTES = 32 << 20

_FLOAT_BYTES = {torch.float32: 4, torch.float64: 8, torch.float16: 2, torch.bfloat16: 2}


def available_memory() -> tuple[int, str]:
    """(bytes of RAM available now, where the figure comes from)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available), "psutil available"
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "/proc/meminfo MemAvailable"
    except OSError:
        pass
    return 0, "unknown (no psutil, no /proc/meminfo)"


@dataclass
class MemoryPlan:
    """Every term a run will hold, the allowance it is compared with, and the fixes when it does not fit
    (module docstring). ``required`` is what must be resident; ``mapped`` what the OS pages in from the checkpoint
    files on use."""

    model: str
    dtype: str
    stored_dtype: str
    device: str
    layout: str  # "fused" or "per-expert" (how the checkpoint stores the routed experts)
    dense_bytes: int
    expert_bytes: int
    experts_mapped: bool
    draft_bytes: int = 0
    draft_label: str = "none"
    quantizer_bytes: int = 0
    kv_bytes: int = 0
    context: int = 0
    slot_bytes: int = 0
    slots_are_views: bool = False  # CPU slots past CPU_SLOT_COPY_LIMIT: views of the host copies, no bytes
    allowance: int = 0
    allowance_source: str = ""
    checkpoint_bytes: int = 0
    fixes: list[str] = field(default_factory=list)
    device_allowance: int = 0  # on a GPU: its free memory (or device_limit)
    device_allowance_source: str = ""
    host_cache_bytes: int = 0  # the disk tier's host expert cache (host_budget=), 0 without one
    disk_tier: bool = False  # host_budget= given: experts read from the files into the host cache

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def _where(self, term: str) -> str:
        """"device" for what a GPU run keeps on the GPU (dense weights, draft, KV cache, slots), else "host"."""
        return "device" if self.on_gpu and term.startswith(_DEVICE_TERMS) else "host"

    @property
    def terms(self) -> list[tuple[str, int, str]]:
        """(term, bytes, note) rows, in the order the module docstring lists them."""
        experts = ("mapped from the files (paged in on use)" if self.experts_mapped else
                   "pinned in host RAM" if self.on_gpu else
                   "read once into RAM (no mapped second copy)"
                   if self.layout == "per-expert" and self.dtype == self.stored_dtype
                   else "copied into RAM")
        if self.on_gpu and self.experts_mapped and not self.disk_tier:
            experts += "; copied through a bounded pinned ring"
        if self.disk_tier and self.experts_mapped:
            experts = "on disk: read on demand into the host expert cache (the disk tier)"
        rows = [("dense weights", self.dense_bytes, "resident"), ("routed experts", self.expert_bytes, experts),
                ("draft", self.draft_bytes, self.draft_label),
                ("quantizer (one layer, transient)", self.quantizer_bytes, "while the draft is made"),
                (f"KV cache ({self.context} tokens)", self.kv_bytes, "resident"),
                ("store slots", self.slot_bytes, "views of the host copies (no second copy)" if self.slots_are_views
                 else "the expert budget, upper bound")]
        if self.disk_tier:
            rows.append(("host expert cache", self.host_cache_bytes,
                         "host_budget: the disk tier's LRU of experts, the rest read from disk"))
        return [(t, b, n + (" (GPU)" if self._where(t) == "device" else "")) for t, b, n in rows]

    @property
    def required(self) -> int:
        """Host bytes that must be resident: every host term but mapped experts."""
        return sum(b for t, b, _ in self.terms if self._where(t) == "host") - (
            self.expert_bytes if self.experts_mapped else 0)

    @property
    def device_required(self) -> int:
        """GPU bytes (0 for a CPU run)."""
        return sum(b for t, b, _ in self.terms if self._where(t) == "device")

    @property
    def mapped(self) -> int:
        return self.expert_bytes if self.experts_mapped else 0

    @property
    def fits(self) -> bool:
        return self.required <= self.allowance and self.device_required <= (self.device_allowance if self.on_gpu
                                                                           else 0)

    def _verdicts(self) -> list[tuple[str, int, int, str, bool]]:
        out = [("must be resident" if not self.on_gpu else "host RAM", self.required, self.allowance,
                self.allowance_source, self.required <= self.allowance)]
        if self.on_gpu:
            out.append(("GPU memory", self.device_required, self.device_allowance, self.device_allowance_source,
                        self.device_required <= self.device_allowance))
        return out

    def __str__(self) -> str:
        rows = [f"memory plan for {self.model} ({self.dtype} on {self.device}; checkpoint {self.stored_dtype}, "
                f"experts {self.layout}, {format_bytes(self.checkpoint_bytes)} on disk)"]
        rows += [f"  {t:<34} {format_bytes(b):>11}  {note}" for t, b, note in self.terms]
        rows += [f"  {name:<34} {format_bytes(need):>11}  of {format_bytes(have)} allowed ({src}): "
                 f"{'fits' if ok else 'DOES NOT FIT'}" for name, need, have, src, ok in self._verdicts()]
        rows += [f"  fix: {f}" for f in (self.fixes if not self.fits else [])]
        return "\n".join(rows)

    def _repr_html_(self) -> str:
        import html

        cells = "".join(f"<tr><td>{html.escape(t)}</td><td style='text-align:right'>{format_bytes(b)}</td>"
                        f"<td>{html.escape(n)}</td></tr>" for t, b, n in self.terms)
        cells += "".join(f"<tr><td><b>{name}</b></td><td style='text-align:right'><b>{format_bytes(need)}</b></td>"
                         f"<td>of {format_bytes(have)} allowed ({html.escape(src)}): "
                         f"{'fits' if ok else '<b>does not fit</b>'}</td></tr>"
                         for name, need, have, src, ok in self._verdicts())
        fixes = "".join(f"<li>{html.escape(f)}</li>" for f in (self.fixes if not self.fits else []))
        return (f"<div><p>Memory plan for <code>{html.escape(self.model)}</code>: {self.dtype} on {self.device} "
                f"(checkpoint {self.stored_dtype}, experts {self.layout})</p><table>{cells}</table>"
                f"{'<ul>' + fixes + '</ul>' if fixes else ''}</div>")


_DEVICE_TERMS = ("dense weights", "draft", "KV cache", "store slots")  # "host expert cache" stays on the host


def _dtype(dtype, stored: torch.dtype, device: torch.device) -> torch.dtype:
    if dtype is None:
        # the checkpoint's own dtype; a float32 checkpoint on CUDA runs in bf16 (load_model's documented default)
        return torch.bfloat16 if device.type == "cuda" and stored == torch.float32 else stored
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if dtype not in _FLOAT_BYTES:
        raise ValueError(f"dtype={dtype!r}: use torch.float32, torch.bfloat16 or torch.float16 (or their names).")
    return dtype


def _draft_bytes(ck: CheckpointInfo, draft: Any, device: torch.device, itemsize: int) -> tuple[int, str]:
    """(bytes, label) of the draft's low-bit experts. ``draft`` is None (no draft) or anything with QuantSpec's
    ``packed_bytes(numel, last_dim)`` (duck-typed: run/ sits above model/)."""
    if draft is None:
        return 0, "none"
    spec = getattr(draft, "quant", draft)  # a DraftSpec carries its QuantSpec
    variant = getattr(draft, "variant", "quantized")
    if variant in ("resident", "host"):
        return 0, f"{variant} (no low-bit copies)"
    if not hasattr(spec, "packed_bytes"):
        raise TypeError(f"draft={draft!r}: pass a sl.QuantSpec or sl.DraftSpec (or None for no draft).")
    numel = packed = 0
    for n in ck.expert_tensors:
        t = ck.tensors[n]
        if len(t.shape) < 2:
            packed += math.prod(t.shape) * 2
            continue
        numel += math.prod(t.shape)
        packed += spec.packed_bytes(math.prod(t.shape), t.shape[-1])
    label = getattr(spec, "label", str(spec))
    if variant == "hybrid":  # only hybrid_experts per layer
        e = max(1, _num_experts(ck.config))
        frac = min(1.0, getattr(draft, "hybrid_experts", e) / e)
        numel, packed, label = int(numel * frac), int(packed * frac), f"hybrid {label}"
    if device.type == "cpu" and numel * itemsize <= DENSE_DRAFT_LIMIT:
        return numel * itemsize, f"{label}, dequantized once on the CPU (packed it would be {format_bytes(packed)})"
    return packed, f"{label}, packed" + (" on the device" if device.type != "cpu" else
                                         f" (a dequantized copy would be {format_bytes(numel * itemsize)})")


def _num_experts(cfg: dict) -> int:
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    return max([tc.get(k) or 0 for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")])


def _geometry(ck: CheckpointInfo):
    from .geometry import geometry_from_config

    return geometry_from_config(dict(ck.config), arg=str(ck.path / "config.json"))


def _kv_bytes(ck: CheckpointInfo, context: int, itemsize: int) -> int:
    if context <= 0:
        return 0
    return int(_geometry(ck).kv_bytes(context) * itemsize / 2)  # geometry prices 2 bytes a value


def _fixes(plan: MemoryPlan, ck: CheckpointInfo, stored_size: int, itemsize: int) -> list[str]:
    short = plan.required - plan.allowance
    out = []
    if plan.on_gpu and plan.device_required > plan.device_allowance:
        out.append(f"on the GPU: a smaller expert_budget or draft, or a shorter context (it needs "
                   f"{format_bytes(plan.device_required - plan.device_allowance)} more)")
    if short <= 0:
        return out  # host RAM fits: only the GPU's fixes apply
    if itemsize > stored_size:
        save = (plan.dense_bytes + plan.expert_bytes) * (itemsize - stored_size) // itemsize
        out.append(f"load in the checkpoint's own dtype (dtype=None, i.e. {plan.stored_dtype}): saves "
                   f"{format_bytes(save)}")
    elif itemsize > 2:
        half = (plan.dense_bytes + plan.expert_bytes) // 2
        out.append(f"load in bfloat16 (dtype='bfloat16'): saves {format_bytes(half)}")
    if not plan.experts_mapped:
        why = ("per-expert tensors are concatenated into a copy at load" if ck.layout == "per-expert"
               else "another dtype than the file's is a converted copy")
        how = ("rewrite the checkpoint once with sl.fuse_experts(folder, new_folder) and load that"
               if ck.layout == "per-expert" else "load in the file's own dtype")
        out.append(f"experts read from disk instead of copied ({why}): {how}; saves {format_bytes(plan.expert_bytes)}"
                   " (then host_budget= bounds what the host keeps of them: the disk tier)")
    if plan.disk_tier and plan.host_cache_bytes:
        out.append(f"a smaller host_budget (the disk tier's cache): saves up to {format_bytes(plan.host_cache_bytes)}")
    if plan.draft_bytes:
        out.append(f"a smaller draft (fewer bits, draft='hybrid', or draft='resident'/'host' with no low-bit "
                   f"copies): saves up to {format_bytes(plan.draft_bytes)}")
    if plan.slot_bytes:
        out.append(f"a smaller expert_budget: saves up to {format_bytes(plan.slot_bytes)}")
    if plan.kv_bytes:
        out.append(f"a shorter context than {plan.context} tokens: saves up to {format_bytes(plan.kv_bytes)}")
    out.append(f"or free {format_bytes(short)} of RAM" if short > 0 else "")
    return [f for f in out if f]


def plan_memory(checkpoint: "str | Path | CheckpointInfo", *, dtype: "torch.dtype | str | None" = None,
                device: "str | torch.device" = "cpu", draft: Any = None, context: int = 0,
                expert_budget: "float | int | str | None" = None,
                memory_limit: "int | str | None" = None, device_limit: "int | str | None" = None,
                host_budget: "float | int | str | None" = None) -> MemoryPlan:
    """What loading ``checkpoint`` (a folder, or its :func:`check_checkpoint` result) and running it will hold,
    computed from its config and safetensors headers alone; compared with ``memory_limit`` (bytes or '8GiB') or,
    by default, the RAM available now. ``dtype`` None = the checkpoint's own. ``draft``: a ``sl.QuantSpec`` /
    ``sl.DraftSpec`` for a speculative run, None for none. ``context``: prompt + new tokens for the KV cache.
    ``expert_budget``: the run's budget (fraction of the routed-expert bytes, bytes or '2GiB'), None for a load
    alone. On a GPU (``device="cuda"``) the dense weights, draft (packed), KV cache and slots are counted against
    ``device_limit`` or the GPU's free memory, the experts against host RAM: pinned when they take at most half of
    it (:func:`~specter_lab.model.placement.place_for_offload`'s rule), else left mapped and copied through the
    bounded pinned ring. Never raises for not fitting (see :func:`check_fits`); raises CheckpointError for a bad
    checkpoint."""
    ck = checkpoint if isinstance(checkpoint, CheckpointInfo) else check_checkpoint(checkpoint)
    dev = torch.device(device)
    run = _dtype(dtype, ck.dtype, dev)
    itemsize, stored_size = _FLOAT_BYTES[run], _FLOAT_BYTES.get(ck.dtype, 4)
    scale = lambda b: b * itemsize // stored_size
    dense, experts = scale(ck.dense_bytes), scale(ck.expert_bytes)
    quantized = "quantization_config" in ck.config
    if quantized:  # packed in the files, dequantized at load: sized from the model's own parameter counts
        geom = _geometry(ck)
        dense, experts = (geom.total_params - geom.routed_params) * itemsize, geom.routed_params * itemsize
    if not isinstance(context, int) or isinstance(context, bool) or context < 0:
        raise ValueError(f"context={context!r}: the number of tokens (prompt + new), an integer >= 0.")
    draft_b, label = _draft_bytes(ck, draft, dev, itemsize)
    per_layer = sum(math.prod(ck.tensors[n].shape) for n in ck.expert_tensors) // _moe_layers(ck)
    slots = parse_budget(expert_budget).resolve(experts) if expert_budget is not None else 0
    allowance, source = _limit(memory_limit, "memory_limit") if memory_limit is not None else available_memory()
    dev_allowance, dev_source = 0, ""
    if dev.type == "cuda":
        dev_allowance, dev_source = (_limit(device_limit, "device_limit") if device_limit is not None
                                     else _gpu_free(dev))
    cache = min(parse_budget(host_budget, "host_budget").resolve(experts), experts) if host_budget is not None else 0
    views = dev.type == "cpu" and min(slots, experts) > CPU_SLOT_COPY_LIMIT and host_budget is None
    mapped = (not quantized and ck.layout == "fused" and run == ck.dtype
              and (dev.type == "cpu" or experts > allowance // 2 or host_budget is not None))
    plan = MemoryPlan(
        model=str(ck.path), dtype=str(run).replace("torch.", ""), stored_dtype=str(ck.dtype).replace("torch.", ""),
        device=str(dev), layout=ck.layout, dense_bytes=dense, expert_bytes=experts,
        experts_mapped=mapped, device_allowance=dev_allowance, device_allowance_source=dev_source,
        draft_bytes=draft_b, draft_label=label, quantizer_bytes=(min(8 * per_layer, 4 * QUANT_CHUNK_BYTES) if draft_b else 0),
        kv_bytes=_kv_bytes(ck, context, itemsize), context=context,
        slot_bytes=0 if views else min(slots, experts), slots_are_views=views,
        allowance=allowance, allowance_source=source, checkpoint_bytes=ck.file_bytes,
        host_cache_bytes=cache, disk_tier=host_budget is not None)
    plan.fixes = _fixes(plan, ck, stored_size, itemsize)
    return plan


def _limit(value: "int | str", name: str) -> tuple[int, str]:
    n = parse_bytes(value, name) if isinstance(value, str) else value
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"{name}={value!r}: a positive size (bytes or '8GiB').")
    return n, name


def _gpu_free(dev: torch.device) -> tuple[int, str]:
    if not torch.cuda.is_available():
        return 0, "no CUDA here"
    return int(torch.cuda.mem_get_info(dev)[0]), "free GPU memory"


def _moe_layers(ck: CheckpointInfo) -> int:
    """MoE layers with routed-expert tensors in the checkpoint (distinct ``layers.<i>.`` prefixes)."""
    import re

    return len({m.group(1) for n in ck.expert_tensors if (m := re.search(r"layers\.(\d+)\.", n))}) or 1


def check_fits(plan: MemoryPlan) -> MemoryPlan:
    """Raise :class:`~specter_lab.errors.NotEnoughMemory` (a ValueError) with every term and the fixes when
    ``plan`` does not fit its allowance; return it unchanged otherwise."""
    if not plan.fits:
        short = [f"{format_bytes(need)} of {name} but {format_bytes(have)} is allowed ({src})"
                 for name, need, have, src, ok in plan._verdicts() if not ok]
        raise NotEnoughMemory(f"{plan.model} would need " + " and ".join(short) + f"; nothing was loaded.\n{plan}",
                              plan)
    return plan
