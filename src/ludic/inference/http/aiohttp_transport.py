"""An httpx transport that sends through aiohttp: the HTTP client's default.

httpx's own async transport (httpcore over anyio) costs about 2.5 ms of CPU per request with 16
requests in flight on this project's CPUs, aiohttp about 0.3 ms (`bench/http_client.py`); a
GRPO step of 16 completions paid ~40 ms of the trainer's CPU for it. `OpenAICompatibleClient`
keeps httpx's API (a `transport=` of the caller's, `httpx.MockTransport` in tests, wins) and
sends through this transport unless given one.

What httpx's callers rely on holds here: the request's timeouts (`pool`: waiting for a free
connection, `connect`, and `read` as the longest wait for the next bytes of the reply), httpx's
exceptions, so retries and hung-server handling see `httpx.ConnectError`,
`httpx.ConnectTimeout`, `httpx.ReadTimeout`, `httpx.ReadError` (the connection lost mid-reply)
as with httpx's transport, the proxy variables (`HTTP(S)_PROXY`, `NO_PROXY`) and certifi's CA
bundle for https (unless `SSL_CERT_FILE` or `SSL_CERT_DIR` names another). An idle connection is
kept 4 s (`keepalive_s`), under the 5 s after which uvicorn (`ludic serve`) and vLLM close theirs:
a connection the server closed while this event loop was busy (a training step) is never reused.
The body is read whole (no streaming). One `aiohttp.ClientSession`, made at the first request in
the event loop that sends it: like `httpx.AsyncClient`, a transport serves one event loop;
another loop is refused by name rather than failing inside aiohttp.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any

import aiohttp
import certifi
import httpx

__all__ = ["AiohttpTransport"]


class AiohttpTransport(httpx.AsyncBaseTransport):
    """`httpx.AsyncClient(transport=AiohttpTransport())`: requests sent by aiohttp."""

    def __init__(self, *, limit: int = 100, keepalive_s: float = 4.0) -> None:
        self.limit = limit  # open connections, as httpx's default pool
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_for(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.limit, keepalive_timeout=self.keepalive_s, ssl=_ssl_context()
            )
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=True
            )
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError(
                "this HTTP client was first used in another event loop; an HTTP client serves "
                "one event loop: make one client per loop (per thread that runs a loop)"
            )
        return self._session

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
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            async with session.request(
                request.method,
                str(request.url),
                data=body or None,
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
        except aiohttp.ConnectionTimeoutError as e:  # before ServerTimeoutError: a subclass
            raise httpx.ConnectTimeout(str(e) or "connect timed out", request=request) from e
        except aiohttp.SocketTimeoutError as e:
            raise httpx.ReadTimeout(str(e) or "read timed out", request=request) from e
        except aiohttp.ClientConnectorError as e:
            raise httpx.ConnectError(str(e), request=request) from e
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as e:
            raise httpx.RemoteProtocolError(str(e) or type(e).__name__, request=request) from e
        except aiohttp.ClientOSError as e:
            raise httpx.ReadError(str(e), request=request) from e
        except aiohttp.ClientError as e:
            raise httpx.TransportError(f"{type(e).__name__}: {e}", request=request) from e

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


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
