"""`ludic eval` from the command line when episodes fail: every episode failing (here: an env
whose every reset raises) exits 1 with a closing line naming the first error; some failing
keeps exit 0 and says how many. (A wrong --served-model no longer gets that far: it is refused
before any episode, tests/recipes/test_eval_served_model.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app_server import serving_app, tiny_app

FLAKY_ENV = '''
from ludic.envs.single_agent import SingleAgentEnv


class FlakyEnv(SingleAgentEnv):
    """Odd seeds fail at reset; even seeds are one-step episodes with reward 1."""

    def env_reset(self, seed=None):
        if seed % 2:
            raise RuntimeError(f"flaky reset for seed {seed}")
        return f"question {seed}", {}

    def env_step(self, action):
        from ludic.types import StepOutcome

        return StepOutcome(obs="done", reward=1.0, terminated=True, info={})


class BrokenEnv(FlakyEnv):
    """Every seed fails at reset."""

    def env_reset(self, seed=None):
        raise RuntimeError(f"broken reset for seed {seed}")
'''


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """The embedded HTTP server over the tiny model, serving it as "tiny"."""
    with tiny_app() as app, serving_app(app) as url:
        yield f"{url}/v1"


def run_eval_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "ludic"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    common = ["--num-problems", "4", "--max-steps", "1", "--max-tokens", "4", "--no-progress"]
    return subprocess.run(
        [*command, "eval", *args, *common],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_every_episode_failing_exits_1_naming_the_first_error(
    server_url: str, tmp_path: Path
) -> None:
    (tmp_path / "flaky_env.py").write_text(FLAKY_ENV)
    done = run_eval_cli(
        tmp_path,
        *("--env", "flaky_env:BrokenEnv", "--server-url", server_url),
        *("--out-dir", str(tmp_path / "eval")),
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    last = done.stdout.strip().splitlines()[-1]
    assert "every one of the 4 episodes failed" in out and "nothing was evaluated" in out, out
    assert "broken reset for seed 0" in out, out  # the first episode's own error
    assert "ludic eval:" in out and last.endswith("run again"), last
    assert (tmp_path / "eval" / "rollouts.jsonl").exists()  # the failures are still recorded


def test_some_episodes_failing_exit_0_and_say_how_many(server_url: str, tmp_path: Path) -> None:
    (tmp_path / "flaky_env.py").write_text(FLAKY_ENV)
    done = run_eval_cli(
        tmp_path,
        *("--env", "flaky_env:FlakyEnv", "--server-url", server_url),
        *("--out-dir", str(tmp_path / "eval")),
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "2 of 4 episodes failed" in out and "flaky reset for seed 1" in out, out


def test_no_failure_line_when_every_episode_ran(server_url: str, tmp_path: Path) -> None:
    fakes = Path(__file__).parent
    done = run_eval_cli(
        fakes,
        *("--env", "eval_fakes:QuizEnv", "--server-url", server_url),
        *("--out-dir", str(tmp_path / "eval")),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed" not in done.stdout.split("records in")[-1], done.stdout
