"""`ludic actor` and `ludic learner` started against a Redis URL where nothing listens fail in
seconds, naming the URL and the fix, instead of retrying quietly for `give_up_after_s` (600 s);
Redis is reached before any model loads. (Once connected they ride out a Redis restart:
`test_pipeline_processes.py::test_both_sides_survive_a_redis_restart`.)"""

from __future__ import annotations

import time

import pytest
from pipeline_fakes import free_port

from ludic.cli import main as ludic_main
from ludic.pipeline.commands import run_actor
from ludic.pipeline.config import ActorConfig
from ludic.pipeline.stream import RedisUnavailableError

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


def _url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # a free port: nothing listens there


def test_run_actor_fails_fast_without_redis() -> None:
    url = _url()
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError, match=f"redis at {url} unreachable since startup"):
        run_actor(ActorConfig(redis_url=url, batches=1))
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("command", ["actor", "learner"])
def test_the_command_names_the_url_and_the_fix(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _url()
    started = time.monotonic()
    with pytest.raises(SystemExit) as exit_:
        ludic_main(
            [command, "--redis-url", url, "--steps" if command == "learner" else "--batches", "1"],
            report_refusals=True,
        )
    assert time.monotonic() - started < 30
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"ludic {command}: error: redis at {url} unreachable since startup" in err
    port = url.rsplit(":", 1)[1].split("/")[0]  # the URL's own port, not Redis's default
    assert f"Is Redis running there? Start it (e.g. `redis-server --port {port} " in err
    assert "check --redis-url" in err and "Traceback" not in err
