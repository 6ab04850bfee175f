"""wait_for_health: a server counts as up only when it answers `/health` and, given a token,
`/ludic/version` with that token, and only while the awaited process still runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI, Header, HTTPException

from ludic.inference.http.health import ServerExited, wait_for_health

TOKEN = "right-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def other_server() -> Iterator[str]:
    """A server that is healthy and guards `/ludic/version` with TOKEN (as `ludic serve` does)."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ludic/version")
    async def version(authorization: str | None = Header(default=None)) -> dict[str, int]:
        if authorization != f"Bearer {TOKEN}":
            raise HTTPException(401, "wrong token")
        return {"policy_version": 0}

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_health(f"http://127.0.0.1:{port}", timeout_s=30, poll_s=0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_health_alone_or_with_the_right_token_counts_as_up(other_server: str) -> None:
    wait_for_health(other_server + "/v1", timeout_s=10, poll_s=0.05)
    wait_for_health(other_server, timeout_s=10, token=TOKEN, poll_s=0.05)


def test_a_server_that_refuses_our_token_is_not_ours(other_server: str) -> None:
    with pytest.raises(TimeoutError, match="did not report healthy"):
        wait_for_health(other_server, timeout_s=1, token="our-token", poll_s=0.05)


def test_a_healthy_port_does_not_count_once_our_process_exited(other_server: str) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with pytest.raises(ServerExited, match="exited with code 3") as caught:
        wait_for_health(other_server, timeout_s=30, process=dead, token=TOKEN, poll_s=0.05)
    assert caught.value.returncode == 3


def test_nothing_listening_times_out() -> None:
    with pytest.raises(TimeoutError, match="within 1s"):
        wait_for_health(f"http://127.0.0.1:{_free_port()}", timeout_s=1, poll_s=0.05)
