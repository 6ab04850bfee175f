"""`ludic train --server-url` and `ludic learner --server-url`, each in a fresh process, against
a server whose weight-sync status offers no control this trainer drives (a server of another
Ludic version): the first push ends the command with one `error:` line naming the server, what
it offers and the fix, at once, not a traceback after the group join timed out."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app_server import serving_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from pipeline_fakes import RedisServer, redis_server

__all__ = ["redis_server"]  # a fixture
pytestmark = pytest.mark.timeout(300)
TOKEN = "control-token"


def _answer(handler: Any) -> tuple[int, Any]:
    """Enough of a server for the commands to reach their first push."""
    if handler.path == "/health":
        return 200, {"status": "ok"}
    if handler.path == "/v1/models":
        return 200, {"object": "list", "data": [{"id": "newer", "object": "model"}]}
    if handler.path.startswith("/ludic/weights/status"):
        return 200, {"controls": ["grpc"], "connected": False, "joining": False}
    return 404, {"detail": "Not Found"}  # /ludic/weights/init: never asked


@pytest.fixture
def newer_server() -> Iterator[str]:
    with serving_json(_answer) as url:
        yield url


def _error_line(command: str, args: list[str], cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", command, *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1", "LUDIC_TRACEBACK": ""},
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith(f"ludic {command}: error:")]
    assert len(errors) == 1, output[-3000:]
    return errors[0]


def _names_the_server_and_the_fix(line: str, url: str) -> None:
    assert f"server {url} drives weight pushes by control ['grpc'] only" in line
    assert "Install the same Ludic version on the trainer and the server" in line


def test_ludic_train_ends_with_one_line(newer_server: str, tmp_path: Path) -> None:
    args = ["--server-url", newer_server, "--server-token", TOKEN, "--steps", "1"]
    line = _error_line("train", [*args, "--out-dir", str(tmp_path / "run")], tmp_path)
    assert "could not push this run's starting weights" in line
    _names_the_server_and_the_fix(line, newer_server)


@pytest.mark.redis
def test_ludic_learner_ends_with_one_line(
    newer_server: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    args = ["--redis-url", redis_server.url, "--server-url", newer_server, "--token", TOKEN]
    line = _error_line(
        "learner", [*args, "--steps", "1", "--out-dir", str(tmp_path / "l")], tmp_path
    )
    _names_the_server_and_the_fix(line, newer_server)
