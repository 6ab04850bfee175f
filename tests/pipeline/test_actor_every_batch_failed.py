"""`ludic actor --batches N` whose every episode of every batch failed (an env that raises, a
model that cannot serve the request) pushed nothing and still exited 0 after `actor a0 done: N
batches, 0 samples pushed`; as `ludic train` ends with NothingTrainedError, it now ends with a
refusal (exit 1) saying nothing reached the stream and where the first error is. One batch that
pushed samples keeps the run a success."""

from __future__ import annotations

import pytest
from pipeline_fakes import SMALL_SPEC, RedisServer, redis_server

from ludic.envs.single_agent import SingleAgentEnv
from ludic.errors import is_refusal
from ludic.models import tiny_model_dir
from ludic.pipeline.commands import NothingPushedError, run_actor
from ludic.pipeline.config import ActorConfig
from ludic.types import Info, StepOutcome

pytestmark = [pytest.mark.redis, pytest.mark.slow]
__all__ = ["redis_server"]


class ResetFails(SingleAgentEnv):
    """Built fine (the actor builds one up front), fails every episode at reset."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        raise RuntimeError("the env's backend is down")

    def env_step(self, action: str) -> StepOutcome:
        raise AssertionError("never reached")


def _actor(redis: RedisServer, env: str) -> ActorConfig:
    return ActorConfig(
        redis_url=redis.url,
        env=env,
        model=str(tiny_model_dir(spec=SMALL_SPEC)),
        problems_per_batch=1,
        group_size=2,
        max_steps=1,
        max_tokens=4,
        batches=2,
        actor_id="a0",
    )


def test_an_actor_whose_every_episode_failed_ends_with_a_refusal(
    redis_server: RedisServer,
) -> None:
    with pytest.raises(NothingPushedError) as refused:
        run_actor(_actor(redis_server, "test_actor_every_batch_failed:ResetFails"))
    assert is_refusal(refused.value)
    message = str(refused.value)
    assert "every episode of all 2 batch(es) failed" in message and "Fix the cause" in message
    assert redis_server.client().xlen("ludic:samples") == 0


def test_an_actor_that_pushed_samples_ends_normally(redis_server: RedisServer) -> None:
    history = run_actor(_actor(redis_server, "pipeline_fakes:CountOEnv"))
    assert len(history) == 2 and sum(s.num_samples for s in history) > 0
