"""`ludic train --local-server`, run as a user runs it (the `ludic` command in a new process):
generation in a `ludic serve` child process overlapped with training, a resume that serves the
restored weights before its first rollout, and no server left behind however the run ends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ludic.models import tiny_model_dir
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_local_server import (
    LOCAL_SERVER_LOG,
    LOCAL_SERVER_MODEL,
    trainer_max_lag,
)
from ludic.training.schedule import lr_multiplier

HERE = Path(__file__).parent
SERVER_PID = re.compile(r"local server: `ludic serve` pid (\d+) on http://127\.0\.0\.1:\d+")
RUN_FLAGS = (
    *("--env", "resume_envs:SayOTwiceEnv", "--local-server"),
    *("--problems-per-step", "2", "--group-size", "3", "--max-steps", "2", "--max-tokens", "8"),
    *("--lr", "3e-2", "--lr-schedule", "cosine", "--warmup-steps", "1", "--schedule-steps", "5"),
    *("--temperature", "0.9", "--top-p", "0.95", "--checkpoint-every", "1", "--no-progress"),
)


def _command(out_dir: Path, model: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
    ludic = Path(sys.executable).parent / "ludic"
    head = [str(ludic)] if ludic.exists() else [sys.executable, "-m", "ludic.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    args = [*RUN_FLAGS, "--model", str(model), "--out-dir", str(out_dir), *extra]
    return [*head, "train", *args], env


def ludic_train(out_dir: Path, model: Path, *extra: str) -> str:
    command, env = _command(out_dir, model, *extra)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(done.stdout.split())  # rich wraps long lines


def server_pid(output: str) -> int:
    (pid,) = SERVER_PID.findall(output)
    return int(pid)


def gone(pid: int) -> bool:
    """True when no process `pid` is left (or only a zombie no one waits on)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sample_lags(out_dir: Path) -> list[list[int]]:
    """Per step, each sample's lag: the trainer's version when it trained the batch (step - 1)
    minus the oldest policy version of the sample's tokens. samples.jsonl holds every batch in
    order, `num_samples_in` lines each."""
    samples = records(out_dir / "samples.jsonl")
    lags, at = [], 0
    for metric in records(out_dir / "metrics.jsonl"):
        batch = samples[at : at + int(metric["num_samples_in"])]
        at += len(batch)
        lags.append([metric["step"] - 1 - min(s["meta"]["policy_versions"]) for s in batch])
    assert at == len(samples)
    return lags


