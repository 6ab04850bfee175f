"""`ludic eval --model` that holds no model is refused first, as a user runs it (the `ludic`
command in a new process): the error alone, no engine or context line printed before it as
if the evaluation had started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def ludic_eval(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", "eval", "--env", "tictactoe", *args],
        cwd=cwd,
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("empty", "empty is not a model directory (no config.json)"),
        ("missing", "no model directory at missing"),
        ("runs", "runs holds checkpoints, not one model"),
    ],
)
def test_a_bad_model_gives_only_the_error(tmp_path: Path, model: str, says: str) -> None:
    (tmp_path / "empty").mkdir()
    step = tmp_path / "runs" / "checkpoints" / "step_00000003" / "model"
    step.mkdir(parents=True)
    (step / "config.json").write_text("{}")
    done = ludic_eval(tmp_path, "--model", model, "--num-problems", "1", "--no-progress")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""  # no "engine: embedded on ..." nor "context: ..." line
    error = " ".join(done.stderr.split())
    assert error.startswith(f"ludic eval: error: --model {model}: {says}"), error
    assert "Traceback" not in error
    assert not (tmp_path / "ludic_runs").exists()  # nothing was evaluated or written
