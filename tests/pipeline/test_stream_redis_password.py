"""A Redis that refuses the password in `--redis-url` is named as such, at once, by the startup
check (`check_reachable`) and by a `SampleStream`'s first command, instead of being reported as
"unreachable ... Is Redis running there?" after the wait; and the startup check waits as long
as the stream does, so a `redis-server ... &` started on the line above has time to listen."""

from __future__ import annotations

import inspect
import socket
import threading
from collections.abc import Iterator

import pytest

from ludic.pipeline.stream import SampleStream
from ludic.pipeline.stream_url import RedisUnavailableError, check_reachable, shown_url

pytestmark = pytest.mark.timeout(60)


class _WrongPassRedis:
    """Answers every command, AUTH first, with Redis's WRONGPASS error; counts connections."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _addr = self.listener.accept()
            except OSError:  # closed
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        with conn:
            while conn.recv(65536):
                conn.sendall(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")


@pytest.fixture
def wrong_pass_redis() -> Iterator[_WrongPassRedis]:
    server = _WrongPassRedis()
    yield server
    server.listener.close()


def test_the_startup_check_waits_as_long_as_the_stream() -> None:
    check_wait = inspect.signature(check_reachable).parameters["within_s"].default
    assert check_wait == inspect.signature(SampleStream).parameters["first_connect_s"].default


def test_the_startup_check_names_a_refused_password(wrong_pass_redis: _WrongPassRedis) -> None:
    url = f"redis://:wrong@127.0.0.1:{wrong_pass_redis.port}/0"
    with pytest.raises(RedisUnavailableError) as e:
        check_reachable(url)
    shown = f"redis://:***@127.0.0.1:{wrong_pass_redis.port}/0"  # no password in messages
    assert str(e.value).startswith(
        f"redis at {shown} refused the password/credentials in --redis-url (PING: "
    )
    assert "wrong" not in str(e.value)
    assert "Is Redis running there?" not in str(e.value)
    assert wrong_pass_redis.connections == 1  # no retries: waiting does not fix a password


async def test_the_stream_names_a_refused_password(wrong_pass_redis: _WrongPassRedis) -> None:
    url = f"redis://:wrong@127.0.0.1:{wrong_pass_redis.port}/0"
    stream = SampleStream(url, stream="s", group="g")
    try:
        with pytest.raises(RedisUnavailableError, match="refused the password/credentials") as e:
            await stream.ensure_group()
    finally:
        await stream.aclose()
    assert "Is Redis running there?" not in str(e.value)
    assert stream.reconnect_attempts == 0


def test_a_url_is_shown_without_its_password() -> None:
    assert shown_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert shown_url("redis://alice:s3cret@host/1") == "redis://alice:***@host/1"
    assert shown_url("redis://host:6379/0") == "redis://host:6379/0"
    assert shown_url("redis://alice@host:6379/0") == "redis://alice@host:6379/0"
