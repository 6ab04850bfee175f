"""Envs for the `ludic train` tests (imported by name, also in a subprocess): one whose every
episode fails, and one whose observations are long enough that a full dialog overruns the tiny
model's 2,048-token context on its second turn."""

from __future__ import annotations

from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome

LONG_OBSERVATION = " ".join(f"cell{i % 10} is empty" for i in range(300))


class BrokenEnv(SingleAgentEnv):
    """Every reset raises: every episode fails."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        raise RuntimeError("this env is broken on purpose")

    def env_step(self, action: str) -> StepOutcome:
        raise AssertionError("never reached")


class LongTalkEnv(SingleAgentEnv):
    """Five turns, each observation a few hundred tokens; reward = share of "o" in the reply."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn = 0
        return f"({seed}) {LONG_OBSERVATION}", {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs=LONG_OBSERVATION, reward=reward, terminated=self.turn >= 5)
