"""A sync `value_estimator` (a critic's forward pass, a table lookup over a network) runs on a
worker thread, as a sync tool does: the event loop, and every other episode on it, keeps running
while it works. On the loop it stalled every concurrent episode for the estimate's duration."""

from __future__ import annotations

import asyncio
import re
import threading

import numpy as np
import pytest
from interaction_fakes import TapeEnv

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MaxSteps, SingleAgentProtocol

# Only reached when the estimator blocks the loop (the bug): the test then fails, not hangs.
_DEADLOCK_GUARD_S = 60.0


async def test_a_blocking_sync_estimator_leaves_the_loop_running() -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    released = threading.Event()
    outcomes: list[bool] = []

    def blocking_value(obs: str, state_key: str | None) -> float:
        # returns early only if a coroutine on the event loop runs while it waits
        loop.call_soon_threadsafe(started.set)
        outcomes.append(released.wait(_DEADLOCK_GUARD_S))
        return 1.0

    async def release_from_the_loop() -> None:
        await started.wait()
        released.set()

    protocol = SingleAgentProtocol(
        Agent(ScriptedClient(["go"])),
        termination=[MaxSteps(max_steps=1)],
        value_estimator=blocking_value,
    )
    (rollout,), _ = await asyncio.gather(
        protocol.run(TapeEnv(), env_seed=0), release_from_the_loop()
    )
    assert outcomes == [True]
    assert rollout.agent_steps[0].info["value_estimate"] == 1.0


async def test_an_async_estimator_still_runs_on_the_loop() -> None:
    threads: list[int] = []

    async def value(obs: str, state_key: str | None) -> float:
        threads.append(threading.get_ident())
        return 2.0

    protocol = SingleAgentProtocol(
        Agent(ScriptedClient(["go"])), termination=[MaxSteps(max_steps=1)], value_estimator=value
    )
    (rollout,) = await protocol.run(TapeEnv(), env_seed=0)
    assert threads == [threading.get_ident()]
    assert rollout.agent_steps[0].info["value_estimate"] == 2.0


@pytest.mark.parametrize(
    ("value", "named"),
    [(None, "NoneType None"), ("0.5", "str '0.5'"), (np.array([1.0, 2.0]), "ndarray array")],
)
async def test_an_estimate_that_is_not_a_number_fails_naming_the_estimator(
    value: object, named: str
) -> None:
    def critic(obs: str, state_key: str | None) -> object:
        return value

    protocol = SingleAgentProtocol(
        Agent(ScriptedClient(["go"])), termination=[MaxSteps(max_steps=1)], value_estimator=critic
    )
    with pytest.raises(TypeError, match=rf"value_estimator .*critic returned {re.escape(named)}"):
        await protocol.run(TapeEnv(), env_seed=0)


async def test_a_numpy_estimate_is_a_plain_float() -> None:
    protocol = SingleAgentProtocol(
        Agent(ScriptedClient(["go"])),
        termination=[MaxSteps(max_steps=1)],
        value_estimator=lambda obs, key: np.float32(0.25),
    )
    (rollout,) = await protocol.run(TapeEnv(), env_seed=0)
    estimate = rollout.agent_steps[0].info["value_estimate"]
    assert type(estimate) is float and estimate == 0.25
