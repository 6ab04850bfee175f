"""`combo_say_o:SayOEnv`: a one-turn env whose reward is the share of "o" in the reply, so a
group's rewards differ from the first step and every step changes the weights. For the
tests/combos runs of the `ludic` command (`--env combo_say_o:SayOEnv`)."""

from __future__ import annotations

from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome


class SayOEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs="", reward=reward, terminated=True)


class SayOThriceEnv(SingleAgentEnv):
    """`combo_say_o:SayOThriceEnv`: SayOEnv over three turns, each rewarded the share of "o" in
    its reply, so an episode trains as three turn samples (GRPO's per-turn samples)."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn = 0
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs="Again.", reward=reward, terminated=self.turn == 3)
