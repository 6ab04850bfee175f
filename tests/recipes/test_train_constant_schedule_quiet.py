"""`ludic train` with its default constant LR schedule draws no `UnreadOptionWarning`: it
passed --steps to `TrainerConfig.total_steps` as the decay length, which a constant schedule
never reads (and `TrainerConfig` names as ignored)."""

from __future__ import annotations

import warnings
from pathlib import Path

import tyro

from ludic.models import TinyModelSpec, tiny_model_dir
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command
from ludic.training import UnreadOptionWarning

SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    tokenizer_vocab_size=300,
)


def test_a_constant_schedule_run_names_no_unread_option(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    args = ["--env", "resume_envs:SayOTwiceEnv", "--model", str(model), "--steps", "1"]
    args += ["--problems-per-step", "1", "--group-size", "2", "--max-steps", "2"]
    args += ["--max-tokens", "4", "--concurrency", "1", "--no-progress"]
    cfg = tyro.cli(TrainConfig, args=[*args, "--out-dir", str(tmp_path / "run")])
    assert cfg.lr_schedule == "constant"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadOptionWarning)
        train_command(cfg)
