"""The actor's line naming the run id it stamps says where that id comes from: "the same for every
actor started with this run's flags" only for its flags' run id, never after --run-id (which
replaces it for every actor given that --run-id, whatever their flags)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.pipeline.commands import actor_run_id, run_actor
from ludic.pipeline.config import ActorConfig

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
__all__ = ["redis_server"]

SAME = "the same for every actor started with this run's flags"


def _config(url: str, **changes: object) -> ActorConfig:
    base = ActorConfig(
        redis_url=url,
        stream="s",
        env="tictactoe",
        env_kwargs='{"opponent": "random"}',
        problems_per_batch=1,
        group_size=2,
        max_steps=1,
        max_tokens=6,
        batches=1,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _run_line(caplog: pytest.LogCaptureFixture) -> str:
    [line] = [r.getMessage() for r in caplog.records if "stamps its samples" in r.getMessage()]
    caplog.clear()
    return line


def test_the_run_id_line_says_a_run_id_is_the_flags_only_where_it_is(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    flags_run = actor_run_id(_config(redis_server.url), {"opponent": "random"})
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        run_actor(_config(redis_server.url, actor_id="a"))
        line = _run_line(caplog)
        assert f"run id {flags_run} (its flags' run id: {SAME};" in line
        run_actor(_config(redis_server.url, actor_id="b", run_id="run-named"))
        line = _run_line(caplog)
        assert SAME not in line
        assert f"run id run-named (--run-id, in place of its flags' run id {flags_run}:" in line
        run_actor(_config(redis_server.url, actor_id="c", run_id=flags_run))
        line = _run_line(caplog)
        assert SAME not in line and "(--run-id, which is also its flags' run id;" in line
