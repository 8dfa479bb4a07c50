"""Cost shapes are sized by the estimator's geometry from the bundled config.json files: each row equals what
geometry_from_config counts, and the configs match their model cards."""

import dataclasses
import json

import pytest

import specter_lab as sl
from specter_lab.model.geometry import CONFIG_DIR, geometry_from_config
from specter_lab.pricing.shapes import COST_SHAPES, get_cost_shape

# model cards: total and activated parameters (billions), and whether the card's activated count includes the
# input embeddings (DeepSeek's does not; the others' do)
CARDS = {"mixtral-8x7b": (46.7, 12.9, True), "deepseek-v2-lite": (15.7, 2.4, False),
         "qwen1.5-moe-a2.7b": (14.3, 2.7, True), "phi-3.5-moe": (41.9, 6.6, True), "olmoe-1b-7b": (6.9, 1.3, True),
         "qwen3-30b-a3b": (30.5, 3.3, True)}


def test_the_names_are_kept():
    assert sorted(COST_SHAPES) == sorted(CARDS) and sl.COST_SHAPES is COST_SHAPES


@pytest.mark.parametrize("name", sorted(CARDS))
def test_each_row_is_the_geometry_of_its_config(name):
    path = CONFIG_DIR / f"{name}.json"
    raw = json.loads(path.read_text())
    g = geometry_from_config(path)
    row = COST_SHAPES[name]
    assert row.name == name and row.projection == "layers"
    assert (row.hidden, row.vocab) == (raw["hidden_size"], raw["vocab_size"])
    assert (row.num_experts, row.top_k, row.num_layers, row.dense_layers) == (
        g.num_experts, g.top_k, g.decoder_layers, g.decoder_layers - g.moe_layers)
    assert (row.expert_params, row.dense_params) == (g.expert_params, g.dense_params_per_moe_layer)
    assert row.dense_layer_params * row.dense_layers == g.dense_layer_params
    assert row.kv_bytes_per_token_per_layer == max(g.kv_bytes_per_token)
    assert row.moe_layers == g.moe_layers and row.vocab * row.hidden == g.head_params


@pytest.mark.parametrize("name", sorted(CARDS))
def test_the_configs_are_the_model_cards(name):
    g = geometry_from_config(CONFIG_DIR / f"{name}.json")
    total, active, with_embeddings = CARDS[name]
    assert g.total_params / 1e9 == pytest.approx(total, abs=0.1)
    assert (g.active_params + with_embeddings * g.embed_params) / 1e9 == pytest.approx(active, abs=0.1)


def test_sizes_by_hand_agree_where_the_formula_is_exact():
    """The expert and attention sizes the hand formulas of the earlier table gave (3·H·I per expert; MLA's cached
    latent), checked against the geometry's counts."""
    mix, ds = COST_SHAPES["mixtral-8x7b"], COST_SHAPES["deepseek-v2-lite"]
    assert mix.expert_params == 3 * 4096 * 14336 and ds.expert_params == 3 * 2048 * 1408
    assert ds.kv_bytes_per_token_per_layer == 2 * (512 + 64) and mix.kv_bytes_per_token_per_layer == 2 * 2 * 8 * 128
    # Mixtral's dense part: attention (q, o 4096²; k, v 4096·1024), router 8·4096, two RMSNorms
    assert mix.dense_params == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 4096 + 2 * 4096


def test_full_projection_and_bad_names():
    full = get_cost_shape("deepseek-v2-lite@full")
    assert full.projection == "full" and full.key == "deepseek-v2-lite@full"
    assert dataclasses.replace(full, projection="layers") == COST_SHAPES["deepseek-v2-lite"]
    with pytest.raises(ValueError, match="unknown"):
        get_cost_shape("mixtral-8x22b")
    with pytest.raises(KeyError):
        COST_SHAPES["mixtral-8x22b"]
