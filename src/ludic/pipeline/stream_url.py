"""The `--redis-url` a pipeline process is given: its form (`check_url`, connecting to nothing),
whether Redis answers there at startup (`check_reachable`, redis-py only, before torch loads),
how it is shown in lines (`shown_url`, the password masked), and the refusals naming the URL and
the fix when it is not reached. It holds no stream and runs no pipeline command.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlparse

try:
    from redis.exceptions import AuthenticationError, BusyLoadingError, ResponseError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as e:  # an optional extra
    raise ImportError("the Redis pipeline needs redis-py: pip install 'ludic[redis]'") from e

from ludic.errors import LudicUsageError, Refusal
from ludic.pipeline.redis_memory import warn_if_evicting

FIRST_CONNECT_S = 5.0
"""How long the actor and the learner wait at startup for Redis (`check_reachable`, a
`SampleStream`'s first command): a `redis-server ... &` on the line above has time to listen."""


class RedisUnavailableError(Refusal, ConnectionError):
    """Redis stayed unreachable for longer than `give_up_after_s`."""


def check_reachable(url: str, *, within_s: float = FIRST_CONNECT_S, retry_s: float = 0.1) -> None:
    """PING Redis at `url` until it answers, for up to `within_s`; else raise the
    `RedisUnavailableError` a `SampleStream` raises when its first command never reaches Redis,
    naming the URL and the fix. Blocking and light (redis-py only): for a command to run before
    it imports torch, so that a Redis not started fails in seconds. A refused password fails at
    once."""
    import redis

    check_url(url)
    client = redis.Redis.from_url(url, socket_connect_timeout=within_s, socket_timeout=within_s)
    started = time.monotonic()
    try:
        while True:
            try:
                client.ping()
                warn_if_evicting(client, shown_url(url))  # a full Redis would drop samples
                return
            except (BusyLoadingError, ResponseError) as e:  # Redis answers (loading, or refusing
                if NO_DATABASE in str(e):  # PING itself): the commands that follow report
                    raise LudicUsageError(no_database(url, e)) from e  # their own errors,
                return  # but the database of the URL is chosen on connecting, before PING
            except (RedisConnectionError, RedisTimeoutError, OSError) as e:
                if isinstance(e, AuthenticationError):
                    raise RedisUnavailableError(not_reached(url, "PING", within_s, e)) from e
                if time.monotonic() - started + retry_s > within_s:
                    raise RedisUnavailableError(not_reached(url, "PING", within_s, e)) from e
                time.sleep(retry_s)
    finally:
        client.close()


NO_DATABASE = "DB index is out of range"
_SCHEMES = ("redis", "rediss", "unix")


def check_url(url: str) -> None:
    """Refuse a `--redis-url` that redis-py cannot parse (`http://...`, no scheme, a port that
    is not a number), naming the flag and the form it takes; connects to nothing."""
    example = "redis://HOST:PORT/DB, e.g. redis://127.0.0.1:6379/0"
    scheme = urlparse(url).scheme
    if scheme not in _SCHEMES:
        raise LudicUsageError(
            f"--redis-url {shown_url(url)!r} is not a Redis URL (scheme {scheme or 'missing'!r}; "
            f"it takes one of {', '.join(s + '://' for s in _SCHEMES)}): write it as {example}"
        )
    parts = urlparse(url)
    tail = url[len(f"{scheme}://{parts.netloc}") :]  # a unix socket's path may hold an '@'
    if scheme != "unix" and "@" in tail:  # a password's '/', '?' or '#' ended the host part
        raise LudicUsageError(
            f"--redis-url {scheme}://***@{url.rpartition('@')[2]!s} has an '@' past its host: "
            "percent-encode the password's '/', '?', '#', '@' and ':' (python -c \"import "
            "urllib.parse; print(urllib.parse.quote('PASSWORD', safe=''))\"), as in "
            "redis://:p%40ss%2Fword@127.0.0.1:6379/0"
        )
    try:
        urlparse(url).port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as e:
        raise LudicUsageError(
            f"--redis-url {shown_url(url)!r} is not a Redis URL ({e}): write it as {example}"
        ) from e


def no_database(url: str, error: Exception) -> str:
    from redis.connection import parse_url

    db = parse_url(url).get("db") or 0  # as redis-py reads it: ?db=N, else redis://.../N
    parts = urlparse(url)
    by_query = "db" in parse_qs(parts.query) or parts.scheme == "unix"
    where, example = (
        ("the db= of", "?db=0") if by_query else ("the number after the last / of", "/0")
    )
    return (
        f"redis at {shown_url(url)} has no database {db} ({error}): {where} --redis-url picks "
        "the database, 0 to 15 on a default Redis (`databases` in redis.conf); use one of those, "
        f"e.g. {example}"
    )


def shown_url(url: str) -> str:
    """`url` with its password replaced by `***`, for messages and logs."""
    parts = urlparse(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    return parts._replace(netloc=f"{user}***@{parts.netloc.rpartition('@')[2]}").geturl()


def not_reached(url: str, what: str, within_s: float, error: Exception) -> str:
    port = urlparse(url).port or 6379
    url = shown_url(url)
    if isinstance(error, AuthenticationError):
        return (
            f"redis at {url} refused the password/credentials in --redis-url ({what}: {error}): "
            "put Redis's password in the URL (redis://:PASSWORD@HOST:PORT/DB, or "
            "redis://USER:PASSWORD@... for an ACL user)"
        )
    return (
        f"redis at {url} unreachable since startup ({what} failed for {within_s:g}s: {error}). "
        f"Is Redis running there? Start it (e.g. `redis-server --port {port} --appendonly yes "
        "--appendfsync always`), or check --redis-url (host, port, database, password)"
    )
