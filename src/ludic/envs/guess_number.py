"""GuessNumberEnv: find a secret number in 1..N from "higher" / "lower" feedback.

The state key is the interval `(low, high)` still consistent with the feedback, which is all an
agent can know, so episodes with different secrets share states (GiGPO anchors). It
deliberately has no guess limit of its own: the protocol's `max_steps` truncates.
"""

from __future__ import annotations

import random
import re
from collections.abc import Hashable

from ludic.envs.arg_types import checked_arguments
from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome

_INTEGER = re.compile(r"[+-]?[0-9]{1,12}")


class GuessNumberEnv(SingleAgentEnv):
    """The seed picks the secret uniformly in `1..max_number`. A correct guess ends the episode
    with `success_reward`; a wrong one earns `-step_penalty` and says "higher" or "lower".
    Text that is not an integer in range is an invalid guess (`info["invalid_action"]`,
    `-step_penalty`, nothing changes). The interval only narrows on guesses inside it.
    """

    inline_sync_calls = True  # pure and fast: no thread hop (see LudicEnv)

    @checked_arguments
    def __init__(
        self, *, max_number: int = 16, success_reward: float = 1.0, step_penalty: float = 0.0
    ) -> None:
        if max_number < 2:
            raise ValueError(f"max_number must be >= 2, got {max_number}")
        if step_penalty < 0:
            raise ValueError(f"step_penalty is subtracted each step; pass >= 0, got {step_penalty}")
        self.max_number = max_number
        self.success_reward = success_reward
        self.step_penalty = step_penalty
        self.system_prompt = (
            f"Guess the secret whole number between 1 and {max_number}. After each guess you "
            "are told whether the secret is higher or lower. Reply with one number in a move "
            "tag, for example <move>7</move>."
        )
        self.secret = 0
        self.low, self.high = 1, max_number
        self.done: bool | None = None  # None: never reset

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.secret = random.Random(seed).randint(1, self.max_number)
        self.low, self.high = 1, self.max_number
        self.done = False
        obs = f"I picked a number between 1 and {self.max_number}. Your guess?"
        return obs, {"max_number": self.max_number}

    def env_step(self, action: str) -> StepOutcome:
        self._check_can_step()
        text = action.strip() if isinstance(action, str) else ""
        if not _INTEGER.fullmatch(text) or not 1 <= int(text) <= self.max_number:
            note = f"{str(action)[:40]!r} is not a whole number from 1 to {self.max_number}."
            return self._miss(note, {"invalid_action": True})
        guess = int(text)
        if guess == self.secret:
            self.done = True
            self.low = self.high = guess
            return StepOutcome(
                obs=f"{guess} is correct!",
                reward=self.success_reward,
                terminated=True,
                info={"guess": guess, "success": True},
            )
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
            return self._miss(f"{guess} is too low: higher.", {"guess": guess, "hint": "higher"})
        self.high = min(self.high, guess - 1)
        return self._miss(f"{guess} is too high: lower.", {"guess": guess, "hint": "lower"})

    def env_state_key(self) -> Hashable | None:
        return (self.low, self.high)

    def _miss(self, note: str, info: Info) -> StepOutcome:
        obs = f"{note} The number is between {self.low} and {self.high}. Your guess?"
        return StepOutcome(obs=obs, reward=0.0 - self.step_penalty, info=info)

    def _check_can_step(self) -> None:
        name = type(self).__name__
        if self.done is None:
            raise RuntimeError(f"{name}.step called before reset(); call reset(seed) first")
        if self.done:
            raise RuntimeError(
                f"{name}.step called after the episode ended (the number was found); "
                "call reset() to start a new one"
            )
