"""Two-turn envs for the `--context` tests of `ludic eval` (tests/eval) and `ludic actor`
(tests/pipeline), imported by name: one declares `suggested_context = "latest"`, one declares
nothing, one declares a value that is neither."""

from __future__ import annotations

from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome

FIRST = "first observation"


class TwoTurnEnv(SingleAgentEnv):
    """Two observations, any reply accepted; the episode ends after the second reply."""

    def __init__(self) -> None:
        self.turn = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn = 0
        return f"{FIRST} {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        return StepOutcome(obs="second observation", reward=0.0, terminated=self.turn >= 2)


class LatestTwoTurnEnv(TwoTurnEnv):
    suggested_context = "latest"


class OddContextEnv(TwoTurnEnv):
    suggested_context = "everything"
