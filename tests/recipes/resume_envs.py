"""A two-turn env for the `ludic train --resume` test (imported by name in a subprocess):
each reply is rewarded by its share of "o" characters, so rewards differ within a group and
every step changes the weights."""

from __future__ import annotations

from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome


class SayOTwiceEnv(SingleAgentEnv):
    """Two turns; each reward = fraction of the reply's characters that are "o"."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn = 0
        return f"Say something ({seed}).", {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs="Once more.", reward=reward, terminated=self.turn >= 2)
