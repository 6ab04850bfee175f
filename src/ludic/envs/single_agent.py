"""SingleAgentEnv: the easy path for Gym-like tasks with one agent.

Subclasses implement `env_reset(seed) -> (obs, info)` and `env_step(action) -> StepOutcome`,
either sync or async, and optionally `env_state_key()` and `env_current_observation()`. A synchronous env stays synchronous
for its users (`env.reset(0)` returns the result); protocols still run its calls on a worker
thread (see `LudicEnv`). What they return is checked where it leaves the env (the
observation a str, the outcome a `StepOutcome` with a finite number as reward, a dict of
JSON values as info, numpy values converted, and bools as `terminated` / `truncated`), so a
slip is refused naming the method instead of failing later in the chat template, the credit
assignment or the rollout log; protocols apply the same checks (`check_reset_result`,
`check_step_outcome`) to any other `LudicEnv`. It deliberately adds nothing else.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from ludic._describe import describe_value
from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.envs.info_values import jsonable_info
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
        any problem. The observation is the agent's first user message; `info` is a dict
        handed to the agent's context strategy (`on_env_reset`), not recorded in the rollout
        (put what a record needs in the first step's info). May be `async def`.
        """

    @abstractmethod
    def env_step(self, action: str) -> StepOutcome | Awaitable[StepOutcome]:
        """Apply the parsed action and return a `StepOutcome(obs, reward, terminated,
        truncated, info)`.

        `action` is the parser's `ParseResult.action` (never the raw reply; a reply that fails
        to parse does not reach the env). `obs` is the next user message; `reward` is this
        step's reward (the parser's reward is added to the agent step separately);
        `terminated` ends the episode (goal reached or lost), `truncated` cuts it for an
        outside reason (a time limit inside the env); both True is recorded as terminated, as
        Gymnasium reads the pair (a terminal state, nothing to bootstrap). May be `async def`.
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
        where = f"{type(self).__name__}.env_reset"
        return _then(
            self.env_reset(seed),
            lambda r: {self.agent_id: check_reset_result(r, where=where)},
        )

    def step(self, actions: Mapping[str, str]) -> StepResult | Awaitable[StepResult]:
        if not isinstance(actions, Mapping):  # `"x" in "right"` would test for a substring
            raise TypeError(
                f"{type(self).__name__}.step takes {{agent_id: action}}, got "
                f"{describe_value(actions)}; pass env.step({{{self.agent_id!r}: {actions!r:.40}}})"
            )
        if self.agent_id not in actions:
            raise KeyError(
                f"{type(self).__name__}.step needs an action for {self.agent_id!r}; got "
                f"actions for {sorted(actions)}"
            )
        where = f"{type(self).__name__}.env_step"
        return _then(
            self.env_step(actions[self.agent_id]),
            lambda o: {self.agent_id: check_step_outcome(o, where=where)},
        )

    def state_key(self, agent_id: str) -> Hashable | None:
        return self.env_state_key()


_OBS_FIX = (
    "the observation is the text the model reads: return a str (render the state, e.g. a "
    "board drawn as text, or json.dumps of a dict)"
)


def returns_checked(env: LudicEnv) -> bool:
    """Whether `env.reset` / `env.step` already check what they return (SingleAgentEnv's own,
    not overridden), so a protocol need not check it again."""
    cls = type(env)
    return cls.reset is SingleAgentEnv.reset and cls.step is SingleAgentEnv.step


def check_reset_result(result: object, *, where: str) -> tuple[str, Info]:
    """One agent's `(observation, info)` from a reset, or TypeError naming what is wrong with
    it; `where` names the method (and seat) in the message, e.g. "MyEnv.reset for 'p1'"."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError(
            f"{where} must return (observation, info), got {describe_value(result)}; e.g. "
            "`return self.describe(), {}`"
        )
    obs, info = result
    if not isinstance(obs, str):
        raise TypeError(f"{where} returned the observation {describe_value(obs)}; {_OBS_FIX}")
    if not isinstance(info, dict):
        raise TypeError(
            f"{where} returned the info {describe_value(info)}; return a dict ({{}}: none)"
        )
    return obs, info


def check_step_outcome(outcome: object, *, where: str) -> StepOutcome:
    """One agent's StepOutcome from a step, or TypeError (ValueError for a nan or inf reward)
    naming what is wrong with it; `where` names the method (and seat) in the message."""
    if not isinstance(outcome, StepOutcome):
        raise TypeError(
            f"{where} must return a StepOutcome(obs=..., reward=..., terminated=...) "
            f"(ludic.types.StepOutcome), got {describe_value(outcome)}"
        )
    if not isinstance(outcome.obs, str):
        raise TypeError(
            f"{where} returned a StepOutcome whose obs is {describe_value(outcome.obs)}; {_OBS_FIX}"
        )
    reward = outcome.reward
    if not isinstance(reward, numbers.Real):
        raise TypeError(
            f"{where} returned a StepOutcome whose reward is {describe_value(reward)}; the reward must "
            "be a number (a float such as 1.0)"
        )
    if not math.isfinite(reward):
        raise ValueError(
            f"{where} returned a StepOutcome whose reward is {reward}; the reward must be "
            "finite (a nan or inf reward would turn every advantage of its group into nan)"
        )
    if not isinstance(outcome.info, dict):
        raise TypeError(
            f"{where} returned a StepOutcome whose info is {describe_value(outcome.info)}; return a "
            "dict ({}: none)"
        )
    for flag in _FLAGS:
        if not _is_flag(value := getattr(outcome, flag)):
            raise TypeError(
                f"{where} returned a StepOutcome whose {flag} is {describe_value(value)}; {flag} must "
                "be True or False (a non-empty str such as 'False' would end the episode)"
            )
    info = jsonable_info(outcome.info, where=where)
    fixes = {
        **({} if info is outcome.info else {"info": info}),
        **({} if type(reward) is float else {"reward": float(reward)}),
        **{f: bool(getattr(outcome, f)) for f in _FLAGS if type(getattr(outcome, f)) is not bool},
    }  # True/False (reward=solved), ints, numpy values: as plain floats, bools and lists
    return dataclasses.replace(outcome, **fixes) if fixes else outcome


_FLAGS = ("terminated", "truncated")


def _is_flag(value: object) -> bool:
    """A bool, a numpy bool (Gymnasium's envs return them), or the int 0 or 1."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):  # numpy 1, 2
        return True
    return isinstance(value, numbers.Integral) and value in (0, 1)


def _then(value: T | Awaitable[T], wrap: Callable[[T], R]) -> R | Awaitable[R]:
    """`wrap(value)` now, or, when `value` is awaitable, a coroutine awaiting it first."""
    if inspect.isawaitable(value):

        async def later() -> R:
            return wrap(await value)

        return later()
    return wrap(value)  # type: ignore[arg-type]
