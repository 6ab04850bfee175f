"""An env call that takes unusually long is logged once, naming the env, the call, the seconds
and --episode-timeout-s: an env.step that never returned was silent for the whole episode
timeout (600 s by default). No test here waits on the clock: the threshold is tiny and the
slow call is released by the warning itself, or outlasts it by the loop's timer order."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from ludic._log_once import forget_warnings
from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Info, StepOutcome

LOGGER = "ludic.envs.base"


def step_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The slow-call warnings about `step` (a reset's thread hop on a busy machine may outlast
    the tiny threshold too, and be logged as well)."""
    return [
        r.getMessage() for r in caplog.records if ".env_step has not returned" in r.getMessage()
    ]


class ReleasedByTheWarning(logging.Handler):
    """Sets `released` when the slow-call warning is logged (it is logged on the loop thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "HangingEnv.env_step has not returned after" in record.getMessage():
            self.released.set()


class HangingEnv(SingleAgentEnv):
    """A synchronous step (run on a worker thread) that blocks until `released` is set."""

    slow_call_warning_s = 0.001

    def __init__(self, released: threading.Event) -> None:
        self.released = released

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        if not self.released.wait(timeout=60):  # a guard against a hung test, not a check
            raise RuntimeError("the slow-call warning never came")
        return StepOutcome(obs="done", terminated=True)


async def test_a_hanging_step_is_logged_naming_the_env_the_call_and_the_flag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forget_warnings()
    handler = ReleasedByTheWarning()
    logging.getLogger(LOGGER).addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            env = HangingEnv(handler.released)
            (rollout,) = await SingleAgentProtocol(Agent(ScriptedClient(["a"]))).run(env)
    finally:
        logging.getLogger(LOGGER).removeHandler(handler)
    assert rollout.env_steps[-1].terminated  # the episode went on once the step returned
    (message,) = step_warnings(caplog)
    assert message.startswith("HangingEnv.env_step has not returned after 0.001 s")
    assert "--episode-timeout-s" in message and "HangingEnv.slow_call_warning_s" in message


class SlowAsyncEnv(SingleAgentEnv):
    """Every async step takes 20 ms, far past its 1 ms threshold: the loop runs the warning's
    timer (due first) before the step's sleep ends, however busy the machine is."""

    slow_call_warning_s = 0.001

    async def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    async def env_step(self, action: str) -> StepOutcome:
        await asyncio.sleep(0.02)
        return StepOutcome(obs="next")


async def test_a_slow_env_is_logged_once_and_a_fast_one_not_at_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forget_warnings()
    fast = SlowAsyncEnv()
    fast.slow_call_warning_s = None  # None: never watched
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await SingleAgentProtocol(Agent(ScriptedClient(["a"])), max_steps=2).run(fast)
        assert caplog.records == []
        protocol = SingleAgentProtocol(Agent(ScriptedClient(["a"])), max_steps=3)
        await protocol.run(SlowAsyncEnv())
        await protocol.run(SlowAsyncEnv())
    (message,) = step_warnings(caplog)  # six slow steps, one line
    assert message.startswith("SlowAsyncEnv.env_step has not returned after 0.001 s")
