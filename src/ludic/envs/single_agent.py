"""SingleAgentEnv: the easy path for Gym-like tasks with one agent.

Subclasses implement `env_reset(seed) -> (obs, info)` and `env_step(action) -> StepOutcome`
(either may be async; a synchronous one runs on a worker thread, see `LudicEnv`). It
deliberately adds nothing else.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Awaitable, Hashable, Mapping, Sequence

from ludic.envs.base import LudicEnv, ResetResult, StepResult, call_env
from ludic.types import Info, StepOutcome


class SingleAgentEnv(LudicEnv):
    """An env with one seat, `agent_id` (default "agent_0")."""

    agent_id: str = "agent_0"

    @property
    def agent_ids(self) -> Sequence[str]:
        return (self.agent_id,)

    @property
    def active_agents(self) -> Sequence[str]:
        return (self.agent_id,)

    @abstractmethod
    def env_reset(
        self, seed: int | None = None
    ) -> tuple[str, Info] | Awaitable[tuple[str, Info]]: ...

    @abstractmethod
    def env_step(self, action: str) -> StepOutcome | Awaitable[StepOutcome]: ...

    def env_state_key(self) -> Hashable | None:
        return None

    async def reset(self, seed: int | None = None) -> ResetResult:
        obs, info = await call_env(self, self.env_reset, seed)
        return {self.agent_id: (obs, info)}

    async def step(self, actions: Mapping[str, str]) -> StepResult:
        if self.agent_id not in actions:
            raise KeyError(
                f"{type(self).__name__}.step needs an action for {self.agent_id!r}; got "
                f"actions for {sorted(actions)}"
            )
        outcome = await call_env(self, self.env_step, actions[self.agent_id])
        return {self.agent_id: outcome}

    def state_key(self, agent_id: str) -> Hashable | None:
        return self.env_state_key()