@pytest.mark.slow
def test_local_server_trains_overlapped_then_resumes_in_a_new_process(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    run = tmp_path / "run"
    first = ludic_train(run, model, "--steps", "3")
    assert "served policy version 3, the trainer's; samples trained at most 1 version old" in first
    assert gone(server_pid(first))
    assert not (run / LOCAL_SERVER_MODEL).exists()  # a run that ends well removes its copy
    second = ludic_train(run, model, "--steps", "5", "--resume")
    # The fresh server started from the initial weights; resume pushed the restored ones.
    assert "resumed at step 3 (policy version 3)" in second
    assert "served policy version 5, the trainer's" in second
    assert gone(server_pid(second))
    assert server_pid(first) != server_pid(second)
    assert (run / LOCAL_SERVER_LOG).is_file()
    assert not (run / LOCAL_SERVER_MODEL).exists()

    metrics = records(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert [m["policy_version"] for m in metrics] == [1, 2, 3, 4, 5]
    assert all(m["dropped_stale"] == 0 and m["num_samples"] == 12 for m in metrics)
    assert all(m["policy_lag/ahead"] == 0 and m["policy_lag/max"] <= 1 for m in metrics)
    assert all(m["batch/prefetch_draw_seconds"] > 0 for m in metrics)
    # Every sample is at most one version old; the first batch of each process is on-policy
    # (drawn before any update, and after resume from the restored weights: had they not
    # been served, its samples would be 3 versions old); later batches overlap a step: at
    # least one of the first run's (under load the server may only start a batch once the
    # step beside it has pushed, and then it is on-policy: why not every one is asserted).
    lags = sample_lags(run)
    assert all(0 <= lag <= 1 for step in lags for lag in step), lags
    assert max(lags[0]) == 0 and max(lags[3]) == 0, lags
    assert max(lags[1] + lags[2]) == 1, lags
    # The LR schedule runs on across the restart, and the rollouts' sampling reached samples.
    expected = [
        3e-2 * lr_multiplier(i, schedule="cosine", warmup_steps=1, total_steps=5) for i in range(5)
    ]
    assert [m["lr"] for m in metrics] == pytest.approx(expected)
    samples = records(run / "samples.jsonl")
    assert {json.dumps(s["meta"]["behavior_sampling"]) for s in samples} == {
        json.dumps({"temperature": 0.9, "top_k": -1, "top_p": 0.95})
    }
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "step_00000005"


def _until_one_step(child: subprocess.Popen[str], run: Path, mark: Path | None = None) -> None:
    while not (mark or run / "metrics.jsonl").exists():  # one step trained
        if child.poll() is not None:
            out, _ = child.communicate()
            pytest.fail(f"the run exited with {child.returncode} first:\n{out}")
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    """The pids of `pid`'s child processes (Linux: from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _wait_gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return gone(pid)


@pytest.mark.slow
def test_sigterm_ends_the_run_with_one_line_its_checkpoint_and_no_server(tmp_path: Path) -> None:
    """SIGTERM (the local server defers its own handling of it) ends the run with exit code 143
    and one line naming its newest checkpoint, and stops the server. (Ctrl-C: the terminal test
    below; SIGINT sent to the trainer alone reaches it the same way, the server being outside
    its process group.)"""
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    run = tmp_path / "run"
    command, env = _command(run, model, "--steps", "200")
    child = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _until_one_step(child, run, run / "checkpoints" / "step_00000001")
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 143, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    (line,) = [line for line in err.splitlines() if "interrupted" in line]
    checkpoints = run / "checkpoints"
    newest = max(p.name for p in checkpoints.iterdir() if p.name.startswith("step_"))
    assert line == f"ludic train: interrupted (SIGTERM); last checkpoint: {checkpoints / newest}"
    pid = server_pid(" ".join(out.split()))
    assert _wait_gone(pid), f"the server (pid {pid}) outlived the run"


@pytest.mark.slow
def test_kill_9_leaves_no_model_copy_outside_the_run_and_the_next_run_replaces_it(
    tmp_path: Path,
) -> None:
    """The trainer killed with SIGKILL cannot clean up: the server stops itself (it watches
    its parent), and the weights copy it loaded is in the run directory, not in /tmp, where
    nothing would remove it; the next run there replaces it and removes it when it ends, even
    when that run fails: every episode of its env fails, so the Trainer stops with
    TrainingStalledError, and its server stops too. (A run that ends well removes its copy:
    the resume test.)"""
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    run, temp = tmp_path / "run", tmp_path / "tmp"
    temp.mkdir()
    command, env = _command(run, model, "--steps", "200")
    # No checkpoint: one the killed run saved (had its first step finished before the kill)
    # would refuse the next run here as a new run in an earlier run's OUT_DIR.
    at = command.index("--checkpoint-every")
    del command[at : at + 2]
    env["TMPDIR"] = str(temp)
    child = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _until_one_step(child, run)
    finally:
        child.kill()
    out, _ = child.communicate(timeout=60)
    pid = server_pid(" ".join(out.split()))
    assert _wait_gone(pid), f"the server (pid {pid}) outlived the killed trainer"
    assert not [p.name for p in temp.iterdir() if p.name.startswith("ludic-local-server")]
    assert (run / LOCAL_SERVER_MODEL / "config.json").is_file()  # the killed run's copy

    command, env = _command(run, model, "--steps", "20")
    command[command.index("resume_envs:SayOTwiceEnv")] = "train_envs:BrokenEnv"
    env["TMPDIR"] = str(temp)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0, output[-3000:]
    assert "ludic train: error: training stalled:" in output, output[-3000:]
    assert _wait_gone(server_pid(output))
    assert not (run / LOCAL_SERVER_MODEL).exists()
    assert not list(temp.iterdir())


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_in_a_terminal_stops_trainer_and_server_with_one_line(tmp_path: Path) -> None:
    """A terminal's Ctrl-C signals the whole foreground process group at once: the run still
    ends with exit code 130 and the one-line message (the server does not die under the
    trainer first), and no server is left."""
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    run = tmp_path / "run"
    command, env = _command(run, model, "--steps", "200")
    child = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    try:
        _until_one_step(child, run, run / "checkpoints" / "step_00000001")
        # The server is out of the trainer's process group, so the group's SIGINT misses it.
        (server,) = _children(child.pid)
        assert os.getpgid(server) != child.pid
        time.sleep(0.6)  # inside the next step: the server generates, the trainer trains
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 130, out + err
    assert "Traceback" not in err and "Error" not in err, err
    # The server outlives the trainer's cleanup, which closes its weight-sync group and then
    # stops it (a server that died first left "could not close ...: Connection refused").
    assert "could not close" not in err and "cannot reach the server" not in err, err
    (line,) = [line for line in err.splitlines() if "interrupted" in line]
    assert line.startswith("ludic train: interrupted (Ctrl-C); last checkpoint: ")
    pid = server_pid(" ".join(out.split()))
    assert _wait_gone(pid, timeout_s=5), f"the server (pid {pid}) outlived the run"
    assert not (run / LOCAL_SERVER_MODEL).exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"max_lag": 0}, r"--max-lag 0 would drop all of them"),
        ({"server_url": ("http://127.0.0.1:1",)}, r"drop --server-url"),
        ({"batch_invariant": True}, r"drop --batch-invariant or --local-server"),
        ({"device": "cuda"}, r"runs on the CPU.*--server-url"),
        ({"local_server_threads": 0}, r"--local-server-threads must be >= 1"),
    ],
)
def test_flags_that_cannot_go_with_local_server_are_refused(
    flags: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        trainer_max_lag(TrainConfig(local_server=True, **flags))


def test_max_lag_defaults() -> None:
    assert trainer_max_lag(TrainConfig()) == 0
    assert trainer_max_lag(TrainConfig(local_server=True)) == 1
    assert trainer_max_lag(TrainConfig(local_server=True, max_lag=2)) == 2
    assert trainer_max_lag(TrainConfig(max_lag=3)) == 3
    with pytest.raises(ValueError, match="--max-lag must be >= 0"):
        trainer_max_lag(TrainConfig(max_lag=-1))
