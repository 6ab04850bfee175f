"""An httpx transport that sends through aiohttp: the HTTP client's default.

httpx's own async transport (httpcore over anyio) costs about 2.5 ms of CPU per request with 16
requests in flight on this project's CPUs, aiohttp about 0.3 ms (`bench/http_client.py`); a
GRPO step of 16 completions paid ~40 ms of the trainer's CPU for it. `OpenAICompatibleClient`
keeps httpx's API (a `transport=` of the caller's, `httpx.MockTransport` in tests, wins) and
sends through this transport unless given one.

What httpx's callers rely on holds here: the request's timeouts (`pool`: waiting for a free
connection, `connect`, `write` as the longest wait to hand the next 64 KiB of the request body
to the OS, and `read` as the longest wait for the next bytes of the reply), httpx's exceptions,
so retries and hung-server handling see `httpx.ConnectError`, `httpx.ConnectTimeout`,
`httpx.WriteTimeout`, `httpx.ReadTimeout`, `httpx.ReadError` (the connection lost mid-reply) as
with httpx's transport, the proxy variables (`HTTP(S)_PROXY`, `NO_PROXY`) and certifi's CA
bundle for https (unless `SSL_CERT_FILE` or `SSL_CERT_DIR` names another). An idle connection is
kept 4 s (`keepalive_s`), under the 5 s after which uvicorn (`ludic serve`) and vLLM close theirs:
a connection the server closed while this event loop was busy (a training step) is never reused.
The body is read whole (no streaming).

One `aiohttp.ClientSession` per event loop, made at the first request in that loop: a client
used again from a new loop (`asyncio.run` twice) drops the old loop's connections and opens new
ones; one used from two threads' loops at once is refused by name. A client never closed is
cleaned up quietly when it is garbage-collected or the interpreter exits (aiohttp would print
"Unclosed client session"); `aclose()` is still the way to close it at a known point.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import weakref
from typing import Any

import aiohttp
import certifi
import httpx

__all__ = ["AiohttpTransport"]

# How much of a request body one `write` timeout covers (httpcore times each socket send
# alike): aiohttp's writer waits for the OS only once it holds more than this.
_PIECE = 64 * 1024


class AiohttpTransport(httpx.AsyncBaseTransport):
    """`httpx.AsyncClient(transport=AiohttpTransport())`: requests sent by aiohttp."""

    def __init__(self, *, limit: int = 100, keepalive_s: float = 4.0) -> None:
        self.limit = limit  # open connections, as httpx's default pool
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._quiet_close: weakref.finalize[Any, Any] | None = None

    def _session_for(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        session = self._session
        if session is not None and loop is self._loop and not session.closed:
            return session
        if session is not None:
            assert self._loop is not None
            if not session.closed and self._loop.is_running():
                raise RuntimeError(
                    "this HTTP client is in use in an event loop running in another thread; "
                    "an HTTP client serves one event loop at a time: make one client per thread "
                    "that runs a loop"
                )
            self._drop_session()  # its loop is closed or idle: its connections are of no use
        connector = aiohttp.TCPConnector(
            limit=self.limit, keepalive_timeout=self.keepalive_s, ssl=_ssl_context()
        )
        session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=True
        )
        self._session, self._loop = session, loop
        self._quiet_close = weakref.finalize(self, _close_quietly, session)
        return session

    def _drop_session(self) -> None:
        if self._quiet_close is not None:
            self._quiet_close()  # runs once: a later finalize (exit, collection) does nothing
        self._session = self._quiet_close = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session_for(asyncio.get_running_loop())
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=timeouts.get("pool"),  # aiohttp's: a free connection from the pool
            sock_connect=timeouts.get("connect"),
            sock_read=timeouts.get("read"),
        )
        body = await request.aread()
        data = _TimedBody(body, timeouts.get("write")) if body else None
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            async with session.request(
                request.method,
                str(request.url),
                data=data,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            ) as reply:
                content = await reply.read()
                return httpx.Response(
                    reply.status,
                    headers=_plain_headers(reply.raw_headers),
                    content=content,
                    request=request,
                )
        except (aiohttp.ClientError, TimeoutError) as e:
            if data is not None and data.timed_out:
                raise httpx.WriteTimeout(
                    f"the server took none of the next {_PIECE} bytes of the request body "
                    f"within the write timeout of {data.write_s} s",
                    request=request,
                ) from e
            if not isinstance(e, aiohttp.ClientError):
                raise
            raise _httpx_error(e, request) from e

    async def aclose(self) -> None:
        session, loop = self._session, self._loop
        if session is not None and loop is asyncio.get_running_loop():
            if self._quiet_close is not None:
                self._quiet_close.detach()
            self._session = self._quiet_close = None
            await session.close()
        else:  # never used, or used in another loop (closed by now, likely)
            self._drop_session()


def _close_quietly(session: aiohttp.ClientSession) -> None:
    """Close `session` without its event loop (exit, garbage collection, a loop that ended):
    aiohttp's connector closes its sockets synchronously (`_close`; `close()` needs the loop),
    and a closed session or connector prints no "Unclosed" warning when collected."""
    connector = session.connector
    close = getattr(connector, "_close", None)  # private: an aiohttp without it warns, as before
    if connector is not None and not connector.closed and close is not None:
        close()


class _TimedBody(aiohttp.Payload):
    """A request body handed to the OS `_PIECE` bytes at a time, each within `write_s`
    seconds (httpx's `write` timeout; None: no limit). `timed_out` says a piece was not.
    Bytes in memory, written without holding the event loop (hence not `BytesPayload`, which
    warns about large bodies that it writes in one go)."""

    _autoclose = True  # nothing to release

    def __init__(self, body: bytes, write_s: float | None) -> None:
        super().__init__(body)
        self._size = len(body)
        self.write_s = write_s
        self.timed_out = False

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._value).decode(encoding, errors)

    async def write(self, writer: Any) -> None:  # aiohttp < 3.12 calls this one
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        body = memoryview(self._value)[:content_length]
        try:
            for start in range(0, len(body), _PIECE):
                async with asyncio.timeout(self.write_s):
                    await writer.write(body[start : start + _PIECE])
                    await writer.drain()
        except TimeoutError:
            self.timed_out = True
            raise


def _httpx_error(e: aiohttp.ClientError, request: httpx.Request) -> httpx.TransportError:
    """httpx's exception for what aiohttp raised, as httpx's own transport would raise it."""
    if isinstance(e, aiohttp.ConnectionTimeoutError):  # before SocketTimeoutError's base
        return httpx.ConnectTimeout(str(e) or "connect timed out", request=request)
    if isinstance(e, aiohttp.SocketTimeoutError):
        return httpx.ReadTimeout(str(e) or "read timed out", request=request)
    if isinstance(e, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(e), request=request)
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return httpx.RemoteProtocolError(str(e) or type(e).__name__, request=request)
    if isinstance(e, aiohttp.ClientOSError):
        return httpx.ReadError(str(e), request=request)
    return httpx.TransportError(f"{type(e).__name__}: {e}", request=request)


def _ssl_context() -> ssl.SSLContext:
    """httpx's default: certifi's CA bundle, unless the environment names CAs of its own."""
    if os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


_BODY_FRAMING = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})


def _plain_headers(raw: Any) -> list[tuple[bytes, bytes]]:
    """The reply's headers as sent, minus how the body was framed on the wire (aiohttp has
    already decoded it: httpx must not try again)."""
    return [(k, v) for k, v in raw if k.lower() not in _BODY_FRAMING]
