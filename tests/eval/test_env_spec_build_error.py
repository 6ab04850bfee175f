"""An env whose own factory raises is refused by every command that builds it (`ludic eval`,
`ludic train`) with one line naming `--env` and the error, its traceback behind
`LUDIC_TRACEBACK=1`, not a traceback through the command's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.eval.env_spec import EnvBuildError, with_env


def broken_env() -> object:
    raise ValueError("boom: the board size must be odd")


def test_with_env_names_the_env_and_the_error() -> None:
    with pytest.raises(EnvBuildError) as caught:
        with_env(broken_env, {}, lambda env: env)
    message = str(caught.value)
    assert "--env" in message and "broken_env" in message
    assert "ValueError: boom: the board size must be odd" in message
    assert is_refusal(caught.value) and isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize("command", ["eval", "train"])
def test_the_command_prints_one_line_not_a_traceback(command: str, tmp_path: Path) -> None:
    (tmp_path / "badenv.py").write_text(
        "def make():\n    raise ValueError('boom: the board size must be odd')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LUDIC_TRACEBACK": ""}
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", command, "--env", "badenv:make"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert result.returncode != 0
    assert f"ludic {command}: error: --env badenv:make: building the env raised" in result.stderr
    assert "boom: the board size must be odd" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
