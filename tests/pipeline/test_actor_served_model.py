"""`ludic actor --server-url ... --served-model NAME` asks every server's `/v1/models` once they
listen (`wait_for_servers` first: a server still loading is not refused) and refuses a name one
of them does not list in one line naming what it serves and --served-model, instead of failing
every episode with a 404; without the flag, the first server's model is checked against the
others, as the actor's `ServerPool` asks all of them for it."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

import pytest
from pipeline_fakes import RedisServer, redis_server

from app_server import serving_app, tiny_app, until
from ludic.cli import main as ludic_main
from ludic.pipeline.commands import run_actor
from ludic.pipeline.config import ActorConfig

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
__all__ = ["redis_server"]
FLAGS = (
    *("--env", "pipeline_fakes:CountOEnv", "--max-steps", "1", "--max-tokens", "4"),
    *("--problems-per-batch", "1", "--group-size", "2", "--batches", "1", "--stream", "s"),
)


@contextmanager
def serving(name: str, sock: socket.socket | None = None) -> Iterator[str]:
    """The embedded HTTP server over the tiny model, serving it as `name`, in a thread, on
    `sock` (bound already, so nothing listened there until now) or a fresh port; yields its
    base URL once it listens."""
    with tiny_app(name) as app, serving_app(app, sock) as url:
        yield url


def stream_length(redis: RedisServer) -> int:
    return int(redis.client().xlen("s"))  # type: ignore[arg-type]


def test_a_wrong_name_is_refused_once_the_late_server_is_up(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused until uvicorn
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    cfg = ActorConfig(
        redis_url=redis_server.url,
        server_url=(url + "/v1",),
        served_model="no-such-model",
        env="pipeline_fakes:CountOEnv",
        max_steps=1,
        max_tokens=4,
        problems_per_batch=1,
        group_size=2,
        batches=1,
        stream="s",
    )
    with (
        caplog.at_level(logging.INFO, logger="ludic.inference.http.server_wait"),
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        run = pool.submit(run_actor, cfg)
        waiting = f"waiting for the inference server at {url} to listen"
        until(lambda: waiting in caplog.text or run.done(), "the actor to wait for its server")
        assert not run.done(), f"ended before its server started: {run.exception()!r}"
        with serving("tiny", sock), pytest.raises(ValueError) as refused:
            run.result(timeout=240)
    assert str(refused.value) == (
        f"--served-model no-such-model: the server at {url}/v1/models serves tiny, not "
        "no-such-model; pass --served-model tiny or leave the flag out"
    )
    assert stream_length(redis_server) == 0  # no episode's samples reached the stream


@pytest.mark.parametrize("flag", [["--served-model", "tiny"], []], ids=["named", "unnamed"])
def test_every_server_is_asked_for_the_one_model_name(
    redis_server: RedisServer, flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with ExitStack() as servers:
        first = servers.enter_context(serving("tiny"))
        second = servers.enter_context(serving("other"))
        args = ["actor", "--redis-url", redis_server.url, "--server-url", first, second]
        with pytest.raises(SystemExit) as exit_info:
            ludic_main([*args, *flag, *FLAGS], report_refusals=True)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    refusal = [line for line in err.splitlines() if line.startswith("ludic actor:")]
    head = (
        "--served-model tiny"
        if flag
        else f"the model tiny (no --served-model: the one {first}/v1/models lists)"
    )
    assert refusal == [
        f"ludic actor: error: {head}: the server at {second}/v1/models serves other, not tiny; "
        "every --server-url gets the same model name: start them all serving one model, or "
        "pass --served-model with a name each of them lists"
    ], err
    assert stream_length(redis_server) == 0
