"""`wait_for_servers`: a command started right after `ludic serve ... &` (`ludic actor`,
`ludic learner`, `ludic eval`, `ludic train`, as the README's pipeline script starts them)
waits for the server to listen instead of failing while it loads its model; a server that
never comes is named, with the fix, once the wait is over."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ludic.inference.http.server_wait import PollBudget, server_root

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Models(BaseHTTPRequestHandler):
    """Just enough of an OpenAI-compatible server: `/health` and `/v1/models`."""

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "late-model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_starts_late_is_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    from ludic.inference.http.server_wait import wait_for_servers

    port = free_port()

    async def scenario() -> None:
        task = asyncio.create_task(wait_for_servers([f"http://127.0.0.1:{port}/v1"], retry_s=0.05))
        while "waiting for the inference server" not in caplog.text:  # it found nothing there
            assert not task.done(), task.exception()
            await asyncio.sleep(0.05)
        server = ThreadingHTTPServer(("127.0.0.1", port), _Models)  # the server is up now
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            await task  # returns once the server answers
        finally:
            server.shutdown()
            server.server_close()

    with caplog.at_level(logging.INFO, logger="ludic.inference.http.server_wait"):
        asyncio.run(scenario())
    assert f"waiting for the inference server at http://127.0.0.1:{port} to listen" in caplog.text


def test_a_server_that_never_listens_is_named_with_the_fix() -> None:
    from ludic.inference.http.server_wait import wait_for_servers

    base = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=rf"^nothing listens at {base} after 0.3s \(Connect") as e:
        asyncio.run(wait_for_servers([base + "/v1"], within_s=0.3, retry_s=0.05))
    assert "start the inference server there (`ludic serve --model DIR" in str(e.value)
    assert "check --server-url" in str(e.value)


def test_a_host_name_that_does_not_resolve_fails_at_once() -> None:
    """A mistyped host is no server still loading: it fails long before the wait is over."""
    from ludic.inference.http.server_wait import wait_for_servers

    base = "http://no-such-host.invalid:8000"
    with pytest.raises(
        ValueError, match=rf"^cannot reach the inference server at {base}: its host"
    ):
        asyncio.run(wait_for_servers([base + "/v1"], within_s=20, retry_s=0.05))


def test_https_to_a_plain_http_server_fails_at_once() -> None:
    from ludic.inference.http.server_wait import wait_for_servers

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ValueError, match=r"TLS failed .* check --server-url$"):
            asyncio.run(wait_for_servers([base + "/v1"], within_s=20, retry_s=0.05))
    finally:
        server.shutdown()
        server.server_close()


def test_a_listener_that_drops_connections_counts_as_not_up_yet() -> None:
    """A server that accepts and closes (still starting) is waited for, then found once it answers."""
    from ludic.inference.http.server_wait import wait_for_servers

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    dropped = threading.Event()

    def accept_and_close() -> None:
        for _ in range(3):
            conn, _addr = listener.accept()
            conn.close()
        listener.close()
        dropped.set()

    threading.Thread(target=accept_and_close, daemon=True).start()

    async def scenario() -> None:
        task = asyncio.create_task(wait_for_servers([f"http://127.0.0.1:{port}/v1"], retry_s=0.05))
        while not dropped.is_set():
            assert not task.done(), task.exception()
            await asyncio.sleep(0.05)
        server = ThreadingHTTPServer(("127.0.0.1", port), _Models)  # answers from now on
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            await task
        finally:
            server.shutdown()
            server.server_close()

    asyncio.run(scenario())


@pytest.mark.parametrize("url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_the_server_root_drops_a_trailing_slash_and_v1(url: str) -> None:
    assert server_root(url) == "http://h:1"


def test_a_poll_budget_gives_up_when_the_next_try_would_come_after_the_wait() -> None:
    assert not PollBudget(within_s=60, retry_s=0.5).spent()  # a try in 0.5 s is within 60 s
    assert PollBudget(within_s=0.4, retry_s=0.5).spent()  # one in 0.5 s would be past 0.4 s
