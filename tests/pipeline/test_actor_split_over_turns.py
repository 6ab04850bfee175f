"""`ludic actor --split-over-turns`: the actor assigns credit, so it is where `ludic train
--split-over-turns` applies in the pipeline: each of a 3-turn episode's samples carries A/3,
its record names the flag (the learner refuses actors that disagree on it), a preset that
cannot split is refused before any work, and `--help` lists it."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.pipeline import commands
from ludic.pipeline.commands import run_actor
from ludic.pipeline.config import ActorConfig
from ludic.pipeline.credit_check import CreditCheck, CreditMismatchError
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.types import Info, StepOutcome

__all__ = ["redis_server"]
NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens: a check that ran late would fail there


class ThreeTurnEnv(SingleAgentEnv):
    """Three turns; each rewards the number of "o" in the reply."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn = 0
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        return StepOutcome(obs="Again.", reward=float(action.count("o")), terminated=self.turn == 3)


async def _weights(server: RedisServer, stream: str, count: int) -> list[Any]:
    source = PipelineBatchSource(
        SampleStream(server.url, stream=stream, group="g", retry_cap_s=0.2),
        batch_size=count,
        block_ms=100,
    )
    try:
        return list((await source.next_batch()).items)
    finally:
        await source.aclose()


def _pushed(server: RedisServer, monkeypatch: pytest.MonkeyPatch, *, split: bool) -> list[Any]:
    """One batch of one group of two 3-turn episodes, one at a time: the first replies "oo"
    three times (return 6), the second "x" (return 0); the six samples the actor pushed."""

    async def scripted(cfg: ActorConfig, served: str | None = None) -> ScriptedClient:
        return ScriptedClient(["oo", "oo", "oo", "x", "x", "x"])

    monkeypatch.setattr(commands, "_actor_client", scripted)
    stream = f"split-{split}"
    cfg = ActorConfig(
        redis_url=server.url,
        stream=stream,
        env=f"{__name__}:ThreeTurnEnv",
        parser="identity",
        max_steps=3,
        problems_per_batch=1,
        group_size=2,
        concurrency=1,
        batches=1,
        split_over_turns=split,
    )
    run_actor(cfg)
    return asyncio.run(_weights(server, stream, 6))


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_each_turn_of_a_three_turn_episode_carries_a_third(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # returns 6 and 0: mean 3, sample std 3*sqrt(2), so A = +-1/sqrt(2) (less eps); split: A/3
    whole = _pushed(redis_server, monkeypatch, split=False)
    split = _pushed(redis_server, monkeypatch, split=True)
    a = 3 / (3 * math.sqrt(2) + 1e-6)
    assert sorted(i.weight for i in whole) == pytest.approx([-a] * 3 + [a] * 3, abs=1e-9)
    assert sorted(i.weight for i in split) == pytest.approx([-a / 3] * 3 + [a / 3] * 3, abs=1e-9)
    assert split[0].meta["credit"] == {"algorithm": "grpo", "flags": {"split_over_turns": True}}
    assert whole[0].meta["credit"] == {"algorithm": "grpo", "flags": {}}  # as before the flag
    check = CreditCheck("grpo")
    check(split[0])
    with pytest.raises(CreditMismatchError, match="--split-over-turns True"):
        check(whole[0])  # two actors of one stream, one splitting: the learner refuses


def test_a_preset_that_cannot_split_is_refused_before_any_work() -> None:
    cfg = ActorConfig(redis_url=NO_REDIS, algorithm="rloo", split_over_turns=True, batches=1)
    with pytest.raises(ValueError, match=r"^--split-over-turns applies to .*grpo.* not 'rloo'"):
        run_actor(cfg)


def test_help_lists_it(capsys: pytest.CaptureFixture[str]) -> None:
    from ludic.cli import main as ludic_main

    with pytest.raises(SystemExit):
        ludic_main(["actor", "--help"])
    assert "--split-over-turns" in capsys.readouterr().out
