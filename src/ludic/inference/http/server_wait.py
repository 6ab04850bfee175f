"""Waiting at startup for the inference servers `--server-url` names: a `ludic serve` or vLLM
started just before the actor, learner, `ludic eval` or `ludic train` (as one script starts
them) loads its model for seconds to minutes before it listens. A connection nothing accepts,
or one dropped or left unanswered, counts as not up yet; any HTTP answer (even a 404 from a
server without `/health`) counts as up. A host name that does not resolve, a TLS failure
(https:// to a plain-HTTP port) or any other HTTP error fails at once. It checks neither the
model nor the token (the commands do, with their own errors, once it returns).
`wait_for_servers_blocking` is the same wait for a caller that cannot await
(`make_inference(..., wait_s=...)`, which prints its waiting lines to stderr and names its
`server_url=` argument in its errors: `say=`, `setting=`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
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


def server_root(url: str) -> str:
    """A server's own URL (where its `/health` is) from one as given: without a trailing `/`
    or an OpenAI base URL's `/v1`."""
    return url.rstrip("/").removesuffix("/v1")


class PollBudget:
    """How long a caller keeps trying a server that may not be up yet, from its creation:
    tries `retry_s` apart (the caller sleeps between them), the first at once, until the next
    would come after `within_s`. `wait_for_servers` and `health.wait_for_health` both poll by
    it."""

    def __init__(self, within_s: float, retry_s: float) -> None:
        self.within_s = within_s
        self.retry_s = retry_s
        self.started = time.monotonic()

    def waited(self) -> float:
        """Seconds since the wait began."""
        return time.monotonic() - self.started

    def spent(self) -> bool:
        """After a failed try: whether to give up (a try `retry_s` from now is past the wait)."""
        return self.waited() + self.retry_s > self.within_s


def _fails_now(e: httpx.HTTPError, base: str, setting: str) -> ValueError | None:
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
        f"check {setting}"
    )


async def wait_for_servers(
    urls: Sequence[str],
    *,
    within_s: float = SERVER_WAIT_S,
    retry_s: float = 0.5,
    say: Callable[[str], None] | None = None,
    setting: str = "--server-url",
    wait_setting: str | None = None,
) -> None:
    """Return once every server in `urls` accepts connections; say so while waiting (at once,
    then every `LOG_EVERY_S`: an INFO log line, or `say(line)` for a command that prints rather
    than logs), and after `within_s` raise a ValueError naming the server and the fix: check
    `setting`, where the caller's user gave the URLs (a flag, or a Python argument), or raise
    `wait_setting` (where the caller has one) for a server that takes longer to start. Errors
    that waiting cannot mend (a host name that does not resolve, TLS) name `setting` alone."""
    say = say or logger.info
    budget = PollBudget(within_s, retry_s)  # one wait for all the servers
    async with httpx.AsyncClient(timeout=30) as http:
        for url in urls:
            base = server_root(url)
            next_log = time.monotonic()
            while True:
                try:
                    await http.get(base + "/health")
                    break
                except httpx.HTTPError as e:
                    if (error := _fails_now(e, base, setting)) is not None:
                        raise error from e
                    waited = budget.waited()
                    if budget.spent():
                        raise ValueError(
                            f"nothing listens at {base} after {within_s:g}s ({type(e).__name__}: "
                            f"{e}): start the inference server there (`ludic serve --model DIR "
                            f"--port PORT`, or vLLM) or check {setting}"
                            + (
                                f", or raise {wait_setting} for a server that takes longer to start"
                                if wait_setting
                                else ""
                            )
                        ) from e
                    if time.monotonic() >= next_log:
                        say(
                            f"waiting for the inference server at {base} to listen ({waited:.0f}s"
                            f" so far, up to {within_s:g}s): a server started just before is "
                            "still loading its model"
                        )
                        next_log += LOG_EVERY_S
                    await asyncio.sleep(retry_s)


def wait_for_servers_blocking(
    urls: Sequence[str],
    *,
    within_s: float = SERVER_WAIT_S,
    retry_s: float = 0.5,
    say: Callable[[str], None] | None = None,
    setting: str = "--server-url",
) -> None:
    """`wait_for_servers` for a caller that cannot await it: a plain function, also one called
    inside a running event loop (as `make_inference` is), which it blocks meanwhile. The wait
    runs on a daemon thread with its own event loop, so an interrupt (Ctrl-C) of the caller
    is not held up by it; its error is raised here."""
    failed: list[BaseException] = []
    done = threading.Event()

    def wait() -> None:
        try:
            waiting = wait_for_servers(
                urls, within_s=within_s, retry_s=retry_s, say=say, setting=setting
            )
            asyncio.run(waiting)
        except BaseException as e:  # raised in the caller's thread below
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=wait, name="ludic-server-wait", daemon=True).start()
    done.wait()
    if failed:
        raise failed[0]
