"""Two-turn envs for `ludic eval --context` tests: one declares `suggested_context = "latest"`,
one declares nothing, one declares a value that is neither."""

from __future__ import annotations

from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome


class TwoTurnEnv(SingleAgentEnv):
    """Two observations, any reply accepted; the episode ends after the second reply."""

    def __init__(self) -> None:
        self.turn = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn = 0
        return f"first observation {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        return StepOutcome(obs="second observation", reward=0.0, terminated=self.turn >= 2)


class LatestTwoTurnEnv(TwoTurnEnv):
    suggested_context = "latest"


class OddContextEnv(TwoTurnEnv):
    suggested_context = "everything"
