"""LocalServer: `ludic serve` in a child process answers completions with the token it was
given (never on the command line), stops on close, says why when it cannot start, and stops
itself when the process that started it dies without closing it (`kill -9`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.http.local_server import LocalServer
from ludic.inference.http.openai_client import OpenAICompatibleClient
from ludic.models import tiny_model_dir


def test_a_folder_without_a_model_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not a model directory.*save_model"):
        LocalServer(tmp_path)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        LocalServer(tiny_model_dir(), threads=0)


def test_url_before_start_says_to_start_it() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        _ = LocalServer(tiny_model_dir()).url


@pytest.mark.slow
def test_a_server_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    server = LocalServer(tmp_path, startup_timeout_s=120)
    with pytest.raises(RuntimeError, match="exited with code") as caught:
        server.start()
    assert "no-such-architecture" in str(caught.value)  # the child's own error, from its log
    assert server.process is None
    assert not server.log_path.exists()  # its own temporary log is gone once closed


@pytest.fixture(scope="module")
def thread_started() -> Iterator[LocalServer]:
    """One server for the tests that only talk to it (each start costs seconds), started
    from a thread that then ends, used as a `with` block: the block's end stops it."""
    server = LocalServer(tiny_model_dir(), threads=1, served_model_name="tiny")
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
    process = server.process
    with server:  # already started: entering does not start another
        assert server.process is process
        yield server
    assert process is not None and process.poll() is not None  # stopped when the block ended
    server.close()  # twice is fine


@pytest.mark.slow
def test_serves_completions_and_weight_control_with_its_token_then_stops(
    thread_started: LocalServer,
) -> None:
    """(The stop, at the end of its `with` block: the fixture's teardown.)"""
    server = thread_started
    process = server.process
    assert process is not None
    assert server.token not in " ".join(map(str, process.args))  # not visible in `ps`
    models = httpx.get(server.url + "/v1/models", timeout=30).json()
    assert [card["id"] for card in models["data"]] == ["tiny"]
    auth = {"Authorization": f"Bearer {server.token}"}
    assert httpx.get(server.url + "/ludic/version", headers=auth, timeout=30).json() == {
        "policy_version": 0
    }
    wrong = {"Authorization": "Bearer wrong"}
    assert httpx.get(server.url + "/ludic/version", headers=wrong, timeout=30).is_error

    async def ask() -> list[int]:
        client = OpenAICompatibleClient(server.url, model="tiny")
        try:
            request = ChatRequest(
                messages=[{"role": "user", "content": "hi"}],
                sampling=SamplingConfig(max_tokens=5, extras={"ignore_eos": True}),
            )
            return list((await client.complete(request)).completion_token_ids)
        finally:
            await client.aclose()

    assert len(asyncio.run(ask())) == 5


@pytest.mark.slow
def test_a_taken_port_fails_with_the_childs_error_not_the_other_servers_url(
    thread_started: LocalServer,
) -> None:
    """The port already serves another `ludic serve` (healthy, another token): the child cannot
    bind it and exits, and start() says so instead of returning the other server's URL."""
    other = thread_started
    taken = LocalServer(tiny_model_dir(), threads=1, port=other.port, startup_timeout_s=120)
    with pytest.raises(RuntimeError, match=rf"exited with code.*port {other.port} is taken") as e:
        taken.start()
    assert "address already in use" in str(e.value).lower()  # the child's own log tail
    assert taken.process is None
    auth = {"Authorization": f"Bearer {other.token}"}  # the other server is untouched
    assert httpx.get(other.url + "/ludic/version", headers=auth, timeout=30).status_code == 200


@pytest.mark.slow
def test_launch_wait_ready_kill_and_restart_on_a_fixed_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = tmp_path / "serve.log"
    server = LocalServer(tiny_model_dir(), threads=1, port=port, log_path=log)
    try:
        first = server.launch().wait_ready().process
        assert first is not None and server.url == f"http://127.0.0.1:{port}"
        server.kill()
        assert first.poll() == -signal.SIGKILL and server.process is None  # no shutdown
        assert log.exists()  # kill keeps the log
        with pytest.raises(RuntimeError, match="call launch"):
            server.wait_ready()
        server.start()  # a fresh process on the same port
        assert server.process is not None and server.process is not first
        auth = {"Authorization": f"Bearer {server.token}"}
        assert httpx.get(server.url + "/ludic/version", headers=auth, timeout=30).is_success
    finally:
        server.close()


PARENT = """
import sys, time
from ludic.inference.http.local_server import LocalServer
server = LocalServer(sys.argv[1], threads=1, log_path=sys.argv[3])
server.start() if sys.argv[2] == "serving" else server.launch()
print(server.process.pid, server.port, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """True when no process `pid` is left (or only a zombie no one waits on)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("stage", ["serving", "starting"])
def test_a_parent_killed_with_sigkill_leaves_no_server(tmp_path: Path, stage: str) -> None:
    """`kill -9` on the process holding a LocalServer, once it serves or while it still loads
    (the child's watch starts after the parent is gone): the child stops within seconds."""
    log = tmp_path / "serve.log"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tiny_model_dir()), stage, str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line, f"the parent exited with {parent.wait()} before starting the server"
    pid, port = map(int, line.split())
    try:
        assert not _gone(pid)
        if stage == "serving":
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).is_success
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(pid), f"the server (pid {pid}) outlived its parent; log:\n{log.read_text()}"
        if stage == "serving":
            assert "is gone; stopping" in log.read_text()
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_server_started_from_a_thread_outlives_that_thread(thread_started: LocalServer) -> None:
    """The child watches the parent *process*: the thread that started it ending (which would
    fire Linux's PR_SET_PDEATHSIG) does not stop it."""
    server = thread_started
    assert server.process is not None
    time.sleep(2.0)  # several of the child's parent checks
    assert server.process.poll() is None
    assert httpx.get(server.url + "/v1/models", timeout=30).is_success
