"""Envs for the `ludic train` tests (imported by name, also in a subprocess): one whose every
episode fails, and ones whose observations are long enough that a full dialog overruns the tiny
model's 2,048-token context on its second turn; one whose reward is a bool."""

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
    """Five turns, each observation a few hundred tokens; reward = share of "o" in the reply.
    After the first turn every episode sees the same observation."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0
        self.seed: int | None = None

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn, self.seed = 0, seed
        return self.observation(), {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs=self.observation(), reward=reward, terminated=self.turn >= 5)

    def observation(self) -> str:
        return f"({self.seed}) {LONG_OBSERVATION}" if self.turn == 0 else LONG_OBSERVATION


class DistinctLongEnv(LongTalkEnv):
    """LongTalkEnv whose every observation starts differently (no prefix shared across a
    batch's samples, which the Trainer would count once)."""

    def observation(self) -> str:
        fruit = "apples" if self.turn == 0 else "pears"
        return f"{(self.seed or 0) * 7 + self.turn + 1} {fruit}. {LONG_OBSERVATION}"


class SaidOEnv(SingleAgentEnv):
    """One turn; the reward is a bool: did the reply contain an "o" (`reward=solved`, as users
    write it)."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "Say a word with the letter o.", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward="o" in action, terminated=True)  # type: ignore[arg-type]
