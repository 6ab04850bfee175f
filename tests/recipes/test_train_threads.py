"""`ludic train --threads N`, run as a user runs it (the `ludic` command in a new process): the
torch intra-op threads of the training process, as `ludic quickstart --threads` and `ludic eval
--threads` take them; below 1 it is refused, naming the flag, before anything loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# An env that writes the torch thread count its episode sees (on the rollouts' threads, as
# the embedded engine's forward runs) to threads.txt in the working directory.
THREADS_ENV = """
from pathlib import Path

import torch

from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class Threads(SingleAgentEnv):
    def env_reset(self, seed=None):
        Path("threads.txt").write_text(str(torch.get_num_threads()))
        return "Say something.", {}

    def env_step(self, action):
        return StepOutcome(obs="done", reward=float("o" in action), terminated=True)
"""
SMALL = ("--steps", "1", "--problems-per-step", "1", "--group-size", "2", "--max-tokens", "2")


def ludic_train(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        cwd=cwd,
        env={**env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_threads_below_one_is_refused_naming_the_flag(tmp_path: Path) -> None:
    done = ludic_train(tmp_path, "--threads", "0", "--out-dir", "run", *SMALL)
    assert done.returncode == 1, done.stderr
    assert "ludic train: error: --threads must be >= 1 (or left out), got 0" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_help_documents_threads() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = " ".join(done.stdout.split())
    assert "--threads" in text and "intra-op" in text


@pytest.mark.slow
def test_threads_sets_the_torch_threads_the_run_uses(tmp_path: Path) -> None:
    (tmp_path / "threads_env.py").write_text(THREADS_ENV)
    threads = 3 if (os.cpu_count() or 1) != 3 else 2  # not what torch would pick itself
    args = ["--env", "threads_env:Threads", "--out-dir", "run", "--no-progress", *SMALL]
    done = ludic_train(tmp_path, *args, "--threads", str(threads))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "threads.txt").read_text() == str(threads)
