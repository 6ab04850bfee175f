"""Shared helpers of the tests/combos runs: each stage a `ludic` command (or a combo program) in a
new process in the test's folder, which their relative paths name, as README tells users to run
them; the servers they talk to (`ludic serve`, a real redis-server); the files they write."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import redis

from ludic.models import TinyModelSpec

HERE = Path(__file__).parent
TOKEN = "combo-token"  # the servers' control token (`--token`, $LUDIC_SERVER_TOKEN)
# A model small enough that a step and a checkpoint take well under a second.
SPEC = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tokenizer_vocab_size=300,
)


def ludic(*args: str) -> list[str]:
    """The `ludic` command line, as the console script runs it (this venv's, else `python -m
    ludic.cli`)."""
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [*head, *args]


def program(name: str, *args: str) -> list[str]:
    """The command line of tests/combos' program `name` (a user's own training script)."""
    return [sys.executable, str(HERE / name), *args]


def expert_games(cwd: Path) -> None:
    """data/expert.jsonl in `cwd`: 8 expert tic-tac-toe games (examples/rejection_sampling.py
    --expert), the README's SFT data."""
    script = HERE.parents[1] / "examples" / "rejection_sampling.py"
    run(
        [sys.executable, str(script), "--expert", "--problems", "8", "--out", "data/expert.jsonl"],
        cwd,
    )


def sft_on_expert_games(cwd: Path) -> str:
    """The README's recipe up to its SFT checkpoint, in `cwd`: expert games, then `ludic sft`
    2 steps of batch 8 on them into sft/; the command's output."""
    expert_games(cwd)
    sft = ("sft", "--data", "data/expert.jsonl", "--steps", "2", "--batch-size", "8")
    return run(ludic(*sft, "--out-dir", "sft", "--no-progress"), cwd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _environment(env: dict[str, str]) -> dict[str, str]:
    """This process's environment, with tests/combos importable (`--env combo_say_o:SayOEnv`),
    one OpenMP thread (the box is shared), and `env` on top."""
    path = os.pathsep.join([str(HERE), *sys.path])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **env}


def start(command: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    """`command` in a new process in `cwd`; its stdout and stderr together, read by `finish`."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def spawn(
    command: list[str], log: Path, cwd: Path | None = None, **env: str
) -> subprocess.Popen[bytes]:
    """`command` in a new process in `cwd` (default: the log's folder, the test's), its output
    appended to `log`: for servers and the long-running sides of a pipeline."""
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            cwd=cwd or log.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_environment(env),
        )


def finish(process: subprocess.Popen[Any], log: Path | None = None, code: int = 0) -> str:
    """The output of `process` (`log` where it was spawned), once it exited with `code`; rich's
    line wrapping undone."""
    try:
        if log is None:
            out, _ = process.communicate(timeout=900)
        else:
            process.wait(timeout=900)
            out = log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == code, out[-6000:]
    return " ".join(out.split())


def run(command: list[str], cwd: Path, code: int = 0, **env: str) -> str:
    """`command` run to its end in a new process in `cwd`, which must exit with `code`."""
    return finish(start(command, cwd, **env), code=code)


def until(condition: Callable[[], bool], what: str, timeout: float = 900) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def interrupt_once(
    command: list[str], cwd: Path, mark: Path, sig: signal.Signals, code: int, **env: str
) -> str:
    """`command` started in `cwd` and sent `sig` (Ctrl-C, a scheduler's SIGTERM) once `mark`
    exists; its output, once it exited with `code`."""
    process = start(command, cwd, **env)
    try:
        until(lambda: mark.exists() or process.poll() is not None, f"{mark} written", 400)
    except AssertionError:
        process.kill()
        process.communicate()
        raise
    if process.poll() is None:
        process.send_signal(sig)
    return finish(process, code=code)


STOPPED = re.compile(r"ludic train: interrupted \(SIGTERM\); last checkpoint: \S+step_(\d+)")


def stop_after_checkpoint(command: list[str], cwd: Path, out_dir: str, step: int = 2) -> int:
    """`ludic train` COMMAND stopped with SIGTERM, as a scheduler stops a job, once its
    OUT_DIR's checkpoint STEP is complete; the step of the last checkpoint it names on its way
    out (the step it stopped at)."""
    mark = cwd / out_dir / "checkpoints" / f"step_{step:08d}" / "MANIFEST.json"
    (stopped,) = STOPPED.findall(interrupt_once(command, cwd, mark, signal.SIGTERM, code=143))
    return int(stopped)


def serve(
    model: Path | str, cwd: Path, log: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`ludic serve --model MODEL EXTRA...` (control token TOKEN) on a free port, once it
    answers /health; its output in `log`. The caller stops it (`stop`)."""
    port = free_port()
    args = ["serve", "--model", str(model), "--token", TOKEN, "--port", str(port), *extra]
    server = spawn(ludic(*args, "--threads", "1"), log, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "ludic serve did not answer /health in 300 s"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def served_version(url: str) -> int | None:
    """The policy version the server at `url` serves; None while it does not answer yet."""
    try:
        reply = httpx.get(url + "/ludic/version", headers={"Authorization": f"Bearer {TOKEN}"})
    except httpx.TransportError:  # still loading its model
        return None
    return int(reply.json()["policy_version"]) if reply.status_code == 200 else None


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within a minute."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server persisting every write under `folder` (as the README starts it), and its
    port; skips the test where redis-server is not on PATH."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH")
    port = free_port()
    (folder / "redis").mkdir()
    process = spawn(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1"),
            *("--dir", str(folder / "redis"), "--appendonly", "yes"),
            *("--appendfsync", "always", "--save", ""),
        ],
        folder / "redis.log",
    )
    return process, port


class Servers(NamedTuple):
    """A pipeline's redis-server (its port) and `ludic serve` (its URL)."""

    redis_port: int
    url: str

    @property
    def flags(self) -> list[str]:
        """The `--redis-url` and `--server-url` of `ludic actor` and `ludic learner`."""
        return ["--redis-url", f"redis://127.0.0.1:{self.redis_port}/0", "--server-url", self.url]


@contextmanager
def pipeline_servers(folder: Path, model: Path | str, *serve_extra: str) -> Iterator[Servers]:
    """A redis-server and `ludic serve --model MODEL` (README "Decoupled actor and learner over
    Redis"), their logs in `folder`; both stopped when the block ends."""
    store, port = start_redis(folder)
    try:
        server, url = serve(model, folder, folder / "serve.log", *serve_extra)
        try:
            yield Servers(port, url)
        finally:
            stop(server)
    finally:
        stop(store)


def say_o_actor(servers: Servers, *extra: str) -> list[str]:
    """`ludic actor` on the pipeline's servers, playing combo_say_o (one turn of up to 8
    tokens) in batches of 2 problems x 2 samples, as actor a0, its batches in actor.jsonl."""
    return ludic(
        *("actor", *servers.flags, "--env", "combo_say_o:SayOEnv", "--max-steps", "1"),
        *("--max-tokens", "8", "--problems-per-batch", "2", "--group-size", "2"),
        *("--actor-id", "a0", "--metrics-path", "actor.jsonl", *extra),
    )


def ledger_ids(client: redis.Redis, stream: str = "ludic:samples") -> list[str]:
    """The sample ids the learners' commit ledger acknowledged as trained (markers left out)."""
    ids = [i for _, f in client.xrange(f"{stream}:ledger") for i in json.loads(f[b"ids"])]
    return [i for i in ids if i.split(":", 1)[0] not in ("duplicate", "invalid", "trimmed")]


def records(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's records."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def agent_steps(rollouts: Path) -> list[dict[str, Any]]:
    """Every model call's step of a rollouts.jsonl, in file order."""
    return [s for r in records(rollouts) for s in r["steps"] if s["kind"] == "agent"]


def completions(rollouts: Path) -> list[list[int]]:
    """Every model call's sampled token ids, in the order rollouts.jsonl holds them."""
    return [s["trace"]["completion_token_ids"] for s in agent_steps(rollouts)]
