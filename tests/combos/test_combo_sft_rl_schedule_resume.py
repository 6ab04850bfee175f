"""`ludic sft` -> `ludic train --model` its checkpoint on a cosine LR schedule -> `ludic train
--resume` with a changed `--steps` / schedule, each a new process, with the refusals README
"Checkpoints and resume" and "Learning-rate schedule" promise: an SFT checkpoint is no RL run to
resume (nor the other way round), and nothing is written where it is refused; a longer `--steps`
would stretch the finished cosine back up, so it is refused until `--schedule-steps` keeps the
checkpoint's curve (the rate then stays at its floor) or `--override-lr-schedule` applies the
new one from the checkpoint's step on; a `--steps` the checkpoint already reached leaves
nothing to train. Each launch's logged `lr` is the schedule's formula at that update."""

from __future__ import annotations

from pathlib import Path

import pytest
from combo_processes import ludic, records, run, sft_on_expert_games

from ludic.training.schedule import lr_multiplier

LR, FLOOR = 1e-3, 0.1
SFT_MODEL = "sft/checkpoints/step_00000002/model"
TRAIN = (
    *("train", "--env", "tictactoe", "--problems-per-step", "2", "--group-size", "2"),
    *("--max-steps", "3", "--max-tokens", "8", "--concurrency", "1", "--no-progress"),
    *("--model", "sft/checkpoints/step_00000002"),
)
RL_FLAGS = (
    *(*TRAIN, "--out-dir", "rl", "--checkpoint-every", "1"),
    *("--lr", str(LR), "--lr-schedule", "cosine", "--min-lr-ratio", str(FLOOR)),
)


def _lrs(cwd: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in records(cwd / "rl" / "metrics.jsonl")}


def _cosine(step: int, total: int) -> float:
    """The logged lr of 1-based `step` on a cosine over `total` steps to FLOOR x LR."""
    multiplier = lr_multiplier(step - 1, schedule="cosine", total_steps=total, min_lr_ratio=FLOOR)
    return LR * multiplier


def _sft(cwd: Path) -> None:
    sft_on_expert_games(cwd)
    # An SFT run is not an RL run to continue, in its own directory or named by --resume DIR.
    for out_dir, resume in (("sft", []), ("elsewhere", ["sft/checkpoints/step_00000002"])):
        said = run(ludic(*TRAIN, "--out-dir", out_dir, "--resume", *resume), cwd, 1)
        assert "is a `ludic sft` checkpoint" in said and f"--model {SFT_MODEL}" in said, said
    assert not (cwd / "elsewhere").exists()


def _refusals_after_two_steps(cwd: Path) -> None:
    said = run(ludic(*RL_FLAGS, "--steps", "4", "--resume"), cwd, 1)
    assert "--schedule-steps (default: --steps) is 4, the checkpoint's is 2" in said, said
    said = run(ludic(*RL_FLAGS, "--steps", "2", "--resume"), cwd, 1)
    assert "nothing is left to train" in said, said
    said = run(ludic("sft", "--data", "data/expert.jsonl", "--out-dir", "rl", "--resume"), cwd, 1)
    assert "is a `ludic train` checkpoint" in said, said
    assert sorted(_lrs(cwd)) == [1, 2]  # no refused launch logged a step


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_sft_then_rl_resumed_with_a_changed_schedule(tmp_path: Path) -> None:
    _sft(tmp_path)
    run(ludic(*RL_FLAGS, "--steps", "2"), tmp_path)
    assert _lrs(tmp_path) == pytest.approx({1: _cosine(1, 2), 2: _cosine(2, 2)})
    _refusals_after_two_steps(tmp_path)

    # The checkpoint's curve kept: past its 2 steps the rate stays at the floor.
    said = run(ludic(*RL_FLAGS, "--steps", "4", "--schedule-steps", "2", "--resume"), tmp_path)
    assert "resumed at step 2" in said, said
    lrs = _lrs(tmp_path)
    assert sorted(lrs) == [1, 2, 3, 4]
    assert [lrs[3], lrs[4]] == pytest.approx([LR * FLOOR, LR * FLOOR])

    # This launch's curve (a cosine over 6 steps) from the checkpoint's step on.
    said = run(ludic(*RL_FLAGS, "--steps", "6", "--override-lr-schedule", "--resume"), tmp_path)
    assert "resumed at step 4" in said, said
    lrs = _lrs(tmp_path)
    assert sorted(lrs) == [1, 2, 3, 4, 5, 6]
    assert [lrs[5], lrs[6]] == pytest.approx([_cosine(5, 6), _cosine(6, 6)])
    assert [lrs[3], lrs[4]] == pytest.approx([LR * FLOOR, LR * FLOOR])  # earlier rows kept
