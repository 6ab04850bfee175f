"""The InteractionProtocol seam: the object that owns the agent <-> env loop.

Neither env nor agent runs episodes; a protocol does, and returns one Rollout per agent it
trains (plus child rollouts for delegation). Protocols hold their agents, so build a fresh
protocol per episode (the RolloutEngine does this through factories).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from ludic.agents.base import Agent
from ludic.envs.base import LudicEnv
from ludic.envs.single_agent import check_reset_result, check_step_outcome, returns_checked
from ludic.inference.sampling import SamplingConfig
from ludic.types import Info, Rollout, StepOutcome


@runtime_checkable
class InteractionProtocol(Protocol):
    """Runs one episode of `env` and returns its rollouts.

    `sampling.seed`, when set, is the episode's sampling seed; agents derive a distinct,
    deterministic seed for each model call from it. A protocol records agent errors (parse
    failures, tool errors) in the rollout; exceptions from the env or the client propagate to
    the caller (the RolloutEngine turns them into a failed rollout). A protocol calls the env
    through `ludic.envs.base.call_env` (a synchronous method runs on a worker thread) and
    closes it with `closing_env`, which awaits `close` within `env.close_timeout_s`.
    """

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]: ...


T = TypeVar("T")


def checked_env_seed(env_seed: object) -> int | None:
    """`env_seed` as an int (or None), or a TypeError naming the argument: a string or float
    seed would reach `env.reset` and the rollout's records as something no env seeds from."""
    if env_seed is None:
        return None
    if isinstance(env_seed, bool) or not isinstance(env_seed, numbers.Integral):
        raise TypeError(
            f"env_seed must be an int or None, got {type(env_seed).__name__} {env_seed!r}; "
            f"pass env_seed=int(...)"
        )
    return int(env_seed)


def checked_env(env: object, owner: str) -> LudicEnv:
    """`env`, or a TypeError naming `owner` when it is not a LudicEnv instance (an env class
    failed with "argument of type 'property' is not iterable")."""
    if isinstance(env, LudicEnv):
        return env
    if isinstance(env, type):
        got, fix = f"the class {env.__name__}", f"pass an instance, {env.__name__}(...)"
    else:
        got, fix = f"{type(env).__name__} {env!r:.60}", "pass a LudicEnv (e.g. a SingleAgentEnv)"
    raise TypeError(f"{owner}.run needs a LudicEnv instance as env, got {got}; {fix}")


def checked_agent(agent: object, owner: str) -> Agent:
    """`agent`, or a TypeError naming `owner` when it is not an Agent (a string failed later
    with "'str' object has no attribute 'agent_id'")."""
    if isinstance(agent, Agent):
        return agent
    raise TypeError(
        f"{owner} needs an Agent, got {type(agent).__name__} {agent!r:.60}; pass e.g. "
        "Agent(client, parser=...)"
    )


class EnvReturns:
    """Checks what one env's `reset` / `step` return, per seat, with the messages of
    `ludic.envs.check_reset_result` / `check_step_outcome`, so a bad observation or reward
    fails the episode naming the env instead of reaching the rollout (a str reward crashed
    the run in credit assignment). A SingleAgentEnv that checks its own returns is not
    checked twice."""

    __slots__ = ("check", "name", "seats")

    def __init__(self, env: LudicEnv) -> None:
        self.name = type(env).__name__
        self.check = not returns_checked(env)
        self.seats = tuple(env.agent_ids)

    def active(self, active_agents: Sequence[str]) -> Sequence[str]:
        """`env.active_agents`, or a ValueError naming an id that is not one of its seats."""
        self._only_seats(active_agents, "active_agents")
        return active_agents

    def resets(self, result: object) -> Mapping[str, tuple[str, Info]]:
        return self._mapping(result, "reset", "(observation, info)")  # type: ignore[return-value]

    def outcomes(self, result: object) -> Mapping[str, StepOutcome]:
        return self._mapping(result, "step", "StepOutcome")  # type: ignore[return-value]

    def reset_of(self, resets: Mapping[str, tuple[str, Info]], aid: str) -> tuple[str, Info]:
        reset = self._seat(resets, aid, "reset")
        if not self.check:
            return reset
        return check_reset_result(reset, where=f"{self.name}.reset for {aid!r}")

    def outcome_of(self, outcomes: Mapping[str, StepOutcome], aid: str) -> StepOutcome:
        outcome = self._seat(outcomes, aid, "step")
        if not self.check:
            return outcome
        return check_step_outcome(outcome, where=f"{self.name}.step for {aid!r}")

    def _seat(self, result: Mapping[str, T], aid: str, method: str) -> T:
        """The entry for `aid`, or a KeyError naming the seats the env did return."""
        if aid in result:
            return result[aid]
        raise KeyError(
            f"{self.name}.{method} returned nothing for agent {aid!r} (it returned entries "
            f"for {sorted(map(str, result))}); return an entry for every agent the protocol runs"
        )

    def _mapping(self, result: object, method: str, value: str) -> Mapping[str, object]:
        if not self.check:
            return result  # type: ignore[return-value]
        if not isinstance(result, Mapping):
            raise TypeError(
                f"{self.name}.{method} must return a dict {{agent_id: {value}}}, got "
                f"{type(result).__name__}; a one-agent env can subclass SingleAgentEnv instead"
            )
        self._only_seats(result, method)
        return result

    def _only_seats(self, ids: Iterable[object], method: str) -> None:
        """A ValueError naming the ids that are not seats: an entry keyed by a misspelt seat
        was skipped, so that seat never saw its last observation or reward."""
        strays = [i for i in ids if i not in self.seats]
        if strays:
            raise ValueError(
                f"{self.name}.{method} named {strays}, which are not among its seats "
                f"{list(self.seats)} (agent_ids); key every entry by a seat in agent_ids"
            )
