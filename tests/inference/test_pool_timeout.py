"""ServerPool and a hung server: a server that accepts a call and never replies (a real socket
on 127.0.0.1, so the client's own read timeout fires) is marked down and the call moves once to
a healthy server; each server sees the request once, and the hung one sees its connection
closed (so `ludic serve` cancels the request). With one server the timeout surfaces as the
client's own `InferenceTimeoutError`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from test_pool import REQUEST, FakeServer

from ludic.inference.http.affinity import conversation
from ludic.inference.http.openai_client import (
    InferenceTimeoutError,
    InferenceUnavailableError,
    OpenAICompatibleClient,
)
from ludic.inference.http.pool import ServerPool

READ_TIMEOUT_S = 0.3


@dataclass
class HungServer:
    """Reads each request and never answers; records request lines and closed connections."""

    server: asyncio.Server | None = None
    requests: list[str] = field(default_factory=list)
    closed: int = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                if line.startswith((b"POST ", b"GET ")):
                    self.requests.append(line.decode().split()[1])
            self.closed += 1  # the client dropped the connection
        finally:
            writer.close()


@pytest.fixture
async def hung() -> AsyncIterator[HungServer]:
    srv = HungServer()
    srv.server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    yield srv
    srv.server.close()


def hung_client(hung: HungServer) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(hung.url, "tiny", timeout=READ_TIMEOUT_S, max_retries=3)


def healthy_client(fake: FakeServer) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(
        fake.url, "tiny", max_retries=3, transport=httpx.MockTransport(fake.handle)
    )


async def wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def test_a_hung_server_is_marked_down_and_its_call_moves_once(hung: HungServer) -> None:
    healthy = FakeServer("http://healthy", version=7)
    pool = ServerPool([hung_client(hung), healthy_client(healthy)], recheck_s=60)
    with conversation("episode"):  # the hung server takes the first call (the tie goes to it)
        moved = await pool.complete(REQUEST)
        assert moved.text == "ok" and moved.policy_version == 7
        assert moved.extra["served_by"] == "http://healthy"
        assert moved.extra["failed_over_from"] == [hung.url]
        again = await pool.complete(REQUEST)  # the episode stays where it moved
        assert (
            again.extra["served_by"] == "http://healthy" and "failed_over_from" not in again.extra
        )
    for _ in range(3):  # calls of their own skip the down server
        assert (await pool.complete(REQUEST)).extra["served_by"] == "http://healthy"
    assert hung.requests == ["/v1/chat/completions"]  # sent once: a read timeout is not resent
    assert healthy.calls == 5  # the moved call once, then the four others
    stats = pool.stats()
    assert stats["failovers"] == 1 and len(pool.failovers) == 1
    down = stats["servers"][hung.url]
    assert down["down"] and down["requests"] == 1 and down["in_flight"] == 0
    assert "InferenceTimeoutError" in down["last_error"] and "read timeout" in down["last_error"]
    await wait_for(lambda: hung.closed == 1)  # the client hung up: the server can cancel it
    await pool.aclose()


async def test_one_hung_server_surfaces_the_clients_timeout(hung: HungServer) -> None:
    pool = ServerPool([hung_client(hung)], recheck_s=60)
    with pytest.raises(InferenceTimeoutError) as raised:
        await pool.complete(REQUEST)
    message = str(raised.value)
    assert hung.url in message and "read timeout of 0.3 s" in message
    assert "OpenAICompatibleClient(timeout=...)" in message
    assert hung.requests == ["/v1/chat/completions"]
    assert pool.stats()["servers"][hung.url]["down"] and pool.failovers == []
    await pool.aclose()


async def test_hung_and_dead_servers_name_each_problem(hung: HungServer) -> None:
    dead = FakeServer("http://dead", version=1, down=True)
    pool = ServerPool([hung_client(hung), healthy_client(dead)], recheck_s=60)
    with pytest.raises(InferenceUnavailableError) as raised:
        await pool.complete(REQUEST)
    message = str(raised.value)
    assert "InferenceTimeoutError" in message and hung.url in message
    assert "http://dead" in message and "refused" in message
    assert hung.requests == ["/v1/chat/completions"]
    await pool.aclose()


async def test_every_server_hung_is_a_timeout_naming_each() -> None:
    servers = [HungServer(), HungServer()]
    for srv in servers:
        srv.server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    pool = ServerPool([hung_client(s) for s in servers], recheck_s=60)
    with pytest.raises(InferenceTimeoutError, match="no inference server could take the call"):
        await pool.complete(REQUEST)
    assert [s.requests for s in servers] == [["/v1/chat/completions"]] * 2
    await pool.aclose()
    for srv in servers:
        assert srv.server is not None
        srv.server.close()
