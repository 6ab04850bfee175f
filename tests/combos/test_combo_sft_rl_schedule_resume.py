"""`ludic sft` -> `ludic train --model` its checkpoint on a cosine LR schedule -> `ludic train
--resume` with a changed `--steps` / schedule, each a new process, with the refusals README
"Checkpoints and resume" and "Learning-rate schedule" promise: an SFT checkpoint is no RL run to
resume (nor the other way round), and nothing is written where it is refused; a longer `--steps`
would stretch the finished cosine back up, so it is refused until `--schedule-steps` keeps the
checkpoint's curve (the rate then stays at its floor) or `--override-lr-schedule` applies the
new one from the checkpoint's step on; a `--steps` the checkpoint already reached leaves
nothing to train. Each launch's logged `lr` is the schedule's formula at that update."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ludic.training.schedule import lr_multiplier

REPO = Path(__file__).resolve().parents[2]
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


def _ludic(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [*head, *args]


def _run(cwd: Path, command: list[str], code: int = 0) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == code, done.stdout + done.stderr
    return " ".join((done.stdout + done.stderr).split())  # rich wraps long lines


def _lrs(cwd: Path) -> dict[int, float]:
    lines = (cwd / "rl" / "metrics.jsonl").read_text().splitlines()
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]
    return {r["step"]: r["lr"] for r in records}


def _cosine(step: int, total: int) -> float:
    """The logged lr of 1-based `step` on a cosine over `total` steps to FLOOR x LR."""
    multiplier = lr_multiplier(step - 1, schedule="cosine", total_steps=total, min_lr_ratio=FLOOR)
    return LR * multiplier


def _sft(cwd: Path) -> None:
    expert = [str(REPO / "examples" / "rejection_sampling.py"), "--expert", "--problems", "8"]
    _run(cwd, [sys.executable, *expert, "--out", "data/expert.jsonl"])
    sft = ("sft", "--data", "data/expert.jsonl", "--batch-size", "8", "--no-progress")
    _run(cwd, _ludic(*sft, "--steps", "2", "--out-dir", "sft"))
    # An SFT run is not an RL run to continue, in its own directory or named by --resume DIR.
    for out_dir, resume in (("sft", []), ("elsewhere", ["sft/checkpoints/step_00000002"])):
        said = _run(cwd, _ludic(*TRAIN, "--out-dir", out_dir, "--resume", *resume), 1)
        assert "is a `ludic sft` checkpoint" in said and f"--model {SFT_MODEL}" in said, said
    assert not (cwd / "elsewhere").exists()


def _refusals_after_two_steps(cwd: Path) -> None:
    said = _run(cwd, _ludic(*RL_FLAGS, "--steps", "4", "--resume"), 1)
    assert "--schedule-steps (default: --steps) is 4, the checkpoint's is 2" in said, said
    said = _run(cwd, _ludic(*RL_FLAGS, "--steps", "2", "--resume"), 1)
    assert "nothing is left to train" in said, said
    said = _run(cwd, _ludic("sft", "--data", "data/expert.jsonl", "--out-dir", "rl", "--resume"), 1)
    assert "is a `ludic train` checkpoint" in said, said
    assert sorted(_lrs(cwd)) == [1, 2]  # no refused launch logged a step


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_sft_then_rl_resumed_with_a_changed_schedule(tmp_path: Path) -> None:
    _sft(tmp_path)
    _run(tmp_path, _ludic(*RL_FLAGS, "--steps", "2"))
    assert _lrs(tmp_path) == pytest.approx({1: _cosine(1, 2), 2: _cosine(2, 2)})
    _refusals_after_two_steps(tmp_path)

    # The checkpoint's curve kept: past its 2 steps the rate stays at the floor.
    said = _run(tmp_path, _ludic(*RL_FLAGS, "--steps", "4", "--schedule-steps", "2", "--resume"))
    assert "resumed at step 2" in said, said
    lrs = _lrs(tmp_path)
    assert sorted(lrs) == [1, 2, 3, 4]
    assert [lrs[3], lrs[4]] == pytest.approx([LR * FLOOR, LR * FLOOR])

    # This launch's curve (a cosine over 6 steps) from the checkpoint's step on.
    said = _run(tmp_path, _ludic(*RL_FLAGS, "--steps", "6", "--override-lr-schedule", "--resume"))
    assert "resumed at step 4" in said, said
    lrs = _lrs(tmp_path)
    assert sorted(lrs) == [1, 2, 3, 4, 5, 6]
    assert [lrs[5], lrs[6]] == pytest.approx([_cosine(5, 6), _cosine(6, 6)])
    assert [lrs[3], lrs[4]] == pytest.approx([LR * FLOOR, LR * FLOOR])  # earlier rows kept
