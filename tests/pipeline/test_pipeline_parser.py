"""`ludic actor --parser auto` with an env factory FUNCTION that needs the run's `--env-kwargs`:
the actor builds the env with those kwargs to read the parser its class declares (as `ludic
train` does), so every action reaches the env through that parser, not the identity one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.cli import main as ludic_main
from ludic.envs.single_agent import SingleAgentEnv
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.types import Info, ParseResult, StepOutcome

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
__all__ = ["redis_server"]
CLOSED: list[str] = []


def mark_parsed(text: str) -> ParseResult:
    """Accepts every reply and marks it, so the env can tell it came through this parser."""
    return ParseResult(action=f"PARSED:{text}")


class MarkedEnv(SingleAgentEnv):
    """One turn; reward 1 when the action came through `mark_parsed`, else 0."""

    parser = staticmethod(mark_parsed)

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return self.prompt, {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=float(action.startswith("PARSED:")), terminated=True)

    async def close(self) -> None:  # async: the parser is resolved outside the event loop
        CLOSED.append(self.prompt)


def make_marked_env(prompt: str) -> MarkedEnv:
    """A factory function (no `parser` attribute of its own) that needs its kwarg."""
    return MarkedEnv(prompt)


async def _items(server: RedisServer) -> list[Any]:
    stream = SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)
    source = PipelineBatchSource(stream, batch_size=4, block_ms=100)
    try:
        return list((await source.next_batch()).items)
    finally:
        await source.aclose()


@pytest.mark.slow
def test_actor_uses_the_parser_the_env_class_declares_built_with_env_kwargs(
    redis_server: RedisServer,
) -> None:
    args = ["actor", "--redis-url", redis_server.url, "--stream", "s"]
    args += ["--env", "test_pipeline_parser:make_marked_env"]
    args += ["--env-kwargs", '{"prompt": "Say hi."}', "--max-steps", "1", "--max-tokens", "4"]
    args += ["--problems-per-batch", "2", "--group-size", "2", "--batches", "1"]
    ludic_main(args)
    items = asyncio.run(_items(redis_server))
    assert len(items) == 4
    assert all(item.meta["reward"] == 1.0 for item in items)  # every action was marked
    assert CLOSED and CLOSED[0] == "Say hi."  # built with the kwargs, closed (async) after
