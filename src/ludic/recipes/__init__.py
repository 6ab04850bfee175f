"""Recipes: the programs behind `ludic quickstart`, `ludic train` and `ludic sft`, as functions
with one config dataclass each. Importing this package is light; torch loads when a recipe runs
(the functions are imported on first use)."""

from __future__ import annotations

import importlib
from typing import Any

from ludic.recipes.configs import QuickstartConfig, SFTConfig, TrainConfig

_LAZY = {
    "PolicyClient": "ludic.recipes.expert",
    "QuickstartResult": "ludic.recipes.quickstart",
    "run_quickstart": "ludic.recipes.quickstart",
    "sft_command": "ludic.recipes.sft",
    "train_command": "ludic.recipes.train",
}

__all__ = [
    "PolicyClient",
    "QuickstartConfig",
    "QuickstartResult",
    "SFTConfig",
    "TrainConfig",
    "run_quickstart",
    "sft_command",
    "train_command",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic.recipes' has no attribute {name!r}")
