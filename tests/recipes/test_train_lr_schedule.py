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
        (["--steps", "8", "--warmup-steps", "10"], "--warmup-steps 10 until --schedule-steps 8"),
        (
            ["--schedule-steps", "4", "--warmup-steps", "4"],
            "--warmup-steps 4 until --schedule-steps 4",
        ),
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


@pytest.mark.slow
def test_resume_refuses_a_longer_decay_unless_the_checkpoints_schedule_is_kept(
    tmp_path: Path,
) -> None:
    """A cosine run over its whole --steps 2, resumed with --steps 4: a schedule_steps of 4
    would stretch the finished decay back up (step 2 at 0.775 x lr instead of the floor), so it
    is refused naming --schedule-steps and the checkpoint's 2; --schedule-steps 2 keeps the
    checkpoint's curve, whose LR stays at its floor 0.1 x lr past step 2."""
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    out = tmp_path / "run"
    run(out, model, "--steps", "2")
    with pytest.raises(
        ValueError,
        match=r"--schedule-steps \(default: --steps\) is 4, the "
        r"checkpoint's is 2.*--schedule-steps 2.*--override-lr-schedule",
    ):
        run(out, model, "--steps", "4", "--resume")
    assert len(lrs(out)) == 2  # refused before any step
    run(out, model, "--steps", "4", "--schedule-steps", "2", "--resume")
    # step 0: warmup 1; step 1: cosine at p = 0 -> 1; steps 2, 3: past S = 2, the floor 0.1
    assert lrs(out) == pytest.approx([1e-2, 1e-2, 1e-3, 1e-3], rel=1e-6)


@pytest.mark.slow
def test_resume_refuses_a_changed_lr_unless_overridden(tmp_path: Path) -> None:
    """A changed --lr on --resume is refused naming --lr and the checkpoint's value (LambdaLR
    would silently restore the old base rate); with --override-lr-schedule the new rate applies
    from the checkpoint's step on, on the same curve position."""
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    out = tmp_path / "run"
    run(out, model, "--steps", "2", "--schedule-steps", "4")
    with pytest.raises(ValueError, match=r"--lr is 0\.005, the checkpoint's is 0\.01.*--lr 0\.01"):
        run(out, model, "--steps", "4", "--schedule-steps", "4", "--resume", "--lr", "5e-3")
    with pytest.raises(ValueError, match=r"--lr-schedule is linear, the checkpoint's is cosine"):
        run(out, model, "--steps", "4", "--resume", "--lr-schedule", "linear")
    assert len(lrs(out)) == 2
    run(out, model, "--steps", "4", "--resume", "--lr", "5e-3", "--override-lr-schedule")
    assert lrs(out) == pytest.approx([1e-2, 1e-2, 5e-3 * 0.775, 5e-3 * 0.325], rel=1e-6)


def test_lr_changes_ignore_what_a_constant_schedule_ignores(tmp_path: Path) -> None:
    """--steps does not shape a constant LR, so a longer constant run resumes without
    --schedule-steps (no false refusal)."""
    from ludic.training.config import TrainerConfig
    from ludic.training.lr_resume import lr_changes, lr_settings

    short = TrainerConfig(lr=1e-3, total_steps=2)
    assert lr_changes(lr_settings(short), TrainerConfig(lr=1e-3, total_steps=8)) == {}
    cosine = TrainerConfig(lr=1e-3, lr_schedule="cosine", total_steps=2)
    longer = TrainerConfig(lr=1e-3, lr_schedule="cosine", total_steps=8)
    assert lr_changes(lr_settings(cosine), longer) == {"total_steps": (2, 8)}
    assert lr_changes(None, longer) == {}  # a checkpoint from before the record
