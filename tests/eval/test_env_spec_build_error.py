"""An env whose own factory raises keeps its traceback (a bug in the user's code, to read where
it is), with a note naming the `--env` that built it, in every command that builds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.eval.env_spec import with_env


def broken_env() -> object:
    raise ValueError("boom: the board size must be odd")


def test_with_env_keeps_the_error_and_names_the_env() -> None:
    with pytest.raises(ValueError, match="board size must be odd") as caught:
        with_env(broken_env, {}, lambda env: env)
    (note,) = caught.value.__notes__
    assert "raised by the env's own code: --env" in note and "broken_env" in note


@pytest.mark.parametrize("command", ["eval", "train"])
def test_the_command_shows_the_traceback_and_the_env(command: str, tmp_path: Path) -> None:
    (tmp_path / "badenv.py").write_text(
        "def make():\n    raise ValueError('boom: the board size must be odd')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", command, "--env", "badenv:make"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert result.returncode != 0
    assert 'badenv.py", line 2, in make' in result.stderr, result.stderr
    assert "ValueError: boom: the board size must be odd" in result.stderr
    assert "(raised by the env's own code: --env badenv:make)" in result.stderr
