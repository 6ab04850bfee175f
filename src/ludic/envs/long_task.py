"""MemoryCorridorEnv: a long multi-turn task whose full history overflows a small context
budget, so an agent must delete what it no longer needs (seed 002's setting).

The agent walks a corridor; one room's note holds a code, the other rooms hold long filler
text; at the exit it answers the code. The env does not see or enforce the agent's context:
it exposes the budget (`context_budget_tokens`, for a `ContextBudget` termination rule) and the
context-length penalty a snapshot reward can use (`context_penalty`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Hashable

from ludic.envs.arg_types import checked_arguments
from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome

SYSTEM_PROMPT = (
    "You walk down a corridor of rooms. Reply with one action: next, back, or answer <code>. "
    "One room has a note with the code; at the exit, answer the code to open the door."
)
# fmt: off
_WORDS = (
    "dust", "grey", "stone", "quiet", "lamp", "window", "chair", "shadow", "floor", "crack",
    "paint", "old", "cold", "wall", "door", "carpet", "echo", "table", "clock", "dim", "corner",
    "faded", "picture", "ceiling", "draught", "wooden",
)
# fmt: on
_ANSWER = re.compile(r"answer\s+(\S+)", re.IGNORECASE)


def context_length_penalty(num_tokens: int, *, budget_tokens: int, coef: float = 1.0) -> float:
    """-coef * max(0, num_tokens - budget_tokens) / budget_tokens: 0 within the budget, -coef
    at twice the budget. A snapshot reward for an edit made only after the context overflowed."""
    if budget_tokens < 1:
        raise ValueError(f"budget_tokens must be >= 1, got {budget_tokens}")
    return -coef * max(0, num_tokens - budget_tokens) / budget_tokens


class MemoryCorridorEnv(SingleAgentEnv):
    """A corridor of `length` rooms; room `length` is the exit.

    Actions (case-insensitive): `next`, `back`, `answer <code>` (only at the exit; ends the
    episode with reward 1.0 for the right code, else 0.0). Anything else costs
    `invalid_penalty` and changes nothing. One room before the exit (chosen by the seed) holds
    the code (`code_digits` characters of `code_alphabet`) in its note; each room adds
    `filler_words` words of filler. The state key is `(room, seen_code)`, identical across
    episodes of the same seed, so GiGPO finds anchors.
    """

    inline_sync_calls = True  # pure and fast: no thread hop (see LudicEnv)

    system_prompt = SYSTEM_PROMPT

    @checked_arguments
    def __init__(
        self,
        *,
        length: int = 6,
        filler_words: int = 30,
        code_digits: int = 1,
        code_alphabet: str = "0123456789",
        context_budget_tokens: int = 512,
        penalty_coef: float = 1.0,
        invalid_penalty: float = 0.0,
    ) -> None:
        if length < 2:
            raise ValueError(f"length must be >= 2 (a note room and the exit), got {length}")
        if filler_words < 0 or code_digits < 1:
            raise ValueError(
                f"need filler_words >= 0 and code_digits >= 1, got {filler_words}, {code_digits}"
            )
        if not code_alphabet or any(c.isspace() for c in code_alphabet):
            raise ValueError(
                f"code_alphabet must be non-empty without spaces, got {code_alphabet!r}"
            )
        if context_budget_tokens < 1:
            raise ValueError(f"context_budget_tokens must be >= 1, got {context_budget_tokens}")
        self.length = length
        self.filler_words = filler_words
        self.code_digits = code_digits
        self.code_alphabet = code_alphabet
        self.context_budget_tokens = context_budget_tokens
        self.penalty_coef = penalty_coef
        self.invalid_penalty = invalid_penalty
        self.code = ""
        self.code_room = 1
        self.room = 1
        self.seen_code = False
        self.done = False
        self._fillers: list[str] = []

    def context_penalty(self, num_tokens: int) -> float:
        """`context_length_penalty` with this task's budget and coefficient."""
        return context_length_penalty(
            num_tokens, budget_tokens=self.context_budget_tokens, coef=self.penalty_coef
        )

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        rng = random.Random(seed)
        self.code = "".join(rng.choice(self.code_alphabet) for _ in range(self.code_digits))
        self.code_room = rng.randint(1, self.length - 1)
        self._fillers = [
            " ".join(rng.choice(_WORDS) for _ in range(self.filler_words))
            for _ in range(self.length)
        ]
        self.room, self.done = 1, False
        self.seen_code = self.code_room == 1
        return self._describe(), {"code_room": self.code_room}

    def env_step(self, action: str) -> StepOutcome:
        if self.done:
            raise RuntimeError("MemoryCorridorEnv.step after the episode ended; call reset()")
        text = action.strip().casefold()
        answer = _ANSWER.fullmatch(action.strip())
        if text in ("next", "back"):
            moved = self._move(1 if text == "next" else -1)
            obs = self._describe() if moved else "There is no room that way. " + self._describe()
            return StepOutcome(obs=obs, info={"room": self.room})
        if answer is not None and self.room == self.length:
            self.done = True
            correct = answer.group(1) == self.code
            obs = "The door opens." if correct else "Wrong code. The door stays shut."
            return StepOutcome(
                obs=obs, reward=1.0 if correct else 0.0, terminated=True, info={"success": correct}
            )
        why = "You can only answer at the exit." if answer else f"Unknown action {action!r}."
        return StepOutcome(
            obs=f"{why} Use next, back or answer <code>.",
            reward=self.invalid_penalty,
            info={"invalid_action": True},
        )

    def env_state_key(self) -> Hashable:
        return (self.room, int(self.seen_code))

    def _move(self, delta: int) -> bool:
        room = self.room + delta
        if not 1 <= room <= self.length:
            return False
        self.room = room
        self.seen_code = self.seen_code or room == self.code_room
        return True

    def _describe(self) -> str:
        if self.room == self.length:
            return f"Room {self.room} of {self.length}: the exit. The door asks for the code."
        note = (
            f"A note says: the code is {self.code}."
            if self.room == self.code_room
            else "A note says: nothing here."
        )
        filler = self._fillers[self.room - 1]
        return f"Room {self.room} of {self.length}. {note} {filler}".rstrip()


__all__ = ["SYSTEM_PROMPT", "MemoryCorridorEnv", "context_length_penalty"]
