"""`ludic actor --temperature --top-p`: the sampling the user asked for reaches the engine and
travels with every sample to the learner (which recomputes logprobs under it); a top-p out of
range is refused before any work, naming the field."""

from __future__ import annotations

import asyncio

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.cli import main as ludic_main
from ludic.pipeline.commands import run_actor
from ludic.pipeline.config import ActorConfig
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import SAWBatch

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
__all__ = ["redis_server"]


def _config(url: str, top_p: float) -> ActorConfig:
    return ActorConfig(
        redis_url=url,
        stream="s",
        env="tictactoe",
        env_kwargs='{"opponent": "random"}',
        problems_per_batch=1,
        group_size=2,
        max_steps=1,
        max_tokens=6,
        temperature=0.7,
        top_p=top_p,
        batches=1,
    )


def test_the_actors_top_p_travels_with_every_sample(redis_server: RedisServer) -> None:
    run_actor(_config(redis_server.url, top_p=0.9))

    async def read() -> SAWBatch:
        stream = SampleStream(redis_server.url, stream="s", group="g")
        return await PipelineBatchSource(stream, batch_size=2, block_ms=1000).next_batch()

    items = asyncio.run(read()).items
    assert len(items) == 2
    for item in items:
        sampling = item.meta["behavior_sampling"]
        assert (sampling["temperature"], sampling["top_p"]) == (0.7, 0.9), sampling


def test_a_top_p_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"--top-p must be in \(0, 1\], got 1.5"):
        run_actor(_config("redis://127.0.0.1:1/0", top_p=1.5))  # fails before Redis is reached


def test_the_actor_command_line_takes_top_p(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ActorConfig] = []
    monkeypatch.setattr("ludic.pipeline.commands.run_actor", seen.append)
    ludic_main(["actor", "--temperature", "0.7", "--top-p", "0.9", "--batches", "1"])
    assert (seen[0].temperature, seen[0].top_p) == (0.7, 0.9)
