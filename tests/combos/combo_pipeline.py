"""Helpers for the tests/combos runs of the Redis pipeline as the README runs it: each side a
`ludic` command in its own process (run in the test's folder, which their relative paths name),
around a real redis-server and `ludic serve`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

HERE = Path(__file__).parent
TOKEN = "combo-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ludic(*args: str) -> list[str]:
    """The `ludic` command line (the installed script, else `python -m ludic.cli`)."""
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [*head, *args]


def spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`command` run in the log's folder (the test's), which its relative paths name, with this
    folder importable (`--env combo_say_o:SayOEnv`) and the servers' control token set."""
    path = os.pathsep.join([str(HERE), *sys.path])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    env["LUDIC_SERVER_TOKEN"] = TOKEN
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, env=env
        )


def finish(process: subprocess.Popen[bytes], log: Path, code: int = 0) -> None:
    """Wait for `process` to exit with `code`, failing with its log's tail otherwise."""
    try:
        assert process.wait(timeout=900) == code, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def until(condition: Callable[[], bool], what: str, timeout: float = 900) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def records(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's records ([] before it exists)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ledger_ids(client: redis.Redis, stream: str = "ludic:samples") -> list[str]:
    """The sample ids the learners' commit ledger acknowledged as trained (markers left out)."""
    ids = [i for _, f in client.xrange(f"{stream}:ledger") for i in json.loads(f[b"ids"])]
    return [i for i in ids if i.split(":", 1)[0] not in ("duplicate", "invalid", "trimmed")]


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
