"""Lights: a small multi-turn environment written from scratch, the subject of the README's
"Train your own environment" tutorial.

Four lamps, some of them off. Each turn the agent names one lamp and it flips (on <-> off). The
episode ends with reward +1 when every lamp is on; each flip costs 0.05, so shorter solutions
score higher. The seed picks the starting lamps, so one seed is one problem.

Three things make it a Ludic env: `env_reset` / `env_step` (the transition function), a
`parser` that turns the model's free text into an action (here: the first digit 1-4, lenient
so a small model gets a signal early), and `env_state_key` (the lamps as "1001"), which GiGPO
uses to compare the actions taken from the same state. It has no model, prompt or tokens in
it: agents and protocols add those.
"""

from __future__ import annotations

import random

from ludic.envs import SingleAgentEnv
from ludic.types import Info, ParseResult, StepOutcome

NUM_LAMPS = 4
FLIP_COST = 0.05
INVALID_REPLY_PENALTY = -0.2


def lamp_parser(text: str) -> ParseResult:
    """The action is the first digit 1-4 in the reply. A reply without one is a parse failure:
    a small penalty, and feedback the agent sees as its next observation; the env never sees
    it."""
    for char in text:
        if char in "1234":
            return ParseResult(action=char, reward=0.0)
    return ParseResult(
        action=None,
        reward=INVALID_REPLY_PENALTY,
        obs=f"Reply with the number of one lamp, 1 to {NUM_LAMPS}.",
    )


class LightsEnv(SingleAgentEnv):
    """Turn every lamp on by flipping one lamp per turn."""

    parser = staticmethod(lamp_parser)  # what `--parser auto` (the default) picks up
    system_prompt = f"You control {NUM_LAMPS} lamps. Each turn, reply with one lamp number."
    inline_sync_calls = True  # pure and fast: no worker-thread hop needed
    # Each observation shows every lamp, so the latest one is all the agent needs: what
    # `--context auto` (the default of `ludic train` and `ludic eval`) then picks.
    suggested_context = "latest"

    def __init__(self) -> None:
        self.lamps = [True] * NUM_LAMPS

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        rng = random.Random(seed)
        self.lamps = [rng.random() < 0.5 for _ in range(NUM_LAMPS)]
        if all(self.lamps):  # always at least one lamp to turn on
            self.lamps[rng.randrange(NUM_LAMPS)] = False
        return self._describe(), {"lamps_off": self.lamps.count(False)}

    def env_step(self, action: str) -> StepOutcome:
        lamp = int(action) - 1  # the parser guarantees "1".."4"
        self.lamps[lamp] = not self.lamps[lamp]
        if all(self.lamps):
            return StepOutcome(  # solved, whatever parse penalties cost: `ludic eval` success
                obs="All lamps are on.",
                reward=1.0 - FLIP_COST,
                terminated=True,
                info={"success": True},
            )
        return StepOutcome(obs=self._describe(), reward=-FLIP_COST)

    def env_state_key(self) -> str:
        return "".join("1" if on else "0" for on in self.lamps)

    def _describe(self) -> str:
        states = ", ".join(f"{i + 1} {'on' if on else 'off'}" for i, on in enumerate(self.lamps))
        return f"Lamps: {states}. Which lamp do you flip?"
