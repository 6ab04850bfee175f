"""SIGTERM while `ludic train` saves a checkpoint (a preempted job): the save completes, the run
then stops with the one interrupted line naming it, and `--resume` continues from it (the
deferral itself, and a second signal that cuts the save short:
tests/training/test_checkpoint_signal_deferral.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ludic.training import CheckpointConfig, CheckpointManager

TRAIN = ["train", "--steps", "2", "--checkpoint-every", "1", "--problems-per-step", "1"]
TRAIN += ["--group-size", "2", "--max-tokens", "4", "--max-steps", "2", "--out-dir", "run"]
TRAIN += ["--no-progress"]

# `ludic train` (as the console script runs it: `main()` with sys.argv), whose first save holds
# its manifest back until the test has sent its signal (the file GATE exists): the signal lands
# inside the save, never after it, however fast the save.
_HELD_FIRST_SAVE = """
import sys, time
from pathlib import Path
from ludic import cli
from ludic.training.checkpoint import CheckpointManager

gate = Path(sys.argv[1])
write_manifest = CheckpointManager._write_manifest

def held(self, tmp, step):
    while step == 1 and not gate.exists():
        time.sleep(0.01)
    write_manifest(self, tmp, step)

CheckpointManager._write_manifest = held
sys.argv = ["ludic", *sys.argv[2:]]
cli.main()
"""


def _await(ready: object, process: subprocess.Popen[str], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the run exited with {process.returncode} first:\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            process.communicate()
            pytest.fail("the run's first save did not start in time")
        time.sleep(0.02)


def _communicate(process: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.slow
def test_sigterm_during_a_save_keeps_the_checkpoint_and_resume_continues(tmp_path: Path) -> None:
    gate = tmp_path / "signal-sent"
    checkpoints = tmp_path / "run" / "checkpoints"
    process = subprocess.Popen(
        [sys.executable, "-c", _HELD_FIRST_SAVE, str(gate), *TRAIN],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _await(lambda: any(checkpoints.glob(".tmp-step_00000001-*")), process)
    process.send_signal(signal.SIGTERM)
    gate.touch()
    _, err = _communicate(process)
    assert process.returncode == 143, err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "interrupted" in line]
    assert (
        line == "ludic train: interrupted (SIGTERM); last checkpoint: run/checkpoints/step_00000001"
    )
    assert "SIGTERM: finishing the save of checkpoint" in err
    manager = CheckpointManager(CheckpointConfig(dir=str(checkpoints)))
    assert manager.list() == [checkpoints / "step_00000001"]  # not step 2: it stopped
    manager.verify(checkpoints / "step_00000001", deep=True)
    assert not list(checkpoints.glob(".tmp-*"))

    resumed = subprocess.run(
        [sys.executable, "-m", "ludic.cli", *TRAIN, "--resume"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed at step 1" in resumed.stdout
    assert manager.latest() == checkpoints / "step_00000002"
