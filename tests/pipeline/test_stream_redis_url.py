"""A `--redis-url` that is no Redis URL (`http://...`, no scheme, a port that is not a number) or
names a database Redis does not have (`/99`) is refused in one line naming the flag and the fix,
by the startup check and by a `SampleStream`, instead of redis-py's ValueError or ResponseError
with a traceback."""

from __future__ import annotations

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.errors import LudicUsageError, is_refusal
from ludic.pipeline.stream import SampleStream, check_reachable

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
