"""Process helpers for the tests/combos/test_combo2_* runs: `ludic` commands in new processes,
a `ludic serve` waited for until it answers, their outputs, and the small model they train."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from ludic.models import TinyModelSpec

HERE = Path(__file__).parent
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
    """The `ludic` command line, as the console script runs it (this venv's)."""
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [*head, *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(command: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    """`command` in a new process in `cwd`, which finds tests/combos' modules (`--env
    combo_say_o:SayOEnv`); its stdout and stderr together."""
    path = os.pathsep.join([str(HERE), *sys.path])
    return subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], code: int = 0) -> str:
    """The process's output (rich's line wrapping undone), once it exited with `code`."""
    try:
        out, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == code, out[-6000:]
    return " ".join(out.split())


def run(command: list[str], cwd: Path, code: int = 0, **env: str) -> str:
    return finish(start(command, cwd, **env), code)


def serve(
    model: Path, cwd: Path, log: Path, token: str, *extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`ludic serve --model MODEL EXTRA...` on a free port, once it answers /health; its output
    in `log`. The caller stops it (`stop`)."""
    port = free_port()
    args = ["serve", "--model", str(model), "--token", token, "--port", str(port), *extra]
    with log.open("wb") as out:
        server = subprocess.Popen(
            ludic(*args, "--threads", "1"), cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )
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


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within a minute."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
