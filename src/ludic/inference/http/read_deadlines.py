"""Read deadlines for `ludic serve`: a connection whose request head has not arrived
`header_timeout_s` after the connection opened (or after the first byte following its previous
reply) is closed, a request whose body stalls is answered 408 and its connection closed, and a
reply its client stops reading for `body_timeout_s` is abandoned (the connection dropped, a
stream's request cancelled). uvicorn bounds none of these (its keep-alive timeout runs only
between requests, until the first byte), so clients that open connections and trickle a byte
every few seconds (slowloris), declare a Content-Length and never send it, or never read a
long reply, held the server's file descriptors until good clients were refused. A client
that closes its sending side before its reply, or in the middle of its request, is told so
(a 400) as the connection closes, where uvicorn closed it silently; a request that is not
HTTP/1.1 gets a 400 naming what the parser found (uvicorn said only "Invalid HTTP request
received.").

The body's deadline grows with what arrives (mod_reqtimeout's rule): it may take
`body_timeout_s` plus 1 s per `BODY_MIN_RATE` bytes received, counting only the time the
server waits for it, so a large weight upload over a slow link still lands while a trickle
does not hold a connection for long. It does not bound how long a reply takes to generate,
nor the number of connections, nor does it apply to websockets (the server serves none).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar, cast

import httptools
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ludic.inference.http.openai_protocol import error_body

__all__ = ["BODY_MIN_RATE", "guard_reads"]

BODY_MIN_RATE = 64 * 1024
"""Bytes of body that extend its deadline by one second."""
_Peer = tuple[str, int]


def guard_reads(
    app: ASGIApp, *, header_timeout_s: float, body_timeout_s: float
) -> tuple[ASGIApp, type[asyncio.Protocol]]:
    """`app` wrapped to time request bodies and replies, and the HTTP protocol class to give
    uvicorn (`uvicorn.run(app, http=protocol, proxy_headers=False)`) that times request heads
    (and drops the connection of a reply not read); both are needed. The app also applies
    uvicorn's proxy-header rewrite of the client address (`X-Forwarded-For` from a trusted
    local proxy), inside the bounds: they find a request's connection by the peer address the
    socket gives, so uvicorn's own rewrite (`proxy_headers=True`, outside them) would hide it
    and the head timer would cut a proxied request at `header_timeout_s`."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    for flag, value in (("header", header_timeout_s), ("body", body_timeout_s)):
        if not 0 < value < float("inf"):
            raise ValueError(f"{flag}_timeout_s must be a positive number of seconds, got {value}")
    watch = _Watch(header_timeout_s)

    class Protocol(_TimedHead):
        _watch: ClassVar[_Watch] = watch

    proxied = ProxyHeadersMiddleware(app)  # type: ignore[arg-type]
    return _TimedBody(proxied, watch, body_timeout_s), Protocol  # type: ignore[arg-type]


class _Watch:
    """The connections of one server by peer address (what an ASGI scope's "client" says), so
    the ASGI side can tell the protocol side when a request starts and ends."""

    def __init__(self, header_timeout_s: float) -> None:
        self.header_timeout_s = header_timeout_s
        self.connections: dict[_Peer, _TimedHead] = {}

    def find(self, client: Any) -> _TimedHead | None:
        if not isinstance(client, (list, tuple)) or len(client) < 2:
            return None
        return self.connections.get((str(client[0]), int(client[1])))


