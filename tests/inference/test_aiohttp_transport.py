"""AiohttpTransport (the HTTP client's default transport) against a raw socket server on
127.0.0.1: requests as httpx builds them, replies as httpx returns them, and httpx's exceptions
for each way a server can fail, which retries and hung-server handling depend on."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

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


def test_a_second_event_loop_is_refused_by_name() -> None:
    transport = AiohttpTransport()

    async def once(url: str) -> int:
        client = httpx.AsyncClient(transport=transport)
        return (await client.get(url)).status_code

    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(200, b"{}"))
        await writer.drain()

    loop = asyncio.new_event_loop()
    try:
        server, url = loop.run_until_complete(serve(ok))
        assert loop.run_until_complete(once(url)) == 200
        other = asyncio.new_event_loop()
        try:
            with pytest.raises(RuntimeError, match="one event loop"):
                other.run_until_complete(once(url))
        finally:
            other.close()
        loop.run_until_complete(transport.aclose())
        server.close()
    finally:
        loop.close()


class ThreadServer:
    """A raw HTTP/1.1 server on its own thread and event loop (so it runs while the test's loop
    is blocked), answering 200 with the request line, and closing a connection idle for
    `idle_close_s` as uvicorn does after 5 s."""

    def __init__(self, idle_close_s: float = 60.0) -> None:
        self.idle_close_s = idle_close_s
        self.lines: list[str] = []
        self.closed_idle = 0
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line, _, _ = await asyncio.wait_for(read_request(reader), self.idle_close_s)
                except TimeoutError:
                    self.closed_idle += 1
                    break
                self.lines.append(line)
                writer.write(reply(200, json.dumps({"line": line}).encode()))
                await writer.drain()
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
    holds the event loop longer must not leave the next requests on dead connections."""
    with ThreadServer(idle_close_s=5.0) as url:
        async with OpenAICompatibleClient(url, "m", max_retries=0) as client:
            await asyncio.gather(*(client._http.post("/x", json={}) for _ in range(4)))
            time.sleep(5.5)  # a step holding the loop: the server closes the idle connections
            replies = await asyncio.gather(*(client._post("/x", {}) for _ in range(4)))
    assert len(replies) == 4  # with no retry allowed: none met a closed connection


async def test_proxy_variables_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    with ThreadServer() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=10) as client:
            response = await client.get("http://inference.invalid:8000/health")
    assert response.status_code == 200
    assert response.json()["line"] == "GET http://inference.invalid:8000/health HTTP/1.1"
