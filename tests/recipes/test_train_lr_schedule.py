"""`ludic train --lr-schedule/--warmup-steps/--min-lr-ratio/--schedule-steps`: each optimizer
step's learning rate follows the schedule (values derived by hand below), a run stopped after
2 steps and resumed follows the same curve as the run left alone, and bad settings are refused
before the model loads, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tyro

from ludic.models import TinyModelSpec, tiny_model_dir
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command
from ludic.training.schedule import lr_multiplier

SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    tokenizer_vocab_size=300,
)
# cosine after 1 warmup step over 4 steps, floor 0.1 x lr = 1e-2:
#   step 0: warmup (0 + 1) / 1 = 1
#   step s >= 1: 0.1 + 0.9 * (1 + cos(pi * (s - 1) / 3)) / 2 -> 1, 0.775, 0.325
EXPECTED_LR = [1e-2, 1e-2, 7.75e-3, 3.25e-3]


def run(out: Path, model: Path, *flags: str) -> TrainConfig:
    args = ["--env", "resume_envs:SayOTwiceEnv", "--model", str(model)]
    args += ["--problems-per-step", "1", "--group-size", "3", "--max-steps", "2"]
    args += ["--max-tokens", "6", "--lr", "1e-2", "--lr-schedule", "cosine"]
    args += ["--warmup-steps", "1", "--min-lr-ratio", "0.1", "--concurrency", "1"]
    cfg = tyro.cli(TrainConfig, args=[*args, "--out-dir", str(out), "--no-progress", *flags])
    train_command(cfg)
    return cfg


def lrs(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["lr"] for line in lines]


@pytest.mark.slow
def test_the_lr_follows_the_schedule_and_survives_resume(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    whole, split = tmp_path / "whole", tmp_path / "split"
    cfg = run(whole, model, "--steps", "4")  # the decay spans --steps by default
    assert cfg.lr_schedule == "cosine" and cfg.schedule_steps is None
    assert lrs(whole) == pytest.approx(EXPECTED_LR, rel=1e-6)
    schedule = {"schedule": "cosine", "warmup_steps": 1, "total_steps": 4, "min_lr_ratio": 0.1}
    by_formula = [1e-2 * lr_multiplier(s, **schedule) for s in range(4)]  # type: ignore[arg-type]
    assert by_formula == pytest.approx(EXPECTED_LR)  # the hand derivation above
    run(split, model, "--steps", "2", "--schedule-steps", "4")  # stopped after 2 steps
    run(split, model, "--steps", "4", "--resume")
    assert lrs(split) == pytest.approx(EXPECTED_LR, rel=1e-6)  # one curve across the restart


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min-lr-ratio", "1.5"], "--min-lr-ratio must be in"),
        (["--warmup-steps", "-1"], "--warmup-steps must be >= 0"),
        (["--schedule-steps", "0"], "--schedule-steps optimizer steps, which must be >= 1"),
    ],
)
def test_bad_schedule_settings_are_refused_naming_the_flag(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    args = ["--lr-schedule", "linear", "--out-dir", str(tmp_path), *flags]
    cfg = tyro.cli(TrainConfig, args=args)
    with pytest.raises(ValueError, match=message):
        train_command(cfg)
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before anything ran