class _TimedHead(asyncio.Protocol):
    """uvicorn's HTTP protocol, and a timer that closes the connection when no request head
    has arrived `header_timeout_s` after it opened, or after the first byte that follows a
    reply (an idle kept-alive connection is uvicorn's to close, at its keep-alive timeout,
    which clients expect): with a 408 when part of a head came (a slow client learns why),
    silently when nothing did."""

    _watch: ClassVar[_Watch]

    def __init__(self, **uvicorn_args: Any) -> None:
        self.inner = AutoHTTPProtocol(**uvicorn_args)  # type: ignore[call-arg]
        if isinstance(getattr(self.inner, "parser", None), httptools.HttpRequestParser):
            self.parser = _ReasonedParser(self.inner.parser)  # type: ignore[attr-defined]
            self.inner.parser = self.parser  # type: ignore[attr-defined]
            self.inner.send_400_response = self._refuse_malformed  # type: ignore[attr-defined]
        self.transport: asyncio.Transport | None = None
        self.peer: _Peer | None = None
        self.in_flight = 0  # requests whose app is running (pipelined ones queue after)
        self.awaiting_head = False
        self.head_bytes = 0  # bytes received while awaiting a head
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.inner.connection_made(self.transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, (list, tuple)) and len(peer) >= 2:  # TCP: uvicorn's scope client
            self.peer = (str(peer[0]), int(peer[1]))
            self._watch.connections[self.peer] = self
            self.awaiting_head = True
            self._start_timer()  # nothing else bounds a connection that never sends a byte

    def data_received(self, data: bytes) -> None:
        if self.awaiting_head:
            self.head_bytes += len(data)
            if self.timer is None:
                self._start_timer()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        """The client sent its FIN. A closed socket sends the same as one only shut for
        sending (`shutdown(SHUT_WR)`), so the connection closes as uvicorn closes it and a
        request in flight is cancelled (its client is taken as gone); a client that still
        reads first gets a 400 saying so, or that its request was cut off, not silence."""
        why = self._cut_short()
        if why is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.write(_error_response(400, "Bad Request", why))
        return self.inner.eof_received()

    def _cut_short(self) -> str | None:
        """Why the request on this connection cannot be answered now that its client sent
        its FIN, or None when nothing is waiting for a reply (or one has begun)."""
        cycle = getattr(self.inner, "cycle", None)  # uvicorn's request being handled
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:
                return None
            if cycle.more_body:
                return (
                    "the request body ended early: the client closed its sending side before "
                    "the body's Content-Length (or a chunked body's last chunk) arrived; send "
                    "the whole body"
                )
            return (
                "the client closed its sending side (shutdown(SHUT_WR)) before its reply: the "
                "server takes that as the client gone (a closed socket sends the same) and "
                "cancels its request; keep the connection open until the reply arrives"
            )
        if self.awaiting_head and self.head_bytes:
            return (
                "the request head ended early: the client closed its sending side before the "
                "blank line that ends a head; send the whole request"
            )
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self.peer is not None and self._watch.connections.get(self.peer) is self:
            del self._watch.connections[self.peer]
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def request_started(self) -> None:
        self.in_flight += 1
        self.awaiting_head = False
        self._stop_timer()

    def request_ended(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:  # the timer starts at the next byte
            self.awaiting_head, self.head_bytes = True, 0

    def _refuse_malformed(self, _: str) -> None:
        """uvicorn's answer to a request that is not HTTP, as it answers it (400, close), with
        httptools' reason: uvicorn said 'Invalid HTTP request received.' of every one."""
        reason = self.parser.reason or "unreadable"
        if self.transport is not None:
            self.transport.write(
                _error_response(
                    400,
                    "Bad Request",
                    f"the request is not valid HTTP/1.1 ({reason}); send a well-formed request",
                )
            )
            self.transport.close()

    def _start_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self._watch.header_timeout_s, self._head_late)

    def abandon(self) -> None:
        """Drop the connection at once, unsent bytes and all (`close()` would wait for a
        client that does not read to take them)."""
        if self.transport is not None:
            self.transport.abort()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_late(self) -> None:
        self.timer = None
        transport = self.transport
        if transport is None or transport.is_closing() or not self.awaiting_head:
            return
        if self.head_bytes:
            seconds = self._watch.header_timeout_s
            transport.write(
                _error_response(
                    408,
                    "Request Timeout",
                    f"the request head did not arrive within {seconds:g} s; send it at once "
                    "(raise the server's --header-timeout for a slower client)",
                )
            )
        transport.close()


class _ReasonedParser:
    """uvicorn's httptools request parser, keeping the reason of the error that stops it."""

    def __init__(self, parser: httptools.HttpRequestParser) -> None:
        self.parser, self.reason = parser, ""

    def feed_data(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.reason = str(e)  # "Invalid character in chunk size", ...
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


class _TimedBody:
    """Times each wait for request body bytes against the body's allowance (`body_timeout_s`
    plus 1 s per `BODY_MIN_RATE` bytes received); past it, the app sees the client as gone
    (`http.disconnect`) and the client gets a 408 and a closed connection instead of the
    app's reply. A reply whose client reads none of it for `body_timeout_s` (each send
    waits while the connection's buffer is full) drops the connection. Also tells the
    connection's head timer when a request starts and ends."""

    def __init__(self, app: ASGIApp, watch: _Watch, body_timeout_s: float) -> None:
        self.app, self.watch, self.body_timeout_s = app, watch, body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        connection = self.watch.find(scope.get("client"))
        if connection is not None:
            connection.request_started()
        try:
            await self._timed(scope, receive, send, connection)
        finally:
            if connection is not None:
                connection.request_ended()

    async def _timed(
        self, scope: Scope, receive: Receive, send: Send, connection: _TimedHead | None
    ) -> None:
        loop = asyncio.get_running_loop()
        waited = received = 0.0
        complete = stalled = replying = False

        async def timed_receive() -> Message:
            nonlocal waited, received, complete, stalled
            if stalled:
                return {"type": "http.disconnect"}
            if complete:  # the body is in: what comes next is the end (untimed)
                return await receive()
            allowance = self.body_timeout_s + received / BODY_MIN_RATE
            began = loop.time()
            try:
                async with asyncio.timeout(allowance - waited):
                    message = await receive()
            except TimeoutError:
                stalled = True
                return {"type": "http.disconnect"}
            waited += loop.time() - began
            received += len(message.get("body", b""))
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal replying
            if stalled:
                return  # the app's reply to a body that never came: the 408 replaces it
            replying = replying or message["type"] == "http.response.start"
            if connection is None:  # served without the protocol: nothing to drop
                await send(message)
                return
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    await send(message)
            except TimeoutError:  # the client stopped reading: later sends go nowhere
                connection.abandon()

        try:
            await self.app(scope, timed_receive, guarded_send)
        except Exception:
            if not stalled:
                raise
        if stalled and not replying:
            await self._refuse(send, int(received))

    async def _refuse(self, send: Send, received: int) -> None:
        seconds = self.body_timeout_s
        message = (
            f"the request body stopped arriving ({received} bytes came; each {BODY_MIN_RATE} "
            f"bytes allow 1 s more than {seconds:g} s); send it at once (raise the server's "
            "--body-timeout for a slower client)"
        )
        body = json.dumps(error_body(408, message)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # uvicorn closes it after the reply
        ]
        await send({"type": "http.response.start", "status": 408, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _error_response(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP reply carrying `error_body(status, message)`, closing the connection."""
    body = json.dumps(error_body(status, message)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
