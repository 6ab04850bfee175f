"""A `--redis-url` that is no Redis URL (`http://...`, no scheme, a port that is not a number) or
names a database Redis does not have (`/99`) is refused in one line naming the flag and the fix,
by the startup check and by a `SampleStream`, instead of redis-py's ValueError or ResponseError
with a traceback."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pipeline_fakes import REDIS_BINARY, RedisServer, redis_server

from ludic.errors import LudicUsageError, is_refusal
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.stream_url import check_reachable

pytestmark = pytest.mark.timeout(60)
__all__ = ["redis_server"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:6379/0", "scheme 'http'"),
        ("localhost:6379", "scheme 'localhost'"),
        ("127.0.0.1:6379/0", "scheme 'missing'"),
        ("redis://127.0.0.1:63x9/0", "Port could not be cast"),
    ],
)
def test_a_url_that_is_not_a_redis_url_is_refused(url: str, says: str) -> None:
    with pytest.raises(LudicUsageError) as e:
        check_reachable(url)
    assert str(e.value).startswith(f"--redis-url {url!r} is not a Redis URL (")
    assert says in str(e.value) and "redis://127.0.0.1:6379/0" in str(e.value)
    with pytest.raises(LudicUsageError, match="is not a Redis URL"):
        SampleStream(url)


def test_a_password_stays_hidden_in_the_refusal() -> None:
    with pytest.raises(LudicUsageError) as e:
        check_reachable("http://:secret@127.0.0.1:6379/0")
    assert "secret" not in str(e.value) and "***" in str(e.value)


@pytest.mark.redis
def test_a_database_redis_does_not_have_is_named(redis_server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/99"
    with pytest.raises(LudicUsageError) as e:
        check_reachable(url)
    assert is_refusal(e.value)
    assert str(e.value).startswith(f"redis at {url} has no database 99 (")
    assert "e.g. /0" in str(e.value)


@pytest.mark.redis
async def test_the_stream_names_a_database_redis_does_not_have(
    redis_server: RedisServer,
) -> None:
    stream = SampleStream(f"redis://127.0.0.1:{redis_server.port}/99", stream="s", group="g")
    try:
        with pytest.raises(LudicUsageError, match="has no database 99"):
            await stream.ensure_group()
    finally:
        await stream.aclose()


@pytest.mark.redis
def test_a_database_given_as_a_db_query_is_named(redis_server: RedisServer) -> None:
    """redis-py reads `?db=99` (over the path's number): the refusal names 99, not 0, and says
    where the URL picks it."""
    url = f"redis://127.0.0.1:{redis_server.port}?db=99"
    with pytest.raises(LudicUsageError) as e:
        check_reachable(url)
    assert str(e.value).startswith(f"redis at {url} has no database 99 (")
    assert "the db= of --redis-url" in str(e.value) and "e.g. ?db=0" in str(e.value)


@pytest.fixture
def redis_socket() -> Iterator[Path]:
    """A redis-server listening only on a unix socket (short path: sun_path holds ~100 bytes)."""
    if REDIS_BINARY is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="rs", dir="/tmp") as folder:
        sock = Path(folder) / "r.sock"
        cmd = [REDIS_BINARY, "--port", "0", "--unixsocket", str(sock), "--dir", folder]
        cmd += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = redis.Redis(unix_socket_path=str(sock), socket_connect_timeout=0.5)
            deadline = time.monotonic() + 20
            while True:  # until it answers
                try:
                    client.ping()
                    break
                except (redis.ConnectionError, redis.BusyLoadingError, FileNotFoundError):
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise
                    time.sleep(0.05)
            client.close()
            yield sock
        finally:
            process.terminate()
            process.wait(timeout=20)


@pytest.mark.redis
def test_a_database_of_a_unix_socket_url_is_named(redis_socket: Path) -> None:
    url = f"unix://{redis_socket}?db=99"
    with pytest.raises(LudicUsageError) as e:
        check_reachable(url)
    assert str(e.value).startswith(f"redis at {url} has no database 99 (")
    assert "e.g. ?db=0" in str(e.value)
    check_reachable(f"unix://{redis_socket}?db=3")  # one it has: reached


@pytest.mark.parametrize("password", ["p@ss/word", "s3cr#t", "a?b", "x:y/z"])
def test_a_password_needing_percent_encoding_is_refused_without_showing_it(password: str) -> None:
    """A '/', '?' or '#' in a raw password ends the URL's host part: redis-py connected to a
    host made of the password's tail, and the message showed that part of the password."""
    url = f"redis://:{password}@127.0.0.1:6379/0"
    with pytest.raises(LudicUsageError) as e:
        check_reachable(url)
    message = str(e.value)
    assert message.startswith("--redis-url redis://***@127.0.0.1:6379/0 has an '@' past its host")
    assert "percent-encode" in message and "urllib.parse.quote" in message
    assert password not in message


def test_a_unix_socket_path_with_an_at_sign_is_a_valid_url() -> None:
    # redis-py parses it (path /run/redis/redis@main.sock); only a host part ends at a password
    from ludic.pipeline.stream_url import check_url

    check_url("unix:///run/redis/redis@main.sock?db=0")
