"""`ServerPool`: one `ChatClient` over several OpenAI-compatible servers serving the same policy.

A call goes to the server with the fewest requests in flight (ties in turn), except that every
call of one conversation (`ludic.inference.http.affinity.conversation`; the RolloutEngine opens
one per episode) stays on the server that took its first call, where its prefix is cached. A server that
cannot be reached, keeps failing with 5xx or sends no reply within the client's read timeout (a
hung server; it cancels the request when the client drops the connection) is marked down and the
call is sent once to another one at once; the conversation moves there, the response records it (`extra["failed_over_from"]`)
and the pool counts it (`stats()`). A down server is asked `GET /health` again after
`recheck_s` before it takes calls again; one that timed out (a hung server may still answer
`/health`) must instead answer a real one-token completion within `probe_timeout_s`, probed
in the background while other servers take the calls (a call waits for the probe only when
no other server is up), so a hung server stalls at most the one call that found it hung.
Each response keeps the policy version of the server
that produced it. It does not publish weights (`BroadcastPolicyPublisher` does, to the same
URLs) and it never retries a call the server refused (4xx). With no server left, a call every
server timed out raises `InferenceTimeoutError` (the one server's own, with one server), any
other failure `InferenceUnavailableError` naming each server's problem.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.http.affinity import current_conversation
from ludic.inference.http.openai_client import (
    InferenceTimeoutError,
    InferenceUnavailableError,
    OpenAICompatibleClient,
)

logger = logging.getLogger(__name__)

_MAX_PINNED = 65_536  # conversations remembered (oldest forgotten first)


@dataclass(slots=True)
class _Server:
    client: OpenAICompatibleClient
    in_flight: int = 0
    requests: int = 0
    down_since: float | None = None
    last_error: str | None = None
    timed_out: bool = False  # down for a read timeout: back only once a real request answers
    probe: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return self.client.base_url


@dataclass(frozen=True, kw_only=True, slots=True)
class Failover:
    """A call moved off a server that failed it."""

    from_url: str
    to_url: str
    reason: str
    at: float = field(default_factory=time.time)


class ServerPool:
    """A ChatClient over `clients` (one per server). `recheck_s`: how long a down server waits
    before a check may bring it back; `probe_timeout_s`: how long a server that timed out has
    to answer a one-token completion to come back. Build it inside the event loop that uses
    it."""

    def __init__(
        self,
        clients: Sequence[OpenAICompatibleClient],
        *,
        recheck_s: float = 2.0,
        probe_timeout_s: float = 10.0,
    ):
        if not clients:
            raise ValueError("ServerPool needs at least one server")
        urls = [c.base_url for c in clients]
        if len(set(urls)) != len(urls):
            raise ValueError(f"a server URL is given twice: {urls}")
        if probe_timeout_s <= 0:
            raise ValueError(f"probe_timeout_s must be > 0, got {probe_timeout_s}")
        self.servers = [_Server(client) for client in clients]
        self.recheck_s = recheck_s
        self.probe_timeout_s = probe_timeout_s
        self.failovers: list[Failover] = []
        self._turn = itertools.count()
        self._pinned: collections.OrderedDict[Hashable, _Server] = collections.OrderedDict()

    @classmethod
    def from_urls(
        cls,
        urls: Sequence[str],
        model: str,
        *,
        api_key: str | None = None,
        max_retries: int = 1,
        recheck_s: float = 2.0,
        timeout_s: float = 300.0,
        probe_timeout_s: float = 10.0,
        **client_kwargs: Any,
    ) -> ServerPool:
        """A pool of `OpenAICompatibleClient`s; each retries a failed call `max_retries`
        times before the pool moves it to another server. `timeout_s` (the client's
        `timeout`, also accepted under that name): how long a call may wait for its reply
        before its server counts as hung (marked down, the call moved once to another server;
        a timed-out call is never resent to the same one). The default is the single client's
        300 s, so a long generation on a loaded CPU server is not cut off; lower it when a hung
        server should be left sooner, keeping it above your longest generation."""
        if "timeout" in client_kwargs:  # the client's own name for it
            timeout_s = float(client_kwargs.pop("timeout"))
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        clients = [
            OpenAICompatibleClient(
                url,
                model,
                api_key=api_key,
                max_retries=max_retries,
                timeout=timeout_s,
                **client_kwargs,
            )
            for url in urls
        ]
        return cls(clients, recheck_s=recheck_s, probe_timeout_s=probe_timeout_s)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        tried: list[_Server] = []
        errors: list[Exception] = []
        failed_over: list[Failover] = []
        while True:
            server = await self._choose(exclude=tried)
            if server is None:
                down = [s for s in self.servers if s.down_since is not None]
                raise _none_left(tried or down, errors)
            self._pin(server)
            try:
                response = await self._call(server, request)
            except (InferenceUnavailableError, InferenceTimeoutError, httpx.TransportError) as e:
                tried.append(server)
                errors.append(e)
                self._mark_down(server, e)
                continue
            finally:
                server.in_flight -= 1
            if tried:
                failed_over = [
                    Failover(from_url=s.url, to_url=server.url, reason=s.last_error or "")
                    for s in tried
                ]
                self.failovers += failed_over
                for move in failed_over:
                    logger.warning(
                        "inference server %s failed (%s): call moved to %s",
                        move.from_url,
                        move.reason,
                        move.to_url,
                    )
            return _recorded(response, server, failed_over)

    async def _call(self, server: _Server, request: ChatRequest) -> ChatResponse:
        server.in_flight += 1
        server.requests += 1
        return await server.client.complete(request)

    async def _choose(self, *, exclude: list[_Server]) -> _Server | None:
        pinned = self._pinned_server()
        if pinned is not None and pinned not in exclude and await self._usable(pinned):
            return pinned
        candidates = [s for s in self.servers if s not in exclude and await self._usable(s)]
        probes = {s.probe for s in self.servers if s not in exclude and s.probe is not None}
        if not candidates and probes:  # nothing else is up: wait for the probes (bounded)
            await asyncio.wait(probes)
            candidates = [s for s in self.servers if s not in exclude and s.down_since is None]
        if not candidates:
            return None
        turn = next(self._turn)
        return min(
            candidates,
            key=lambda s: (s.in_flight, (self.servers.index(s) - turn) % len(self.servers)),
        )

    async def _usable(self, server: _Server) -> bool:
        """Up, or down long enough ago and healthy now (a `GET /health`). A server that timed
        out is not: a probe starts in the background (`_probe`) and brings it back."""
        if server.down_since is None:
            return True
        if server.probe is not None or time.monotonic() - server.down_since < self.recheck_s:
            return False
        if server.timed_out:
            server.probe = asyncio.create_task(self._probe(server))
            return False
        if await server.client.healthy():
            logger.info("inference server %s is back", server.url)
            server.down_since, server.last_error = None, None
            return True
        server.down_since = time.monotonic()
        return False

    async def _probe(self, server: _Server) -> None:
        """Bring a server that timed out back once it answers a one-token completion within
        `probe_timeout_s`; else it stays down (probed again after `recheck_s`)."""
        try:
            why = await server.client.answers(self.probe_timeout_s)
        finally:
            server.probe = None
        if why is None:
            logger.info("inference server %s answers again", server.url)
            server.down_since, server.last_error, server.timed_out = None, None, False
        else:
            logger.info("inference server %s stays down: %s", server.url, why)
            server.down_since = time.monotonic()

    def _mark_down(self, server: _Server, error: Exception) -> None:
        server.down_since = time.monotonic()
        server.last_error = f"{type(error).__name__}: {error}"
        server.timed_out = server.timed_out or isinstance(error, InferenceTimeoutError)

    def _pinned_server(self) -> _Server | None:
        key = current_conversation()
        return None if key is None else self._pinned.get(key)

    def _pin(self, server: _Server) -> None:
        key = current_conversation()
        if key is None:  # a call of its own: nothing to keep together
            return
        self._pinned[key] = server
        self._pinned.move_to_end(key)
        while len(self._pinned) > _MAX_PINNED:
            self._pinned.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        """Per server: calls sent, in flight, down or up (and why); failovers so far."""
        return {
            "servers": {
                s.url: {
                    "requests": s.requests,
                    "in_flight": s.in_flight,
                    "down": s.down_since is not None,
                    "last_error": s.last_error,
                }
                for s in self.servers
            },
            "failovers": len(self.failovers),
        }

    async def aclose(self) -> None:
        for server in self.servers:
            if server.probe is not None:
                server.probe.cancel()
            await server.client.aclose()

    async def __aenter__(self) -> ServerPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _none_left(servers: list[_Server], errors: list[Exception]) -> Exception:
    """The error for a call no server could take (`servers`: those it tried, or else those
    down): a lone server's timeout as it was, every server timing out as a timeout, anything
    else as unavailable, naming each server's problem."""
    if len(errors) == 1 and isinstance(errors[0], InferenceTimeoutError):
        return errors[0]
    problems = "; ".join(f"{s.url}: {s.last_error}" for s in servers) or "none up"
    message = f"no inference server could take the call ({problems})"
    timed_out = all(isinstance(e, InferenceTimeoutError) for e in errors)
    if (errors and timed_out) or (not errors and servers and all(s.timed_out for s in servers)):
        return InferenceTimeoutError(message)
    return InferenceUnavailableError(message)


def _recorded(response: ChatResponse, server: _Server, moves: list[Failover]) -> ChatResponse:
    extra = {**response.extra, "served_by": server.url}
    if moves:
        extra["failed_over_from"] = [m.from_url for m in moves]
    return dataclasses.replace(response, extra=extra)
