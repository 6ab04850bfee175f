"""AiohttpTransport (the HTTP client's default transport) against a raw socket server on
127.0.0.1: requests as httpx builds them, replies as httpx returns them, and httpx's exceptions
for each way a server can fail, which retries and hung-server handling depend on."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ludic.inference import ChatRequest
from ludic.inference.http.aiohttp_transport import AiohttpTransport
from ludic.inference.http.openai_client import OpenAICompatibleClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return head[0], headers, body


def reply(status: int, body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line, headers, body = await read_request(reader)
                seen = {"line": line, "headers": headers, "body": body.decode()}
                writer.write(reply(201, json.dumps(seen).encode(), "x-ludic-policy-version: 7\r\n"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server, url = await serve(handle)
    async with server:
        yield url


async def test_a_request_goes_out_and_its_reply_comes_back_as_httpx_builds_them(echo: str) -> None:
    async with httpx.AsyncClient(
        base_url=echo, headers={"Authorization": "Bearer k"}, transport=AiohttpTransport()
    ) as client:
        response = await client.post("/v1/completions", json={"prompt": [1, 2]})
        again = await client.get("/health")
    seen = response.json()
    assert response.status_code == 201 and response.headers["X-Ludic-Policy-Version"] == "7"
    assert seen["line"] == "POST /v1/completions HTTP/1.1"
    assert json.loads(seen["body"]) == {"prompt": [1, 2]}
    assert seen["headers"]["authorization"] == "Bearer k"
    assert seen["headers"]["content-type"] == "application/json"
    assert again.json()["line"] == "GET /health HTTP/1.1" and again.json()["body"] == ""


async def test_the_client_sends_through_aiohttp_unless_given_a_transport(echo: str) -> None:
    async with OpenAICompatibleClient(echo, "m") as client:
        assert isinstance(client._http._transport, AiohttpTransport)
        assert await client.healthy() is False  # 201 is not 200: the reply was read
    mock = httpx.MockTransport(lambda request: httpx.Response(200))
    async with OpenAICompatibleClient(echo, "m", transport=mock) as client:
        assert client._http._transport is mock and await client.healthy()


async def test_a_server_that_never_replies_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    server, url = await serve(silent)
    async with server, httpx.AsyncClient(transport=AiohttpTransport(), timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(url + "/v1/completions", json={})


async def test_a_connection_lost_mid_reply_is_a_transport_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(200, b'{"choices": [')[:-5])  # promised more than it sends
        await writer.drain()
        writer.close()

    server, url = await serve(cut)
    async with server, httpx.AsyncClient(transport=AiohttpTransport(), timeout=5) as client:
        with pytest.raises(httpx.TransportError) as caught:
            await client.post(url + "/v1/completions", json={})
    assert not isinstance(caught.value, httpx.TimeoutException)


async def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=5) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/health")


async def test_the_client_retries_a_lost_connection_then_names_the_failure() -> None:
    attempts: list[int] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        attempts.append(1)
        writer.close()  # no reply at all

    server, url = await serve(refuse)
    async with server, OpenAICompatibleClient(url, "m", max_retries=2, backoff_s=0.001) as client:
        with pytest.raises(ConnectionError, match="after 3 attempts"):
            await client.complete(ChatRequest(messages=[], prompt_token_ids=(1, 2)))
    assert attempts == [1, 1, 1]


class ThreadServer:
    """A raw HTTP/1.1 server on its own thread and event loop (so it runs while the test's loop
    is blocked, or between its loops), answering 200 with `body_for(request line)` (default:
    the request line). A connection idle for `idle_close_s` is closed as uvicorn does after
    5 s, at the worst moment: as the next request arrives on it (the close and the request
    cross on the wire), so the client cannot see it coming and the request gets no reply."""

    def __init__(
        self,
        idle_close_s: float = 60.0,
        body_for: Callable[[str], dict[str, Any]] = lambda line: {"line": line},
    ) -> None:
        self.idle_close_s = idle_close_s
        self.body_for = body_for
        self.lines: list[str] = []
        self.closed_idle = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        replied_at: float | None = None
        try:
            while True:
                line, _, _ = await read_request(reader)
                if replied_at is not None and time.monotonic() - replied_at >= self.idle_close_s:
                    self.closed_idle += 1
                    break
                self.lines.append(line)
                writer.write(reply(200, json.dumps(self.body_for(line)).encode()))
                await writer.drain()
                replied_at = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def __enter__(self) -> str:
        self.thread.start()
        start = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result(10)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def test_a_connection_the_server_closed_while_the_loop_was_busy_is_not_reused() -> None:
    """uvicorn (`ludic serve`) and vLLM close a connection idle for 5 s; a training step that
    holds the event loop longer must not leave the next requests on dead connections: the
    transport keeps idle connections 4 s. Here both times are tenfold shorter, in that ratio."""
    assert AiohttpTransport().keepalive_s < 5.0
    server = ThreadServer(idle_close_s=0.5)
    with server as url:
        transport = AiohttpTransport(keepalive_s=0.4)
        async with OpenAICompatibleClient(url, "m", max_retries=0, transport=transport) as client:
            await asyncio.gather(*(client._http.post("/x", json={}) for _ in range(4)))
            time.sleep(0.6)  # a step holding the loop past the server's idle limit
            replies = await asyncio.gather(*(client._post("/x", {}) for _ in range(4)))
    assert len(replies) == 4  # with no retry allowed: none met a closed connection
    assert server.closed_idle == 0 and len(server.lines) == 8


async def test_proxy_variables_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    with ThreadServer() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=10) as client:
            response = await client.get("http://inference.invalid:8000/health")
    assert response.status_code == 200
    assert response.json()["line"] == "GET http://inference.invalid:8000/health HTTP/1.1"


async def test_a_server_that_stops_reading_the_body_is_a_write_timeout() -> None:
    """httpx's `write` timeout: aiohttp has none, and starts its read timeout only once the body
    is sent, so without it a server that takes no more of a large body hung the request."""
    release = asyncio.Event()

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head, then never a byte of the body
        await release.wait()
        writer.close()

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited by its connections
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(deaf, sock=sock)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
    timeout = httpx.Timeout(60, write=0.2)
    async with server, httpx.AsyncClient(transport=AiohttpTransport(), timeout=timeout) as client:
        try:  # a guard, so that a missing write timeout fails instead of hanging
            with pytest.raises(httpx.WriteTimeout, match=r"write timeout of 0\.2 s"):
                await asyncio.wait_for(client.post(url, content=b"x" * (64 << 20)), 30)
        finally:
            release.set()


def test_a_client_used_again_after_its_event_loop_closed_opens_new_connections() -> None:
    """`asyncio.run` twice with one client (a notebook, a script): the second loop gets a
    session of its own instead of a refusal."""
    with ThreadServer() as url:
        client = OpenAICompatibleClient(url, "m", max_retries=0)
        first = asyncio.run(client._post("/x", {}))
        second = asyncio.run(client._post("/y", {}))

        async def close() -> None:
            await client.aclose()

        asyncio.run(close())
    assert first[0] == {"line": "POST /x HTTP/1.1"} and second[0] == {"line": "POST /y HTTP/1.1"}


def test_a_loop_running_in_another_thread_keeps_the_client_and_others_are_refused() -> None:
    transport = AiohttpTransport()

    async def get(url: str) -> int:
        return (await httpx.AsyncClient(transport=transport).get(url)).status_code

    server = ThreadServer()
    with server as url:  # the server's loop runs on its thread: the client is in use there
        assert asyncio.run_coroutine_threadsafe(get(url), server.loop).result(10) == 200
        with pytest.raises(RuntimeError, match="one event loop at a time"):
            asyncio.run(get(url))
        asyncio.run_coroutine_threadsafe(transport.aclose(), server.loop).result(10)


UNCLOSED_CLIENTS = """
import asyncio, gc, sys
from ludic.inference.http.openai_client import OpenAICompatibleClient

