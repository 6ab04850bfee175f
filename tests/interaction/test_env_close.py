"""Every protocol awaits `env.close()` (sync or async) once per episode, bounded by the env's
`close_timeout_s`, and runs a synchronous env's `reset` / `step` off the event loop thread
(on it when the env sets `inline_sync_calls`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from interaction_fakes import CoinDuelEnv, CountingEnv

from ludic.agents import Agent, ToolAgent
from ludic.envs.base import EnvCloseError, LudicEnv, close_env, closing_env
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import (
    DelegatingProtocol,
    MaxSteps,
    MultiAgentProtocol,
    SingleAgentProtocol,
    SubAgentSpec,
    TaskEnv,
    delegate,
)
from ludic.parsers import xml_tag_parser

MOVE = xml_tag_parser("move")


class AsyncCloseCountingEnv(CountingEnv):
    """`close` is a coroutine: it only counts when it is awaited (not merely called)."""

    async def close(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.closed += 1


class AsyncCloseCoinDuelEnv(CoinDuelEnv):
    async def close(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.closed += 1


def good_agent() -> Agent:
    return Agent(ScriptedClient(["<move>good</move>"]), parser=MOVE)


def single(env: LudicEnv) -> Any:
    return SingleAgentProtocol(good_agent()).run(env)


def terminating(env: LudicEnv) -> Any:
    return SingleAgentProtocol(good_agent(), termination=[MaxSteps(max_steps=5)]).run(env)


def delegating(env: LudicEnv) -> Any:
    registry = {"default": SubAgentSpec(agent_factory=good_agent, env_factory=TaskEnv)}
    boss = ToolAgent(ScriptedClient(["<move>good</move>"]), external_tools=[delegate], parser=MOVE)
    return DelegatingProtocol(boss, registry).run(env)


PROTOCOLS: dict[str, Callable[[LudicEnv], Any]] = {
    "single": single,
    "terminating": terminating,
    "delegating": delegating,
}


@pytest.mark.parametrize("env_type", [CountingEnv, AsyncCloseCountingEnv])
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
async def test_single_seat_protocols_close_the_env_once(env_type: type, protocol: str) -> None:
    env = env_type(length=1)
    (rollout, *_) = await PROTOCOLS[protocol](env)
    assert rollout.total_reward == 1.0
    assert env.closed == 1


@pytest.mark.parametrize("env_type", [CoinDuelEnv, AsyncCloseCoinDuelEnv])
async def test_multi_agent_protocol_closes_the_env_once(env_type: type) -> None:
    env = env_type(coins=2)
    agents = {"first": Agent(ScriptedClient(["2"])), "second": Agent(ScriptedClient(["1"]))}
    rollouts = await MultiAgentProtocol(agents).run(env)
    assert [r.total_reward for r in rollouts] == [1.0, -1.0]
    assert env.closed == 1


async def test_a_close_failure_after_a_clean_episode_raises_env_close_error() -> None:
    class Hung(CountingEnv):
        close_timeout_s = 0.05

        async def close(self) -> None:  # type: ignore[override]
            await asyncio.sleep(3600)

    with pytest.raises(EnvCloseError, match=r"Hung.close\(\) did not finish within"):
        await single(Hung(length=1))


async def test_a_close_failure_after_a_failed_episode_keeps_the_first_error(caplog) -> None:
    class Broken(CountingEnv):
        def close(self) -> None:
            raise OSError("already gone")

    with pytest.raises(RuntimeError, match="the env broke"):
        await single(Broken(fail_on_step=True))
    assert "Broken.close() raised OSError: already gone" in caplog.text


async def test_close_env_runs_once_per_episode() -> None:
    env = CountingEnv()
    async with closing_env(env):
        pass
    await close_env(env)  # the engine's safety-net close: already done
    assert env.closed == 1
    async with closing_env(env):  # the env reused for a second episode is closed again
        pass
    assert env.closed == 2


async def test_sync_env_methods_run_off_the_event_loop_thread() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []

    class Recording(CoinDuelEnv):
        def step(self, actions):  # type: ignore[no-untyped-def]
            seen.append(threading.get_ident())
            return super().step(actions)

        def close(self) -> None:
            seen.append(threading.get_ident())

    agents = {"first": Agent(ScriptedClient(["2"])), "second": Agent(ScriptedClient(["1"]))}
    await MultiAgentProtocol(agents).run(Recording(coins=2))
    assert seen and loop_thread not in seen


async def test_inline_sync_calls_run_on_the_event_loop_thread() -> None:
    seen: list[int] = []

    class Inline(CountingEnv):
        inline_sync_calls = True

        def env_step(self, action: str):  # type: ignore[no-untyped-def]
            seen.append(threading.get_ident())
            return super().env_step(action)

    env = Inline(length=2)
    await single(env)
    assert seen == [threading.get_ident()] * 2 and env.closed == 1
