"""ServerPool and a hung server that still answers `GET /health` (its HTTP layer is alive, its
engine is stuck): after a read timeout it stays down until it answers a real one-token
completion within `probe_timeout_s`, probed in the background, so it never takes (and stalls)
another call while hung; once it answers again it takes calls again. A real socket on
127.0.0.1 speaking just enough HTTP/1.1. Also `ServerPool.from_urls(timeout_s=...)`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from test_pool import REQUEST, FakeServer, _chat_body
from test_pool_timeout import READ_TIMEOUT_S, healthy_client

from ludic.inference.http.openai_client import InferenceTimeoutError, OpenAICompatibleClient
from ludic.inference.http.pool import ServerPool

PROBE_TIMEOUT_S = 0.2
RECHECK_S = 0.05


@dataclass
class HealthyButHung:
    """Answers `GET /health` with 200; a POST gets no reply while `hung`, else a chat body.
    Records the path of every POST."""

    hung: bool = True
    server: asyncio.Server | None = None
    posts: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                method, path = line.decode().split()[:2]
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                if method == "POST":
                    self.posts.append(path)
                    if self.hung:
                        await reader.read()  # until the client gives up and hangs up
                        return
                body = json.dumps({"status": "ok"} if method == "GET" else _chat_body(3))
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n{body}".encode()
                )
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def stuck() -> AsyncIterator[HealthyButHung]:
    srv = HealthyButHung()
    srv.server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    yield srv
    srv.server.close()


def _stuck_client(stuck: HealthyButHung) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(stuck.url, "tiny", timeout=READ_TIMEOUT_S, max_retries=0)


async def test_a_hung_server_that_answers_health_stays_down_until_it_answers_a_call(
    stuck: HealthyButHung,
) -> None:
    healthy = FakeServer("http://healthy", version=7)
    pool = ServerPool(
        [_stuck_client(stuck), healthy_client(healthy)],
        recheck_s=RECHECK_S,
        probe_timeout_s=PROBE_TIMEOUT_S,
    )
    assert await pool.servers[0].client.healthy()  # /health says ok throughout
    moved = await pool.complete(REQUEST)  # the tie goes to the hung one: it times out
    assert moved.extra["failed_over_from"] == [stuck.url]
    for _ in range(6):  # past recheck_s: it is probed, never handed a call
        await asyncio.sleep(RECHECK_S + PROBE_TIMEOUT_S)
        assert (await pool.complete(REQUEST)).extra["served_by"] == "http://healthy"
    assert stuck.posts.count("/v1/chat/completions") == 1  # no second call stalled on it
    assert "/v1/completions" in stuck.posts  # the one-token probes
    assert len(pool.failovers) == 1 and pool.stats()["servers"][stuck.url]["down"]
    stuck.hung = False  # its engine recovers: the next probe (a call starts it) brings it back
    served = []
    for _ in range(100):
        served.append((await pool.complete(REQUEST)).extra["served_by"])
        if stuck.url in served:
            break
        await asyncio.sleep(RECHECK_S)
    assert served[-1] == stuck.url and not pool.stats()["servers"][stuck.url]["down"]
    assert stuck.posts.count("/v1/chat/completions") == 2  # the second one answered
    await pool.aclose()


async def test_a_lone_hung_server_is_probed_not_handed_the_next_call(
    stuck: HealthyButHung,
) -> None:
    pool = ServerPool([_stuck_client(stuck)], recheck_s=RECHECK_S, probe_timeout_s=PROBE_TIMEOUT_S)
    with pytest.raises(InferenceTimeoutError):
        await pool.complete(REQUEST)
    await asyncio.sleep(RECHECK_S)
    with pytest.raises(InferenceTimeoutError, match="no inference server could take") as caught:
        await pool.complete(REQUEST)  # waits for the probe (bounded), then gives up
    assert stuck.url in str(caught.value) and "read timeout" in str(caught.value)
    assert stuck.posts == ["/v1/chat/completions", "/v1/completions"]
    stuck.hung = False
    await asyncio.sleep(RECHECK_S)
    assert (await pool.complete(REQUEST)).extra["served_by"] == stuck.url
    await pool.aclose()


async def test_from_urls_sets_the_read_timeout_and_refuses_a_bad_one() -> None:
    pool = ServerPool.from_urls(["http://a:1", "http://b:2"], "tiny", timeout_s=7.5)
    assert all(s.client._http.timeout.read == 7.5 for s in pool.servers)
    default = ServerPool.from_urls(["http://a:1"], "tiny")
    assert default.servers[0].client._http.timeout.read == 300.0  # the single client's
    alias = ServerPool.from_urls(["http://a:1"], "tiny", timeout=600)  # the client's name
    assert alias.servers[0].client._http.timeout.read == 600.0
    for made in (pool, default, alias):
        await made.aclose()
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        ServerPool.from_urls(["http://a:1"], "tiny", timeout_s=0)
    with pytest.raises(ValueError, match="probe_timeout_s must be > 0"):
        ServerPool([OpenAICompatibleClient("http://a:1", "tiny")], probe_timeout_s=0)
