"""The model a config describes, built once on the ``meta`` device (shapes and modules, no weights, nothing
allocated), and what the runtime needs to know of it: the one builder behind a replay, an import, a trace file's
header check and the planner on a trace."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from .config_check import build_config, build_meta_model, check_moe_info
from .inspect import MoEModelInfo, inspect_model

__all__ = ["skeleton", "skeleton_info"]


def skeleton(config: "dict[str, Any]", where: str = "config"):
    """The model ``config`` (a config.json's dict) describes, on the meta device; a config transformers refuses or
    cannot build is a :class:`~specter_lab.errors.ConfigError` naming ``where`` and the field."""
    return _skeleton(_key(config), where)


def skeleton_info(config: "dict[str, Any]", where: str = "config") -> MoEModelInfo:
    """The skeleton's MoE layers as the runtime sees them, checked sizeable (experts, top-k, sizes)."""
    return _skeleton_info(_key(config), where)


def _key(config: "dict[str, Any]") -> str:
    return json.dumps(config, sort_keys=True, default=str)  # the cache's key: equal configs build once


@lru_cache(maxsize=8)
def _skeleton(config_json: str, where: str):
    return build_meta_model(build_config(json.loads(config_json), where), where).eval()


@lru_cache(maxsize=8)
def _skeleton_info(config_json: str, where: str) -> MoEModelInfo:
    info = inspect_model(_skeleton(config_json, where))
    check_moe_info(info, where)
    return info
