"""SingleAgentEnv: a synchronous env is synchronous to its users, an async one awaitable; the
protocols drive both the same way."""

from __future__ import annotations

import inspect
import threading

import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Info, StepOutcome


class SyncCounter(SingleAgentEnv):
    def __init__(self) -> None:
        self.n = 0
        self.threads: list[str] = []

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.n = 0
        self.threads.append(threading.current_thread().name)
        return f"start {seed}", {"seed": seed}

    def env_step(self, action: str) -> StepOutcome:
        self.n += 1
        self.threads.append(threading.current_thread().name)
        return StepOutcome(obs=f"n={self.n}", reward=1.0, terminated=self.n >= 2)

    def env_state_key(self) -> int:
        return self.n


class AsyncCounter(SyncCounter):
    async def env_reset(self, seed: int | None = None) -> tuple[str, Info]:  # type: ignore[override]
        return SyncCounter.env_reset(self, seed)

    async def env_step(self, action: str) -> StepOutcome:  # type: ignore[override]
        return SyncCounter.env_step(self, action)


def test_a_sync_env_returns_values_not_coroutines() -> None:
    env = SyncCounter()
    assert env.reset(0) == {"agent_0": ("start 0", {"seed": 0})}
    assert env.step({"agent_0": "go"}) == {
        "agent_0": StepOutcome(obs="n=1", reward=1.0, terminated=False)
    }
    assert env.state_key("agent_0") == 1


async def test_an_async_env_returns_awaitables() -> None:
    env = AsyncCounter()
    reset = env.reset(3)
    assert inspect.isawaitable(reset)
    assert await reset == {"agent_0": ("start 3", {"seed": 3})}
    outcome = await env.step({"agent_0": "go"})  # type: ignore[misc]
    assert outcome["agent_0"].obs == "n=1"


def test_step_without_the_seat_names_it() -> None:
    with pytest.raises(KeyError, match="needs an action for 'agent_0'"):
        SyncCounter().step({"someone": "x"})


@pytest.mark.parametrize("actions", ["go", ["go"]])
def test_a_bare_action_is_refused_with_the_dict_to_pass(actions: object) -> None:
    # "agent_0" in "go" tested for a substring: KeyError "... got actions for ['g', 'o']"
    with pytest.raises(
        TypeError,
        match=r"SyncCounter.step takes \{agent_id: action\}.*"
        r"pass env.step\(\{'agent_0': ",
    ):
        SyncCounter().step(actions)  # type: ignore[arg-type]


@pytest.mark.parametrize("env_type", [SyncCounter, AsyncCounter])
async def test_the_protocol_drives_sync_and_async_envs_alike(env_type: type[SyncCounter]) -> None:
    env = env_type()
    agent = Agent(ScriptedClient(["a"]))
    (rollout,) = await SingleAgentProtocol(agent, max_steps=5).run(env, env_seed=7)
    assert [s.next_obs for s in rollout.env_steps] == ["n=1", "n=2"]
    # The state a step led to vs the state the agent acted from (GiGPO's key).
    assert [s.state_key for s in rollout.env_steps] == ["1", "2"]
    assert [s.info["state_key"] for s in rollout.agent_steps] == ["0", "1"]
    if env_type is SyncCounter:  # sync calls still leave the event loop
        assert all(name.startswith("ludic-worker") for name in env.threads)
