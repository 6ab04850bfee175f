"""ServerPool over three scripted OpenAI-compatible servers (httpx MockTransport): calls go to
the least busy server, a conversation stays on its server, a dead server's calls move to
another (recorded), it comes back after a health check, and each response keeps the policy
version of the server that produced it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import httpx
import pytest

from ludic.inference.client import ChatRequest
from ludic.inference.http.affinity import conversation
from ludic.inference.http.openai_client import (
    InferenceRequestError,
    InferenceUnavailableError,
    OpenAICompatibleClient,
)
from ludic.inference.http.pool import ServerPool

REQUEST = ChatRequest(messages=[{"role": "user", "content": "hi"}])


@dataclass
class FakeServer:
    """One server: answers chat calls with its policy version, optionally after a gate."""

    url: str
    version: int
    down: bool = False
    refuse: bool = False
    gate: asyncio.Event | None = None
    calls: int = 0
    health_checks: int = 0
    seen: list[str] = field(default_factory=list)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("Connection refused (test: server down)", request=request)
        if request.url.path == "/health":
            self.health_checks += 1
            return httpx.Response(200, json={"status": "ok"})
        if self.refuse:
            return httpx.Response(400, json={"error": {"message": "prompt too long"}})
        self.calls += 1
        self.seen.append(json.loads(request.content)["messages"][-1]["content"])
        if self.gate is not None:
            await self.gate.wait()
        return httpx.Response(200, json=_chat_body(self.version))


def _chat_body(version: int) -> dict[str, object]:
    choice = {
        "message": {"content": "ok"},
        "finish_reason": "stop",
        "token_ids": [7, 8],
        "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]},
    }
    return {"choices": [choice], "prompt_token_ids": [1, 2, 3], "policy_version": version}


def _pool(servers: list[FakeServer], **kwargs: float) -> ServerPool:
    clients = [
        OpenAICompatibleClient(
            s.url,
            "tiny",
            max_retries=0,
            transport=httpx.MockTransport(s.handle),
        )
        for s in servers
    ]
    return ServerPool(clients, **kwargs)


def _servers(n: int = 3) -> list[FakeServer]:
    return [FakeServer(f"http://s{i}", version=10 + i) for i in range(n)]


async def test_calls_go_to_the_least_busy_server() -> None:
    servers = _servers()
    servers[0].gate = asyncio.Event()  # s0 holds its calls
    pool = _pool(servers)
    held = [asyncio.create_task(pool.complete(REQUEST)) for _ in range(2)]
    for _ in range(500):  # until both calls are in flight
        if sum(s.calls for s in servers) == 2:
            break
        await asyncio.sleep(0.01)
    assert sum(s.calls for s in servers) == 2 and servers[0].calls == 1  # on two servers
    free = [await pool.complete(REQUEST) for _ in range(4)]  # s0 is busy: never chosen
    assert servers[0].calls == 1 and servers[1].calls + servers[2].calls == 5
    assert {r.extra["served_by"] for r in free} == {"http://s1", "http://s2"}
    servers[0].gate.set()
    await asyncio.gather(*held)
    await pool.aclose()


async def test_a_conversation_stays_on_its_server_even_when_it_is_busier() -> None:
    servers = _servers()
    pool = _pool(servers)

    async def episode(name: str, turns: int) -> set[str]:
        with conversation(name):
            return {(await pool.complete(REQUEST)).extra["served_by"] for _ in range(turns)}

    used = await asyncio.gather(*(episode(f"ep{i}", 4) for i in range(6)))
    assert all(len(u) == 1 for u in used)  # each episode on one server
    assert len(set().union(*used)) == 3  # episodes spread over all three
    # calls outside a conversation are kept together with nothing: they take turns
    alone = {(await pool.complete(REQUEST)).extra["served_by"] for _ in range(3)}
    assert len(alone) == 3
    await pool.aclose()


async def test_a_dead_servers_calls_move_and_it_comes_back_after_a_health_check() -> None:
    servers = _servers()
    pool = _pool(servers, recheck_s=0.2)
    with conversation("episode"):
        first = await pool.complete(REQUEST)
        home = next(s for s in servers if s.url == first.extra["served_by"])
        home.down = True  # its process died between two turns
        moved = await pool.complete(REQUEST)
        assert moved.extra["served_by"] != home.url
        assert moved.extra["failed_over_from"] == [home.url]
        assert moved.to_info()["failed_over_from"] == [home.url]  # lands in the step info
        assert moved.policy_version == next(
            s.version for s in servers if s.url == moved.extra["served_by"]
        )
        again = await pool.complete(REQUEST)  # the episode stays where it moved
        assert again.extra["served_by"] == moved.extra["served_by"]
        assert "failed_over_from" not in again.extra
    assert len(pool.failovers) == 1 and pool.failovers[0].from_url == home.url
    assert pool.stats()["servers"][home.url]["down"]
    before = home.calls
    for _ in range(6):  # not tried while down
        await pool.complete(REQUEST)
    assert home.calls == before and pool.failovers[-1].from_url == home.url
    home.down = False  # restarted
    await asyncio.sleep(0.25)
    await asyncio.gather(*(pool.complete(REQUEST) for _ in range(6)))
    assert home.health_checks >= 1 and home.calls > before
    assert not pool.stats()["servers"][home.url]["down"]
    await pool.aclose()


async def test_every_server_down_says_which_and_why() -> None:
    servers = _servers(2)
    for s in servers:
        s.down = True
    pool = _pool(servers)
    with pytest.raises(InferenceUnavailableError, match=r"http://s0: .*refused.*http://s1"):
        await pool.complete(REQUEST)
    await pool.aclose()


async def test_a_refused_call_is_not_retried_elsewhere() -> None:
    servers = _servers()
    for s in servers:
        s.refuse = True
    pool = _pool(servers)
    with pytest.raises(InferenceRequestError, match="prompt too long"):
        await pool.complete(REQUEST)
    assert pool.failovers == [] and not any(v["down"] for v in pool.stats()["servers"].values())
    await pool.aclose()


def test_bad_pools_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ServerPool([])
    with pytest.raises(ValueError, match="given twice"):
        ServerPool.from_urls(["http://a", "http://a/v1"], "m")
