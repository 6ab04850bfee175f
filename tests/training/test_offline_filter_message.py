"""OfflineBatchSource's "no samples" error says which filter dropped how many samples, why and
what to do (fails if it only says 'N samples filtered out')."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, SeedSequencer
from ludic.training import (
    ConstantCredit,
    OfflineBatchSource,
    drop_incomplete_completions,
    drop_parse_errors,
    drop_truncated,
)
from ludic.types import Info, StepOutcome


class OneStepEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"problem {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True)


async def _unparsable_rollouts(path: Path, n: int) -> Path:
    """Every action is "ok", which the <move> parser rejects (a parse error per turn)."""
    parser = xml_tag_parser("move")
    engine = RolloutEngine(
        env_registry={"one": OneStepEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(
                Agent(ScriptedClient(["ok"]), parser=parser), max_steps=1
            )
        },
        jsonl_log=path,
    )
    requests = [
        RolloutRequest(env=ComponentSpec(name="one"), protocol=ComponentSpec(name="single"))
        for _ in range(n)
    ]
    await engine.run(SeedSequencer(run_seed=0).seed_requests(requests, 0))
    return path


def test_no_samples_message_names_each_filter_its_count_and_the_fix(tmp_path: Path) -> None:
    data = asyncio.run(_unparsable_rollouts(tmp_path / "rollouts.jsonl", 5))
    with pytest.raises(ValueError) as e:
        OfflineBatchSource(
            paths=data,
            credit_assigner=ConstantCredit(),
            batch_size=2,
            filters=[drop_truncated(), drop_parse_errors()],
        )
    message = str(e.value)
    assert "5 rollouts, 0 failed, 5 samples built" in message
    assert "all 5 dropped by filters: " in message
    assert "drop_parse_errors dropped 5 (their actions failed the env's parser" in message
    # an episode whose only action failed to parse is also cut by max_steps
    assert "drop_truncated dropped 5 (their episodes were cut by max_steps" in message


def test_a_filter_that_dropped_nothing_is_not_named(tmp_path: Path) -> None:
    data = asyncio.run(_unparsable_rollouts(tmp_path / "rollouts.jsonl", 3))
    with pytest.raises(ValueError) as e:
        OfflineBatchSource(
            paths=data,
            credit_assigner=ConstantCredit(),
            batch_size=2,
            filters=[
                lambda item: item.meta.get("reward", 0.0) > 5.0,
                drop_incomplete_completions(),
            ],
        )
    message = str(e.value)
    assert "all 3 dropped by filters: <lambda> dropped 3 (loosen or remove that filter)" in message
    assert "drop_incomplete_completions" not in message
