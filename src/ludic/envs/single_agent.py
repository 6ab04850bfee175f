"""SingleAgentEnv: the easy path for Gym-like tasks with one agent.

Subclasses implement `env_reset(seed) -> (obs, info)` and `env_step(action) -> StepOutcome`,
either sync or async, and optionally `env_state_key()` and `env_current_observation()`. A synchronous env stays synchronous
for its users (`env.reset(0)` returns the result); protocols still run its calls on a worker
thread (see `LudicEnv`). It deliberately adds nothing else.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.types import Info, StepOutcome

T = TypeVar("T")
R = TypeVar("R")


class SingleAgentEnv(LudicEnv):
    """An env with one seat, `agent_id` (default "agent_0").

    `reset(seed)` and `step({agent_id: action})` wrap `env_reset` / `env_step` in the
    multi-agent form. They are synchronous when those are (`env.reset(0)` returns
    `{"agent_0": (obs, info)}`) and return an awaitable when those are `async def`.

    State keys: the protocol reads `state_key` (here `env_state_key()`) right after `reset`
    and after each step, so `EnvironmentStep.state_key` is the state AFTER that step, and the
    agent step that chose the action records the state BEFORE it (`AgentStep.info
    ["state_key"]`), which is what GiGPO groups by. Return the same key for states that are
    the same decision (two boards with the same cells), never one that depends on the path.
    """

    agent_id: str = "agent_0"

    @property
    def agent_ids(self) -> Sequence[str]:
        return (self.agent_id,)

    @property
    def active_agents(self) -> Sequence[str]:
        return (self.agent_id,)

    @abstractmethod
    def env_reset(self, seed: int | None = None) -> tuple[str, Info] | Awaitable[tuple[str, Info]]:
        """Start an episode and return `(observation, info)`.

        `seed` picks the problem: the same seed must give the same start (GRPO compares the
        members of a group on one problem; eval's pass@k uses seeds seed, seed+1, ...). None:
        any problem. The observation is the agent's first user message; `info` is a JSON dict
        recorded with the rollout. May be `async def`.
        """

    @abstractmethod
    def env_step(self, action: str) -> StepOutcome | Awaitable[StepOutcome]:
        """Apply the parsed action and return a `StepOutcome(obs, reward, terminated,
        truncated, info)`.

        `action` is the parser's `ParseResult.action` (never the raw reply; a reply that fails
        to parse does not reach the env). `obs` is the next user message; `reward` is this
        step's reward (the parser's reward is added to the agent step separately);
        `terminated` ends the episode (goal reached or lost), `truncated` cuts it for an
        outside reason (a time limit inside the env). May be `async def`.
        """

    def env_state_key(self) -> Hashable | None:
        """An optional hashable identity of the CURRENT state (str, int or a tuple of those),
        read after `env_reset` and after every `env_step`; None: no key (GiGPO then falls
        back to a hash of the observation text). Keep it cheap: it runs on the event loop."""
        return None

    def env_current_observation(self) -> str | None:
        """Optional: the observation of the unchanged current state, shown below the parser's
        feedback after a reply that did not parse (see `LudicEnv.current_observation`); None:
        the feedback alone."""
        return None

    def current_observation(self, agent_id: str) -> str | None:
        return self.env_current_observation()

    def reset(self, seed: int | None = None) -> ResetResult | Awaitable[ResetResult]:
        return _then(self.env_reset(seed), lambda r: {self.agent_id: r})

    def step(self, actions: Mapping[str, str]) -> StepResult | Awaitable[StepResult]:
        if self.agent_id not in actions:
            raise KeyError(
                f"{type(self).__name__}.step needs an action for {self.agent_id!r}; got "
                f"actions for {sorted(actions)}"
            )
        return _then(self.env_step(actions[self.agent_id]), lambda o: {self.agent_id: o})

    def state_key(self, agent_id: str) -> Hashable | None:
        return self.env_state_key()


def _then(value: T | Awaitable[T], wrap: Callable[[T], R]) -> R | Awaitable[R]:
    """`wrap(value)` now, or, when `value` is awaitable, a coroutine awaiting it first."""
    if inspect.isawaitable(value):

        async def later() -> R:
            return wrap(await value)

        return later()
    return wrap(value)  # type: ignore[arg-type]
