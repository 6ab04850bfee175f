"""Redis name flags that would silently part the actors from the learner (`--stream ""` from
an unset shell variable, a trailing space) are refused before Redis, naming the flag; a stream
name with spaces is a name like any other, and the fix the actor prints for it quotes it."""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import replace

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.errors import LudicUsageError
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.commands import run_actor, run_learner
from ludic.pipeline.config import ActorConfig, LearnerConfig
from ludic.pipeline.run_check import RUN_KEY
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.stream_runs import refuse_another_run

NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: a refusal must come before Redis


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"stream": ""}, "--stream ''"),
        ({"stream": "ludic:samples "}, "--stream 'ludic:samples '"),
        ({"group": " g"}, "--group ' g'"),
        ({"consumer": "learner\n"}, "--consumer 'learner\\n'"),
    ],
)
def test_the_learner_refuses_an_unusable_name(changes: dict[str, str], flag: str) -> None:
    with pytest.raises(LudicUsageError, match="is no usable Redis name") as refused:
        run_learner(LearnerConfig(redis_url=NOWHERE, **changes))  # type: ignore[arg-type]
    assert str(refused.value).startswith(flag)


def test_the_actor_refuses_an_unusable_name() -> None:
    with pytest.raises(LudicUsageError, match=r"^--stream '' is no usable Redis name"):
        run_actor(ActorConfig(redis_url=NOWHERE, stream=""))
    with pytest.raises(LudicUsageError, match=r"^--actor-id ' a' is no usable"):
        run_actor(ActorConfig(redis_url=NOWHERE, actor_id=" a"))


@pytest.mark.redis
@pytest.mark.timeout(60)
def test_a_stream_name_with_spaces_is_quoted_in_the_fix(redis_server: RedisServer) -> None:
    async def refused() -> str:
        stream = SampleStream(redis_server.url, stream="my samples", group="g")
        await stream.ensure_group()
        item = sample()
        meta = {**item.meta, "actor_id": "a", RUN_KEY: "run-old"}
        await stream.add(encode_sample(replace(item, meta=meta), sample_id="a:0:0"))
        try:
            with pytest.raises(LudicUsageError) as error:
                await refuse_another_run(stream, run_id="run-new", actor_id="b")
            return str(error.value)
        finally:
            await stream.aclose()

    message = asyncio.run(refused())
    assert f"DEL {shlex.quote('my samples')}`" in message and "'my samples'" in message


__all__ = ["redis_server"]
