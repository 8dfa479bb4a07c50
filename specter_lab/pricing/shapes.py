"""Cost shapes: per-layer dimensions of real MoE models, used to price a tiny model's run as if its layers had these
sizes. Routing still comes from the model actually run: a *projection*. Each row is sized from the model's public
config.json (bundled in ``specter_lab/data/configs``) by the same geometry the estimator uses
(:mod:`specter_lab.model.geometry`): no size is typed twice."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Mapping

from ..model.geometry import CONFIG_DIR, geometry_from_config, load_config
from ..model.inspect import text_config

__all__ = ["CostShape", "COST_SHAPES", "get_cost_shape", "shape_from_config", "PROJECTIONS"]

PROJECTIONS = ("layers", "full")


@dataclass(frozen=True)
class CostShape:
    """Per-layer dimensions of a real MoE model, from its public config.json, used to price a tiny model's run
    as if its layers had these sizes (routing still comes from the model actually run: a *projection*)."""

    name: str
    hidden: int
    expert_params: int  # one routed expert: gate+up+down
    dense_params: int  # per MoE layer, excluding routed experts: attention, router, shared experts, norms
    vocab: int
    kv_bytes_per_token_per_layer: int  # KV cache bytes read per context token per layer (fp16)
    num_experts: int
    top_k: int
    num_layers: int  # decoder layers of the real model, dense ones included
    family: str = "qwen2_moe"  # transformers model_type whose aten op counts price host dispatch
    dense_layers: int = 0  # dense (non-MoE) first layers of the real model
    dense_layer_params: int = 0  # params of one such layer (attention + dense MLP + norms)
    projection: str = "layers"  # layers | full (see the module docstring)

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers

    @property
    def label(self) -> str:
        """Which projection, in words: stated in every output that uses this shape."""
        if self.projection == "full":
            dense = f" + {self.dense_layers} dense" if self.dense_layers else ""
            return f"{self.name}@full ({self.moe_layers} MoE{dense} layers, full LM head)"
        return f"{self.name} (the run's layers at this size, LM head pro rata)"

    @property
    def key(self) -> str:
        return self.name + ("@full" if self.projection == "full" else "")


def shape_from_config(name: str, family: str = "qwen2_moe", config=None) -> CostShape:
    """The cost shape of the model ``config`` describes (default: the bundled ``data/configs/<name>.json``), sized
    by :func:`~specter_lab.model.geometry.geometry_from_config`, the geometry the estimator prices with: its
    modules built on the meta device and counted (biases, norms and routers included). ``family``: whose op
    counts price host dispatch (a pricing choice, not a size)."""
    cfg = load_config(config if config is not None else CONFIG_DIR / f"{name}.json", "config")
    tc = text_config(cfg)
    g = geometry_from_config(cfg)
    return CostShape(
        name=name,
        hidden=int(tc.hidden_size),
        expert_params=g.expert_params,
        dense_params=g.dense_params_per_moe_layer,
        vocab=int(tc.vocab_size),
        kv_bytes_per_token_per_layer=int(max(g.kv_bytes_per_token)),  # an attention layer's (fp16, K + V)
        num_experts=g.num_experts,
        top_k=g.top_k,
        num_layers=g.decoder_layers,
        family=family,
        dense_layers=g.dense_layers,
        dense_layer_params=g.dense_layer_params // g.dense_layers if g.dense_layers else 0,
    )


class _Shapes(Mapping[str, CostShape]):
    """:data:`COST_SHAPES`: the names are known up front, each row is sized from its bundled config.json on first
    use (a meta-device build, ~0.1 s: importing the package builds none)."""

    def __init__(self, families: dict[str, str]) -> None:
        self._families = families
        self._rows: dict[str, CostShape] = {}

    def __getitem__(self, name: str) -> CostShape:
        if name not in self._families:
            raise KeyError(name)
        row = self._rows.get(name)
        if row is None:
            row = self._rows[name] = shape_from_config(name, self._families[name])
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(self._families)

    def __len__(self) -> int:
        return len(self._families)

    def __repr__(self) -> str:
        return f"COST_SHAPES({sorted(self._families)})"


# Real models whose layers a tiny model's run can be priced at: name (= its config in specter_lab/data/configs,
# where the README says where each came from) → the family whose aten op counts price host dispatch (qwen2_moe,
# the counted family, unless the model's own family is counted too).
COST_SHAPES: Mapping[str, CostShape] = _Shapes({
    "mixtral-8x7b": "qwen2_moe",
    "deepseek-v2-lite": "deepseek_v2",
    "qwen1.5-moe-a2.7b": "qwen2_moe",
    "phi-3.5-moe": "qwen2_moe",
    "olmoe-1b-7b": "qwen2_moe",
    "qwen3-30b-a3b": "qwen2_moe",
})


def get_cost_shape(cost_shape: "str | CostShape | None") -> CostShape | None:
    """Resolve ``cost_shape=``: None, a CostShape, a name in COST_SHAPES (the ``layers`` projection) or a name
    followed by ``@full`` (the real depth) or ``@layers``."""
    if cost_shape is None or isinstance(cost_shape, CostShape):
        return cost_shape
    name, _, projection = str(cost_shape).partition("@")
    if name not in COST_SHAPES:
        raise ValueError(f"cost_shape={cost_shape!r} is unknown. Use None (price the model as it is) or one of "
                         f"{sorted(COST_SHAPES)}, optionally followed by '@full' (real depth).")
    if projection and projection not in PROJECTIONS:
        raise ValueError(f"cost_shape={cost_shape!r}: projection {projection!r} is unknown; use one of "
                         f"{list(PROJECTIONS)} after the '@'.")
    return replace(COST_SHAPES[name], projection=projection or "layers")

