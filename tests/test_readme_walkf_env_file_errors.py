"""Walk of README "Train your own environment" from a fresh directory: a user's env file with
a syntax error is refused by `ludic train --env module:Class` in one line naming the file, the
line, Python's message and the offending line with its caret. It used to end in a 25-line
traceback through ludic's and importlib's frames, as if ludic had a bug."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.eval.env_spec import import_object

BROKEN = "from ludic.envs import SingleAgentEnv\n\nclass Lights(SingleAgentEnv)\n    pass\n"


def test_import_object_names_the_file_line_and_message(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "broken_lights.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as refused:
        import_object("broken_lights:Lights")
    message = str(refused.value)
    assert message.startswith("cannot import module 'broken_lights' from 'broken_lights:Lights': ")
    assert f"{tmp_path / 'broken_lights.py'}:3: SyntaxError: expected ':'" in message
    assert "\n    class Lights(SingleAgentEnv)\n" in message and message.endswith("^")


def test_ludic_train_refuses_it_in_one_line_from_a_fresh_process(tmp_path: Path) -> None:
    (tmp_path / "broken_lights.py").write_text(BROKEN)
    env = {k: v for k, v in os.environ.items() if k != "LUDIC_TRACEBACK"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ludic.cli",
            "train",
            "--env",
            "broken_lights:Lights",
            "--steps",
            "1",
            "--out-dir",
            "runs/x",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "ludic train: error: cannot import module 'broken_lights'" in done.stderr
    assert "broken_lights.py:3: SyntaxError: expected ':'" in done.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was written
