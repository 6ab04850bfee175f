"""A request that came through a local reverse proxy (`X-Forwarded-For`, trusted from
127.0.0.1) is served past the head bound, and the app still sees the forwarded client: the
proxy-header rewrite runs inside `guard_reads`, which finds a request's connection by the
socket's peer address (uvicorn's own rewrite, outside it, hid that and the head timer answered
a 408 mid-request)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.responses import PlainTextResponse

from ludic.inference.http.read_deadlines import guard_reads

SLOWER_THAN_THE_BOUND_S = 1.5
clients: list[Any] = []


async def _slow_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    clients.append(scope["client"])
    await asyncio.sleep(SLOWER_THAN_THE_BOUND_S)  # a long generation: longer than the head bound
    await PlainTextResponse("done")(scope, receive, send)


@pytest.fixture
def url() -> Iterator[str]:
    app, protocol = guard_reads(_slow_app, header_timeout_s=0.5, body_timeout_s=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=protocol, proxy_headers=False, log_level="error", lifespan="off"
    )  # as `ludic serve` runs it
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            thread.join(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.mark.parametrize("headers", [{}, {"X-Forwarded-For": "10.1.2.3"}])
def test_a_proxied_request_outlives_the_head_bound(url: str, headers: dict[str, str]) -> None:
    clients.clear()
    reply = httpx.get(url, headers=headers, timeout=30)
    assert (reply.status_code, reply.text) == (200, "done")
    seen = clients[0][0]
    assert seen == headers.get("X-Forwarded-For", "127.0.0.1")  # the proxy's client, as before
