"""Waiting at startup for the inference servers `--server-url` names: a `ludic serve` or vLLM
started just before the actor, learner, `ludic eval` or `ludic train` (as one script starts
them) loads its model for seconds to minutes before it listens. A connection nothing accepts,
or one dropped or left unanswered, counts as not up yet; any HTTP answer (even a 404 from a
server without `/health`) counts as up. A host name that does not resolve, a TLS failure (https:// to a plain-HTTP port)
or any other HTTP error fails at once. It checks neither the model nor the token (the commands
do, with their own errors, once it returns).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence

import httpx

logger = logging.getLogger(__name__)
SERVER_WAIT_S = 300.0
"""How long the actor, the learner, `ludic eval` and `ludic train` wait at startup for a server
to listen."""
LOG_EVERY_S = 30.0
_NOT_UP_YET = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.ReadTimeout,
)
"""What a server that is starting (or busy loading) can raise: nothing accepts yet, or it
accepts and drops or does not answer the request."""


def _fails_now(e: httpx.HTTPError, base: str) -> ValueError | None:
    """The error to raise at once for `e`, or None when `e` means the server is not up yet."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            why = "its host name does not resolve"
            break
        if isinstance(cause, ssl.SSLError):
            why = "TLS failed (https:// to a plain-HTTP server? use http://)"
            break
        cause = cause.__cause__ or cause.__context__
    else:
        if isinstance(e, _NOT_UP_YET):
            return None
        why = "the request failed"
    return ValueError(
        f"cannot reach the inference server at {base}: {why} ({type(e).__name__}: {e}); "
        "check --server-url"
    )


async def wait_for_servers(
    urls: Sequence[str],
    *,
    within_s: float = SERVER_WAIT_S,
    retry_s: float = 0.5,
    say: Callable[[str], None] | None = None,
) -> None:
    """Return once every server in `urls` accepts connections; say so while waiting (at once,
    then every `LOG_EVERY_S`: an INFO log line, or `say(line)` for a command that prints rather
    than logs), and after `within_s` raise a ValueError naming the server and the fix."""
    say = say or logger.info
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as http:
        for url in urls:
            base = url.rstrip("/").removesuffix("/v1")
            next_log = time.monotonic()
            while True:
                try:
                    await http.get(base + "/health")
                    break
                except httpx.HTTPError as e:
                    if (error := _fails_now(e, base)) is not None:
                        raise error from e
                    waited = time.monotonic() - started
                    if waited + retry_s > within_s:
                        raise ValueError(
                            f"nothing listens at {base} after {within_s:g}s ({type(e).__name__}: "
                            f"{e}): start the inference server there (`ludic serve --model DIR "
                            "--port PORT`, or vLLM) or check --server-url"
                        ) from e
                    if time.monotonic() >= next_log:
                        say(
                            f"waiting for the inference server at {base} to listen ({waited:.0f}s"
                            f" so far, up to {within_s:g}s): a server started just before is "
                            "still loading its model"
                        )
                        next_log += LOG_EVERY_S
                    await asyncio.sleep(retry_s)
