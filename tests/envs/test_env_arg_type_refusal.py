"""A user's env factory that builds a built-in env with a wrong-typed argument (which the
`--env-kwargs` check cannot see) is printed by the `ludic` command as a one-line refusal naming
the argument and the fix, not a traceback: `checked_arguments` raises `EnvArgumentTypeError`, a
TypeError that is a refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ludic.envs import TicTacToeEnv
from ludic.envs.arg_types import EnvArgumentTypeError
from ludic.errors import is_refusal


def test_the_type_error_is_a_refusal() -> None:
    try:
        TicTacToeEnv(epsilon="0.2")  # type: ignore[arg-type]
    except TypeError as e:  # still a TypeError for callers that catch one
        assert isinstance(e, EnvArgumentTypeError) and is_refusal(e)
    else:
        raise AssertionError("a string epsilon was accepted")


def test_ludic_eval_prints_it_as_one_line(tmp_path: Path) -> None:
    (tmp_path / "myenv.py").write_text(
        "from ludic.envs import TicTacToeEnv\n\n"
        "def make():\n"
        "    return TicTacToeEnv(epsilon='0.2')\n"
    )
    command = "from ludic.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", command, "eval", "--env", "myenv:make", "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert (
        "ludic eval: error: TicTacToeEnv: epsilon must be float (or int), got '0.2' (str); "
        "pass epsilon=0.2"
    ) in done.stderr
