"""Ctrl-C or SIGTERM stops `ludic serve` with requests in flight: the engine closes at the
first signal, so each request in flight ends with a 503 naming the closed engine (a streamed one
with an error event, then `[DONE]`) instead of the server generating every one to its end
before it exits (uvicorn's graceful shutdown waits for them, silently at its warning log
level: tens of seconds, or minutes on a real model, and for ever under SIGTERM when a client
never finishes reading; vLLM aborts its requests at once)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from ludic.models import tiny_model_dir

# Near the tiny model's whole context (2048) and past any end-of-sequence token: a request
# that ends without an error was generated to its end, which only an unstopped engine does.
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "ignore_eos": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(port: int, log: Path) -> subprocess.Popen[bytes]:
    args = ["serve", "--model", str(tiny_model_dir()), "--port", str(port), "--threads", "1"]
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ludic.cli", *args],
            stdout=out,
            stderr=out,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )


def _wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    while True:  # pytest-timeout bounds it
        assert process.poll() is None, f"ludic serve exited with {process.returncode}"
        try:
            if httpx.get(url + "/health", timeout=2).is_success:
                return
        except httpx.HTTPError:
            threading.Event().wait(0.2)


def _wait_in_engine(url: str, *, requests: int) -> None:
    """Returns once the engine holds `requests` requests (running or queued): the plain POST
    runs on a thread and, on a loaded machine, may reach the server well after the stream."""
    while True:  # pytest-timeout bounds it
        status = httpx.get(url + "/health", timeout=10).json()
        if status["active"] + status["pending"] >= requests:
            return
        threading.Event().wait(0.05)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_signal_ends_the_requests_in_flight(
    tmp_path: Path, stop: signal.Signals, code: int
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start(port, tmp_path / "serve.log")
    try:
        _wait_healthy(url, process)
        plain: dict[str, httpx.Response] = {}

        def post() -> None:
            plain["reply"] = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=600)

        waiter = threading.Thread(target=post)
        waiter.start()
        events: list[str] = []
        stream_body = {**BODY, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=stream_body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:  # the streamed one runs; signal once both do
                        _wait_in_engine(url, requests=2)
                        process.send_signal(stop)
        waiter.join()
        assert process.wait(timeout=600) == code

        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert "error" in last, f"generated to its end after the signal: {last}"
        assert last["error"]["code"] == 503, last
        assert "closed" in last["error"]["message"]
        reply = plain["reply"]
        assert reply.status_code == 503, reply.text
        assert "closed" in reply.json()["error"]["message"]
        log = (tmp_path / "serve.log").read_text()
        assert "Traceback" not in log, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
