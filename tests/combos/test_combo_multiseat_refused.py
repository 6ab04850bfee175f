"""A multi-seat env (`tictactoe_duel`, two LLM seats) given to a one-agent command is refused
before any model loads, naming its seats and where self-play lives, as `ludic train` refuses it:
`ludic eval` ran every episode into SingleAgentProtocol's error and `ludic actor --batches N`
exited 0 having pushed nothing (every batch's episodes failed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ludic.eval.command import EvalConfig, run_eval_command
from ludic.pipeline.commands import run_actor
from ludic.pipeline.config import ActorConfig

SEATS = "env 'tictactoe_duel' has 2 seats ['X', 'O']"


def test_ludic_eval_refuses_a_two_seat_env_before_the_model(tmp_path: Path) -> None:
    cfg = EvalConfig(env="tictactoe_duel", out_dir=tmp_path / "eval")
    with pytest.raises(ValueError, match=r"`ludic eval` drives one agent") as refused:
        run_eval_command(cfg)
    assert SEATS in str(refused.value) and "MultiAgentProtocol" in str(refused.value)
    assert not (tmp_path / "eval").exists()  # nothing ran, nothing written


def test_ludic_actor_refuses_a_two_seat_env_before_redis() -> None:
    # Port 1: nothing listens there, so reaching Redis first would be another error.
    cfg = ActorConfig(env="tictactoe_duel", redis_url="redis://127.0.0.1:1/0", batches=1)
    with pytest.raises(ValueError, match=r"`ludic actor` drives one agent") as refused:
        run_actor(cfg)
    assert SEATS in str(refused.value) and "selfplay.py" in str(refused.value)


@pytest.mark.slow
def test_the_command_line_says_it_in_one_error_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "eval", "--env", "tictactoe_duel", "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""  # refused before the context and engine lines
    assert done.stderr.startswith(f"ludic eval: error: {SEATS}"), done.stderr
