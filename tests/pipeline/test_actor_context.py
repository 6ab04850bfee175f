"""`ludic actor --context`: auto by default, resolved as `ludic train` and `ludic eval` resolve
it (the env's `suggested_context`, else full) with the same logged reason; the resolved context
is what the actor's agent remembers, so its samples hold only the latest observation with
`latest` and the whole dialog with `full`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import tyro
from pipeline_fakes import RedisServer, redis_server

from context_envs import FIRST, LatestTwoTurnEnv, OddContextEnv, TwoTurnEnv
from ludic.cli import main as ludic_main
from ludic.pipeline.commands import actor_context
from ludic.pipeline.config import ActorConfig
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream

__all__ = ["redis_server"]


def test_the_flag_defaults_to_auto() -> None:
    assert ActorConfig().context == "auto"
    cfg = tyro.cli(ActorConfig, args=["--context", "latest"])
    assert cfg.context == "latest"
    with pytest.raises(SystemExit):
        tyro.cli(ActorConfig, args=["--context", "everything"])


@pytest.mark.parametrize(
    ("env", "flag", "resolved", "line"),
    [
        (LatestTwoTurnEnv, "auto", "latest", "--context auto: the env's suggested_context"),
        (TwoTurnEnv, "auto", "full", "--context auto: the env suggests none"),
        (LatestTwoTurnEnv, "full", "full", "--context full)"),
        (TwoTurnEnv, "latest", "latest", "--context latest)"),
    ],
)
def test_context_resolves_as_train_does_and_logs_why(
    caplog: pytest.LogCaptureFixture, env: type, flag: str, resolved: str, line: str
) -> None:
    cfg = ActorConfig(env="x", context=flag)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.commands"):
        assert actor_context(cfg, env, {}) == resolved
    assert f"context: {resolved} ({line}" in caplog.text


def test_a_bad_suggested_context_names_the_env_and_the_flag() -> None:
    cfg = ActorConfig(env="odd")
    with pytest.raises(ValueError, match=r"'odd'.*'everything'.*--context full"):
        actor_context(cfg, OddContextEnv, {})
    assert actor_context(ActorConfig(env="odd", context="latest"), OddContextEnv, {}) == "latest"


async def _items(server: RedisServer, stream: str) -> list[Any]:
    """Every sample the actor pushed (the stream's length is the batch size)."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(server.url)
    try:
        count = int(await client.xlen(stream))
    finally:
        await client.aclose()
    source = PipelineBatchSource(
        SampleStream(server.url, stream=stream, group="g", retry_cap_s=0.2),
        batch_size=count,
        block_ms=100,
    )
    try:
        return list((await source.next_batch()).items)
    finally:
        await source.aclose()


def _first_observation_in_every_sample(server: RedisServer, env: str, *flags: str) -> list[bool]:
    """Run `ludic actor` for one batch of one two-turn episode; per sample, whether its tokens
    hold the first observation."""
    from ludic.models import tiny_model_dir
    from ludic.models.loading import load_tokenizer

    stream = f"s-{env}-{'-'.join(flags)}"
    args = ["actor", "--redis-url", server.url, "--stream", stream]
    args += ["--env", f"context_envs:{env}", "--max-steps", "2", "--max-tokens", "3"]
    args += ["--problems-per-batch", "1", "--group-size", "1", "--batches", "1", *flags]
    args += ["--algorithm", "reinforce"]  # one episode per group: a group baseline is refused
    ludic_main(args)
    items = asyncio.run(_items(server, stream))
    tokenizer = load_tokenizer(tiny_model_dir())
    return [FIRST in tokenizer.decode(item.input_ids) for item in items]


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(180)
def test_the_actors_samples_follow_the_resolved_context(redis_server: RedisServer) -> None:
    # latest: the second turn is a sample of its own whose prompt lacks the first observation
    assert _first_observation_in_every_sample(redis_server, "LatestTwoTurnEnv") == [True, False]
    # full (the flag overrides the env): each turn's sample holds the whole dialog
    full = _first_observation_in_every_sample(redis_server, "LatestTwoTurnEnv", "--context", "full")
    assert full == [True, True]
    assert _first_observation_in_every_sample(redis_server, "TwoTurnEnv") == [True, True]
