"""Ctrl-C or SIGTERM ends a `ludic` command with one line (naming the newest checkpoint where
the command saves them) and exit code 130 / 143, after its cleanup ran; an error is never
reported as an interrupt (how refusals and bugs are reported: tests/test_cli_errors.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ludic.cli import COMMANDS, _interrupted_line
from ludic.models import tiny_model_dir
from ludic.recipes.configs import QuickstartConfig, TrainConfig


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ludic.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_until(ready: object, process: subprocess.Popen[str], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the command exited with {process.returncode} first:\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the command did not get ready in time")
        time.sleep(0.2)


def _stop(process: subprocess.Popen[str], signum: int) -> tuple[int, str]:
    process.send_signal(signum)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serves(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).is_success
    except httpx.HTTPError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "why"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_serve_stops_with_one_line_and_the_signals_exit_code(
    tmp_path: Path, signum: int, code: int, why: str
) -> None:
    port = _free_port()
    args = ["serve", "--model", str(tiny_model_dir()), "--port", str(port), "--threads", "1"]
    process = _start(args, tmp_path)
    _wait_until(lambda: _serves(port), process)
    returncode, err = _stop(process, signum)
    assert returncode == code, err
    assert f"ludic serve: interrupted ({why})" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not _serves(port)


@pytest.mark.slow
def test_train_interrupted_names_its_last_checkpoint(tmp_path: Path) -> None:
    """Ctrl-C on the in-process engine. SIGTERM, which `--local-server` handles itself (it
    defers it), is tested on that run: tests/recipes/test_train_local_server.py."""
    args = ["train", "--steps", "500", "--checkpoint-every", "1", "--problems-per-step", "1"]
    args += ["--group-size", "2", "--max-tokens", "4", "--max-steps", "2", "--out-dir", "run"]
    args += ["--no-progress"]
    process = _start(args, tmp_path)
    checkpoints = tmp_path / "run" / "checkpoints"
    _wait_until(lambda: (checkpoints / "step_00000001").is_dir(), process, timeout_s=300)
    returncode, err = _stop(process, signal.SIGINT)
    assert returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (line,) = [line for line in err.splitlines() if "interrupted" in line]
    newest = max(p.name for p in checkpoints.iterdir() if p.name.startswith("step_"))
    assert line == f"ludic train: interrupted (Ctrl-C); last checkpoint: run/checkpoints/{newest}"


def _saved(path: Path) -> Path:
    """A complete checkpoint directory: one holding the MANIFEST.json a save writes last."""
    path.mkdir(parents=True)
    (path / "MANIFEST.json").write_text('{"format": 1, "files": {}}')
    return path


def _old_checkpoint(root: Path, step: int, age_s: float = 3600) -> Path:
    """A complete `step_N` directory an earlier run left (its mtime `age_s` ago)."""
    path = _saved(root / f"step_{step:08d}")
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


def test_the_line_says_when_no_checkpoint_was_saved_yet(tmp_path: Path) -> None:
    cfg = TrainConfig(out_dir=tmp_path / "run")
    started = time.time()
    line = _interrupted_line("train", COMMANDS["train"], cfg, terminated=True, started=started)
    assert line == (
        f"ludic train: interrupted (SIGTERM); no checkpoint saved by this run under {cfg.out_dir}"
    )
    for step in ("step_00000002", "step_00000010", "step_00000009.tmp-host-1"):
        _saved(cfg.out_dir / "checkpoints" / step)
    line = _interrupted_line("train", COMMANDS["train"], cfg, terminated=False, started=started)
    assert line.endswith(f"last checkpoint: {cfg.out_dir / 'checkpoints' / 'step_00000010'}")


def test_a_checkpoint_an_earlier_run_left_is_never_named(tmp_path: Path) -> None:
    cfg = TrainConfig(out_dir=tmp_path / "run")
    checkpoints = cfg.out_dir / "checkpoints"
    _old_checkpoint(checkpoints, 50)
    started = time.time()
    line = _interrupted_line("train", COMMANDS["train"], cfg, terminated=False, started=started)
    assert line == (
        f"ludic train: interrupted (Ctrl-C); no checkpoint saved by this run under {cfg.out_dir}"
    )
    _saved(checkpoints / "step_00000003")  # this run's, numbered below the leftover
    line = _interrupted_line("train", COMMANDS["train"], cfg, terminated=False, started=started)
    assert line.endswith(f"last checkpoint: {checkpoints / 'step_00000003'}")


def test_a_resumed_run_names_the_checkpoint_it_resumed_from(tmp_path: Path) -> None:
    out = tmp_path / "run"
    old = _old_checkpoint(out / "checkpoints", 50)
    _old_checkpoint(out / "checkpoints", 40)
    started = time.time()
    for resume in ("latest", str(out / "checkpoints"), str(old)):
        cfg = TrainConfig(out_dir=out, resume=resume)
        line = _interrupted_line("train", COMMANDS["train"], cfg, terminated=False, started=started)
        assert line.endswith(f"last checkpoint: {old} (the one it resumed from; none saved since)")


def test_a_partial_checkpoint_is_never_named(tmp_path: Path) -> None:
    """A `step_N` without its manifest (a save that never finished, a copy cut short) is one
    resume skips: the line names the checkpoint resume took, not the partial one."""
    out = tmp_path / "run"
    resumed_from = _old_checkpoint(out / "checkpoints", 2)
    (out / "checkpoints" / "step_00000004" / "model").mkdir(parents=True)
    cfg = TrainConfig(out_dir=out, resume="latest")
    started = time.time()
    expected = f"last checkpoint: {resumed_from} (the one it resumed from; none saved since)"
    line = _interrupted_line("train", COMMANDS["train"], cfg, terminated=False, started=started)
    assert line.endswith(expected)
    (out / "checkpoints" / "step_00000006").mkdir()  # written during this run, never finished
    line = _interrupted_line("train", COMMANDS["train"], cfg, terminated=False, started=started)
    assert line.endswith(expected)


def test_the_quickstart_names_only_its_own_checkpoints(tmp_path: Path) -> None:
    cfg = QuickstartConfig(out_dir=tmp_path / "qs")
    _old_checkpoint(cfg.out_dir / "rl" / "checkpoints", 40)
    _old_checkpoint(cfg.out_dir / "sft" / "checkpoints", 300)
    command, started = COMMANDS["quickstart"], time.time()
    line = _interrupted_line("quickstart", command, cfg, terminated=False, started=started)
    assert line.endswith(f"no checkpoint saved by this run under {cfg.out_dir}")
    _saved(cfg.out_dir / "sft" / "checkpoints" / "step_00000100")
    line = _interrupted_line("quickstart", command, cfg, terminated=False, started=started)
    assert line.endswith(
        f"last checkpoint: {cfg.out_dir / 'sft' / 'checkpoints' / 'step_00000100'}"
    )


@pytest.mark.slow
def test_a_run_interrupted_before_its_first_checkpoint_says_it_saved_none(tmp_path: Path) -> None:
    """End to end: the line says no checkpoint was saved. (An earlier run's checkpoints in
    OUT_DIR refuse a new run before it starts, tests/recipes/test_train_out_dir.py; with
    --resume the line names the resumed one: the `_interrupted_line` tests above.)"""
    args = ["train", "--steps", "500", "--problems-per-step", "1", "--group-size", "2"]
    args += ["--max-tokens", "4", "--max-steps", "2", "--out-dir", "run", "--no-progress"]
    process = _start(args, tmp_path)
    _wait_until(lambda: (tmp_path / "run" / "metrics.jsonl").is_file(), process, timeout_s=300)
    returncode, err = _stop(process, signal.SIGINT)
    assert returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (line,) = [line for line in err.splitlines() if "interrupted" in line]
    assert line == "ludic train: interrupted (Ctrl-C); no checkpoint saved by this run under run"


def test_an_error_keeps_its_exit_code_and_is_not_an_interrupt(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "eval", "--env", "no_such_env"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "ludic eval: error: unknown env 'no_such_env'" in result.stderr
    assert "interrupted" not in result.stderr


_SIGNAL_INSIDE_A_GATHERED_TASK = """
import asyncio, dataclasses, os, signal
from ludic import cli

@dataclasses.dataclass
class Config:
    pass

async def _task(i: int) -> None:
    await asyncio.sleep(0.01 * i)
    if i == 2:
        os.kill(os.getpid(), signal.SIGINT)  # lands inside this task, one of several gathered
        for _ in range(100_000):
            pass
    await asyncio.sleep(30)

def run(cfg: Config) -> None:
    async def main() -> None:
        await asyncio.gather(*(_task(i) for i in range(4)))
    asyncio.run(main())

cli.COMMANDS["gathered"] = cli.Command(config="__main__:Config", run="__main__:run", summary="")
cli.main(["gathered"])
"""


def test_a_signal_inside_a_gathered_task_ends_with_one_line_only(tmp_path: Path) -> None:
    """The signal raises inside one task of an `asyncio.gather`: that task dies with the
    KeyboardInterrupt, and asyncio would log "Task exception was never retrieved" with its
    traceback when the task is collected (seen in CI on `ludic train`)."""
    result = subprocess.run(
        [sys.executable, "-c", _SIGNAL_INSIDE_A_GATHERED_TASK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "ludic gathered: interrupted (Ctrl-C)", result.stderr
