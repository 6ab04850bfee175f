"""An episode whose env raises keeps where it raised: the console line names the exception
type (a KeyError used to show just 'lamps'), the failed rollout holds the traceback's last
frames in `meta["error_traceback"]` (`meta["error"]` stays the bare message), and the first
traceback of a batch is logged once, not once per episode."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.rollouts.engine import _TRACEBACK_FRAMES
from ludic.types import Info, StepOutcome


class Lamps(SingleAgentEnv):
    def __init__(self) -> None:
        self.state: dict[str, int] = {}

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=float(count_lamps(self.state)), terminated=True)


def count_lamps(state: dict[str, int]) -> int:
    return state["lamps"]


def engine(*, episode_timeout_s: float | None = None) -> RolloutEngine:
    def protocol() -> SingleAgentProtocol:
        return SingleAgentProtocol(Agent(ScriptedClient(["on"])), max_steps=1)

    return RolloutEngine(
        env_registry={"lamps": Lamps},
        protocol_registry={"p": protocol},
        episode_timeout_s=episode_timeout_s,
    )


def requests(n: int) -> list[RolloutRequest]:
    spec = ComponentSpec(name="lamps")
    return [RolloutRequest(env=spec, protocol=ComponentSpec(name="p")) for _ in range(n)]


async def test_a_raising_env_keeps_its_traceback_logged_once_per_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ludic.rollouts.engine"):
        rollouts = await engine().run(requests(3))
    for rollout in rollouts:
        assert rollout.meta["error"] == "'lamps'" and rollout.meta["error_type"] == "KeyError"
        trace = rollout.meta["error_traceback"]
        assert "in count_lamps" in trace and 'state["lamps"]' in trace
        assert trace.rstrip().endswith("KeyError: 'lamps'")
    lines = [r.getMessage() for r in caplog.records]
    failed = [line for line in lines if " failed (run): " in line]
    assert len(failed) == 3
    assert all(line.endswith("failed (run): KeyError: 'lamps'") for line in failed)
    (logged,) = [line for line in lines if line.startswith("traceback of episode ")]
    assert "in count_lamps" in logged and logged.endswith("KeyError: 'lamps'")
    # a second batch logs its own first traceback again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ludic.rollouts.engine"):
        await engine().run(requests(2))
    assert sum(r.getMessage().startswith("traceback of ") for r in caplog.records) == 1


def test_the_traceback_keeps_only_the_last_frames() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("lamps")
        deep(n - 1)

    class Deep(Lamps):
        def env_step(self, action: str) -> StepOutcome:
            deep(60)
            raise AssertionError("unreachable")

    eng = engine()
    eng.env_registry["lamps"] = Deep
    (rollout,) = asyncio.run(eng.run(requests(1)))
    trace = rollout.meta["error_traceback"]
    assert trace.count("in deep") <= _TRACEBACK_FRAMES
    assert trace.rstrip().endswith("KeyError: 'lamps'")