url = sys.argv[1]
kept = OpenAICompatibleClient(url, "m")
print(asyncio.run(kept.healthy()), asyncio.run(kept.healthy()))  # two loops, never closed


async def dropped() -> bool:
    client = OpenAICompatibleClient(url, "m")
    answer = await client.healthy()
    del client
    gc.collect()  # collected while its loop runs
    return answer


print(asyncio.run(dropped()))
"""


def test_clients_never_closed_print_nothing_at_exit() -> None:
    """aiohttp prints "Unclosed client session" (and "Unclosed connector") for a session that
    is collected unclosed; httpx's transport was silent, and scripts rarely close clients."""
    with ThreadServer() as url:
        done = subprocess.run(
            [sys.executable, "-c", UNCLOSED_CLIENTS, url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]
    assert "Unclosed" not in done.stderr, done.stderr


def fake_openai_server(line: str) -> dict[str, Any]:
    if "/v1/chat/completions" in line:
        return {"choices": [{"message": {"content": "no move"}, "finish_reason": "stop"}]}
    return {"data": [{"id": "fake"}]}  # /v1/models


def test_ludic_eval_against_a_server_prints_no_unclosed_warning(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "ludic"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    flags = ["--num-problems", "2", "--max-steps", "1", "--max-tokens", "4", "--no-progress"]
    with ThreadServer(body_for=fake_openai_server) as url:
        done = subprocess.run(
            [*command, "eval", "--env", "tictactoe", "--server-url", url, *flags],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "200"},
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "episodes" in done.stdout and "Unclosed" not in done.stderr, done.stderr
