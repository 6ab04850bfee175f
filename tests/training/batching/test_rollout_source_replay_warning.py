"""RolloutBatchSource without a SeedSequencer, handed the same unseeded requests every batch:
GRPORequestStrategy derives their seeds from the request ids, so every batch replays the same
problems and sampling seeds. It says so once (naming the fix); fresh or seeded requests do not
trigger it."""

from __future__ import annotations

import logging

import pytest

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import GroupNormalizedReturn, RolloutBatchSource
from ludic.types import Info, StepOutcome

WARNING = "plays the same problems with the same sampling seeds"


class SeedEnv(SingleAgentEnv):
    """One step; the observation names the env seed."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"seed {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True)


def source(requests_fn, seed_sequencer: SeedSequencer | None = None) -> RolloutBatchSource:  # type: ignore[no-untyped-def]
    engine = RolloutEngine(
        env_registry={"seed": SeedEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["a"])), max_steps=1)
        },
    )
    return RolloutBatchSource(
        engine=engine,
        requests_fn=requests_fn,
        credit_assigner=GroupNormalizedReturn(),
        strategy=GRPORequestStrategy(group_size=2),
        seed_sequencer=seed_sequencer,
    )


def fresh() -> list[RolloutRequest]:
    return [RolloutRequest(env=ComponentSpec(name="seed"), protocol=ComponentSpec(name="single"))]


async def test_the_same_unseeded_requests_every_batch_are_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prompts = fresh()
    replaying = source(lambda: prompts)
    with caplog.at_level(logging.WARNING, logger="ludic.training.batching.synced"):
        batches = [await replaying.next_batch() for _ in range(3)]
    seeds = [{r.meta.get("env_seed") for r in b.rollouts} for b in batches]
    assert seeds[0] == seeds[1] == seeds[2] and None not in seeds[0]  # the replay warned about
    warnings = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(warnings) == 1
    assert "batch 1 reuses unseeded request" in warnings[0]
    assert "seed_sequencer=SeedSequencer(run_seed=...)" in warnings[0]


async def test_new_or_sequenced_requests_are_not_named(caplog: pytest.LogCaptureFixture) -> None:
    prompts = fresh()
    with caplog.at_level(logging.WARNING, logger="ludic.training.batching.synced"):
        for built in (source(fresh), source(lambda: prompts, SeedSequencer(run_seed=0))):
            for _ in range(2):
                await built.next_batch()
    assert not [r for r in caplog.records if WARNING in r.getMessage()]
