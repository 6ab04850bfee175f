"""generate_batch assigns credit off the event loop: a slow credit assigner (AWR's "value"
baseline fits a model per batch) must not stall the episodes of a batch being prefetched on
the same loop. The assigner here waits for a coroutine on the loop to run; on the loop itself
it would wait in vain (the wait's bound only ends the test if the fix is missing)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, generate_batch
from ludic.rollouts.samples import TurnKey
from ludic.training import ConstantCredit
from ludic.types import Info, Rollout, StepOutcome


class OneStepEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "problem", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True)


class WaitsForTheLoop:
    """A credit assigner that, once started, blocks until a coroutine on the loop sets
    `loop_ran`."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.loop_ran = threading.Event()
        self.saw_the_loop_run = False

    def assign(self, rollouts: Sequence[Rollout]) -> Mapping[TurnKey, float]:
        self.started.set()
        self.saw_the_loop_run = self.loop_ran.wait(timeout=30)
        return ConstantCredit().assign(rollouts)


def test_the_loop_keeps_running_while_credit_is_assigned() -> None:
    engine = RolloutEngine(
        env_registry={"one": OneStepEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["ok"])), max_steps=1)
        },
    )
    request = RolloutRequest(env=ComponentSpec(name="one"), protocol=ComponentSpec(name="single"))
    credit = WaitsForTheLoop()

    async def main() -> int:
        batch = asyncio.create_task(generate_batch(engine, [request], credit))
        while not batch.done():  # another episode's work on the loop, as a prefetch runs it
            if credit.started.is_set():
                credit.loop_ran.set()
            await asyncio.sleep(0.01)
        return len(batch.result().samples)

    assert asyncio.run(main()) == 1
    assert credit.saw_the_loop_run
