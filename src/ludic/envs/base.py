"""The environment kernel: multi-agent by default, sync or async.

An env is a state transition function with an optional reward. It never sees prompts, tool
calls or parsing: agents and protocols handle those. It does not run the interaction loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Hashable, Mapping, Sequence

from ludic.types import Info, StepOutcome

ResetResult = dict[str, tuple[str, Info]]
StepResult = dict[str, StepOutcome]


class LudicEnv(ABC):
    """Base for all environments.

    - `agent_ids`: every seat in the game.
    - `reset(seed)` -> `{agent_id: (observation, info)}` for every agent.
    - `active_agents`: the agents expected to act on the next `step`.
    - `step(actions)` -> `{agent_id: StepOutcome}`; `actions` holds one action per active agent.
      Include an outcome for every agent the step concerns (an opponent's move changes your
      board and may end your game), not only those who acted.
    - `state_key(agent_id)`: an optional hashable identity of the agent's current state
      (str, int, or tuple of those); GiGPO groups steps that share it. None: no key.
    - `system_prompt`: an optional suggested system prompt for agents.

    `reset` and `step` may be `async def` in subclasses; protocols await them when needed.
    """

    system_prompt: str | None = None

    @property
    @abstractmethod
    def agent_ids(self) -> Sequence[str]: ...

    @property
    @abstractmethod
    def active_agents(self) -> Sequence[str]: ...

    @abstractmethod
    def reset(self, seed: int | None = None) -> ResetResult | Awaitable[ResetResult]: ...

    @abstractmethod
    def step(self, actions: Mapping[str, str]) -> StepResult | Awaitable[StepResult]: ...

    def state_key(self, agent_id: str) -> Hashable | None:
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (sockets, subprocesses). Protocols and the RolloutEngine both
        call it, so it may run more than once: make it idempotent."""


def state_key_to_str(key: Hashable | None) -> str | None:
    """Canonical JSON-safe form of a state key (strings stay as they are)."""
    if key is None or isinstance(key, str):
        return key
    return repr(key)
