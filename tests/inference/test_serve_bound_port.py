"""`ludic serve --port 0` names the port it bound in its startup line: the line said
`http://127.0.0.1:0/v1`, the port asked for, which no client can reach."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from ludic.inference.http import server
from ludic.inference.http.serve_config import ServeConfig
from ludic.models import tiny_model_dir

_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/v1;")
T = TypeVar("T")


def test_the_line_names_the_port_uvicorn_serves_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    bound: list[int] = []

    def run(app: object, **kwargs: object) -> None:
        fd = kwargs["fd"]
        assert isinstance(fd, int)
        with socket.socket(fileno=socket.dup(fd)) as listening:  # the socket uvicorn serves on
            bound.append(listening.getsockname()[1])
        assert kwargs["port"] == bound[0]

    monkeypatch.setattr(uvicorn, "run", run)
    server.serve(ServeConfig(model=str(tiny_model_dir()), port=0))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ludic serve:"))
    match = _URL.search(line)
    assert match is not None, line
    assert int(match.group(1)) == bound[0] != 0


def _poll(ready: Callable[[], T | None], process: subprocess.Popen[bytes], log: Path) -> T:
    """`ready()`'s first answer that is not None, failing if the server exits or takes 180 s."""
    deadline = time.monotonic() + 180
    while (answer := ready()) is None:
        if process.poll() is not None:
            pytest.fail(f"ludic serve exited with {process.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"ludic serve did not get there in 180 s:\n{log.read_text()}")
        time.sleep(0.2)
    return answer


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.ConnectError:  # bound, not yet accepting: uvicorn is starting the app
        return None


@pytest.mark.slow
def test_the_printed_url_serves(tmp_path: Path) -> None:
    """End to end: a client that reads the line reaches the server there."""
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "ludic.cli", "serve", "--model", str(tiny_model_dir())]
    command += ["--port", "0", "--threads", "1"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        match = _poll(lambda: _URL.search(log.read_text()), process, log)  # after the model loads
        response = _poll(lambda: _get(f"http://127.0.0.1:{match.group(1)}/v1/models"), process, log)
        assert response.is_success, response.text
    finally:
        process.terminate()
        process.wait(timeout=30)
