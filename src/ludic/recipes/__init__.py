"""Recipes: the programs behind `ludic quickstart`, `ludic train` and `ludic sft`, as functions
with one config dataclass each, and the wiring helpers they and the examples share
(`load_policy`, `InferenceArgs` / `make_inference` / `make_client`, `make_trainer`, `log_samples`, `finish`, `launch_rewards`, `closing_rewards`, `plot_curve`, `check_run_dir`,
`refuse_earlier_checkpoints`).
Importing this package is light; torch loads when a recipe or helper is first used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ludic.recipes.configs import QuickstartConfig, SFTConfig, TrainConfig

if TYPE_CHECKING:
    from ludic.recipes.expert import PolicyClient
    from ludic.recipes.inference import (
        Inference,
        InferenceArgs,
        InferenceFlags,
        close_client,
        make_client,
        make_inference,
    )
    from ludic.recipes.quickstart import QuickstartResult, run_quickstart
    from ludic.recipes.sft import sft_command
    from ludic.recipes.train import train_command
    from ludic.recipes.training import (
        SampleLog,
        check_run_dir,
        closing_rewards,
        finish,
        launch_rewards,
        load_policy,
        log_samples,
        make_trainer,
        plot_curve,
        refuse_earlier_checkpoints,
    )

_LAZY = {
    "Inference": "ludic.recipes.inference",
    "InferenceArgs": "ludic.recipes.inference",
    "InferenceFlags": "ludic.recipes.inference",
    "make_client": "ludic.recipes.inference",
    "close_client": "ludic.recipes.inference",
    "SampleLog": "ludic.recipes.training",
    "check_run_dir": "ludic.recipes.training",
    "closing_rewards": "ludic.recipes.training",
    "finish": "ludic.recipes.training",
    "launch_rewards": "ludic.recipes.training",
    "load_policy": "ludic.recipes.training",
    "log_samples": "ludic.recipes.training",
    "make_inference": "ludic.recipes.inference",
    "make_trainer": "ludic.recipes.training",
    "plot_curve": "ludic.recipes.training",
    "refuse_earlier_checkpoints": "ludic.recipes.training",
    "PolicyClient": "ludic.recipes.expert",
    "QuickstartResult": "ludic.recipes.quickstart",
    "run_quickstart": "ludic.recipes.quickstart",
    "sft_command": "ludic.recipes.sft",
    "train_command": "ludic.recipes.train",
}

__all__ = [
    "Inference",
    "InferenceArgs",
    "InferenceFlags",
    "PolicyClient",
    "QuickstartConfig",
    "QuickstartResult",
    "SFTConfig",
    "SampleLog",
    "TrainConfig",
    "check_run_dir",
    "close_client",
    "closing_rewards",
    "finish",
    "launch_rewards",
    "load_policy",
    "log_samples",
    "make_client",
    "make_inference",
    "make_trainer",
    "plot_curve",
    "refuse_earlier_checkpoints",
    "run_quickstart",
    "sft_command",
    "train_command",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic.recipes' has no attribute {name!r}")
