"""Two `ludic train` runs (here with --local-server) in one OUT_DIR, each a new process as a user starts
it: while the first lives, the second is refused at once, naming the first run's pid and
command, before it loads a model or touches the first run's weights copy; once the first is
killed with SIGKILL, the next run takes the directory over, saying whose lock it was."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ludic.models import tiny_model_dir
from ludic.recipes import train as train_module
from ludic.recipes.configs import TrainConfig
from ludic.recipes.run_lock import RUN_LOCK, RunDirInUseError
from ludic.recipes.train import train_command
from ludic.recipes.train_local_server import LOCAL_SERVER_MODEL

pytestmark = pytest.mark.skipif(os.name != "posix", reason="flock is POSIX")
HERE = Path(__file__).parent
RUN_FLAGS = (
    *("--env", "resume_envs:SayOTwiceEnv", "--local-server", "--no-progress"),
    *("--problems-per-step", "2", "--group-size", "2", "--max-steps", "2", "--max-tokens", "6"),
)


def _ludic_train(out_dir: Path, model: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
    ludic = Path(sys.executable).parent / "ludic"
    head = [str(ludic)] if ludic.exists() else [sys.executable, "-m", "ludic.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    command = [*head, "train", *RUN_FLAGS, "--model", str(model), "--out-dir", str(out_dir)]
    return [*command, *extra], env


def _squeezed(text: str) -> str:
    """`text` without whitespace (rich wraps long lines, even inside a path)."""
    return "".join(text.split())


def _until_training(child: subprocess.Popen[str], run: Path) -> None:
    """Until the first run trains (its first step's metrics are written)."""
    deadline = time.monotonic() + 300
    while not (run / "metrics.jsonl").exists():
        if child.poll() is not None:
            out, _ = child.communicate()
            pytest.fail(f"the first run exited with {child.returncode}:\n{out}")
        assert time.monotonic() < deadline, "the first run trained no step in 300 s"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_second_run_is_refused_then_takes_over_a_killed_one(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    run = tmp_path / "run"
    command, env = _ludic_train(run, model, "--steps", "500")
    first = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _until_training(first, run)
        copy = run / LOCAL_SERVER_MODEL / "config.json"
        stamp = copy.stat().st_mtime_ns
        command, env = _ludic_train(run, model, "--steps", "1")
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        refusal = " ".join((second.stdout + second.stderr).split())
        assert second.returncode != 0, refusal
        assert f"ludic train: error: {run} is in use" in refusal, refusal[-3000:]
        assert f"{run} is in use by another ludic run (pid {first.pid}" in (refusal)
        assert "--steps 500" in refusal  # the first run's command line
        assert "local server:" not in refusal  # refused before it started a server
        assert first.poll() is None  # the first run goes on, its weights copy untouched
        assert copy.stat().st_mtime_ns == stamp
    finally:
        first.kill()  # SIGKILL: its lock file stays behind, its lock goes with it
        first.communicate(timeout=60)
    assert (run / RUN_LOCK).exists()

    command, env = _ludic_train(run, model, "--steps", "1")
    third = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    output = third.stdout + third.stderr
    assert third.returncode == 0, output[-3000:]
    took_over = f"took over {run / RUN_LOCK} from a run that no longer holds it (pid "
    assert _squeezed(f"{took_over}{first.pid} on ") in _squeezed(output), output  # rich wraps
    assert not (run / RUN_LOCK).exists()  # removed when the run ended
    assert not (run / LOCAL_SERVER_MODEL).exists()


@pytest.mark.parametrize("local_server", [True, False])
def test_the_refusal_comes_before_the_model_loads(
    local_server: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ludic train` (with or without --local-server) checks the lock with its flags: another
    run's lock refuses it before a (possibly large) model loads, so two runs never write one
    OUT_DIR's checkpoints and metrics."""
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run / RUN_LOCK)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

        def no_load(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the model loaded before the lock was checked")

        monkeypatch.setattr(train_module, "load_policy", no_load)
        cfg = TrainConfig(env="tictactoe", local_server=local_server, out_dir=run)
        with pytest.raises(RunDirInUseError, match=rf"pid {holder.pid} "):
            train_command(cfg)
    finally:
        holder.kill()
        holder.wait()


HOLD = """
import sys, time
from pathlib import Path
from ludic.recipes.run_lock import run_lock
with run_lock(Path(sys.argv[1]), what="`ludic train`"):
    print("held", flush=True)
    time.sleep(600)
"""
