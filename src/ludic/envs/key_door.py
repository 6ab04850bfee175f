"""KeyDoorGridEnv: pick up the key, then walk through the door, in a small walled grid.

The seed picks one of a few fixed layouts and a start cell, so different seeds pass through the
same states (the state key is `(layout, row, col, has_key)`), which is what GiGPO's anchor states
need. It deliberately has no step limit of its own: the protocol's `max_steps` truncates.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Hashable

from ludic.envs.arg_types import checked_arguments
from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome

# "#" wall, "K" key, "D" door, "." floor. Every floor cell reaches the key and then the door.
LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("K..#", ".#..", ".#..", "...D"),
    ("...D", ".##.", "....", "K#.."),
    (".K..", "##.#", "....", "D.#."),
)
ACTIONS: tuple[str, ...] = ("up", "down", "left", "right", "pickup")
_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

SYSTEM_PROMPT = (
    "You are A in a grid world. # is a wall, K the key, D a locked door. Pick up the key "
    "(stand on it and use pickup), then walk into the door. Reply with one action in a move "
    "tag: <move>up</move>, <move>down</move>, <move>left</move>, <move>right</move> or "
    "<move>pickup</move>."
)

Cell = tuple[int, int]


def _find(rows: tuple[str, ...], char: str) -> Cell:
    return next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == char)


def _open(rows: tuple[str, ...], cell: Cell, has_key: bool) -> bool:
    r, c = cell
    if not (0 <= r < len(rows) and 0 <= c < len(rows[0])):
        return False
    return rows[r][c] != "#" and (rows[r][c] != "D" or has_key)


def _successors(
    rows: tuple[str, ...], key: Cell, cell: Cell, has_key: bool
) -> list[tuple[str, tuple[Cell, bool]]]:
    steps = [(a, ((cell[0] + dr, cell[1] + dc), has_key)) for a, (dr, dc) in _MOVES.items()]
    found = [(a, nxt) for a, nxt in steps if _open(rows, nxt[0], has_key)]
    return [*found, ("pickup", (cell, True))] if cell == key and not has_key else found


def shortest_plan(layout: int, start: Cell, has_key: bool = False) -> list[str]:
    """The fewest actions that win from `start` in `layout` (an expert policy for SFT data)."""
    rows = LAYOUTS[layout]
    key, door = _find(rows, "K"), _find(rows, "D")
    frontier: deque[tuple[Cell, bool]] = deque([(start, has_key)])
    came_from: dict[tuple[Cell, bool], tuple[tuple[Cell, bool], str] | None] = {
        (start, has_key): None
    }
    while frontier:
        state = frontier.popleft()
        if state == (door, True):
            plan: list[str] = []
            while (link := came_from[state]) is not None:
                state, action = link
                plan.append(action)
            return plan[::-1]
        for action, nxt in _successors(rows, key, *state):
            if nxt not in came_from:
                came_from[nxt] = (state, action)
                frontier.append(nxt)
    raise ValueError(f"layout {layout} has no path from {start} to the key and the door")


class KeyDoorGridEnv(SingleAgentEnv):
    """Actions (case-insensitive): up, down, left, right, pickup.

    Walking into a wall, the edge or the locked door leaves the agent in place
    (`info["bumped"]`); `pickup` off the key does nothing; any other text is an invalid action
    (`info["invalid_action"]`, nothing changes). Each other step earns `-step_penalty`; entering the
    door with the key ends the episode with `success_reward`. `layout` pins one layout (else the
    seed picks one); the seed always picks the start cell among the layout's floor cells.
    """

    inline_sync_calls = True  # pure and fast: no thread hop (see LudicEnv)

    system_prompt = SYSTEM_PROMPT

    @checked_arguments
    def __init__(
        self,
        *,
        layout: int | None = None,
        success_reward: float = 1.0,
        step_penalty: float = 0.0,
    ) -> None:
        if step_penalty < 0:
            raise ValueError(f"step_penalty is subtracted each step; pass >= 0, got {step_penalty}")
        if layout is not None and not 0 <= layout < len(LAYOUTS):
            raise ValueError(f"layout must be in 0..{len(LAYOUTS) - 1} or None, got {layout}")
        self.fixed_layout = layout
        self.success_reward = success_reward
        self.step_penalty = step_penalty
        self.layout = 0
        self.position: Cell = (0, 0)
        self.has_key = False
        self.done: bool | None = None  # None: never reset

    @property
    def rows(self) -> tuple[str, ...]:
        return LAYOUTS[self.layout]

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        rng = random.Random(seed)
        self.layout = (
            self.fixed_layout if self.fixed_layout is not None else rng.randrange(len(LAYOUTS))
        )
        floor = [(r, c) for r, row in enumerate(self.rows) for c, ch in enumerate(row) if ch == "."]
        self.position = rng.choice(floor)
        self.has_key = False
        self.done = False
        info: Info = {"layout": self.layout, "start": list(self.position)}
        return self._observation("Find the key, then the door."), info

    def env_step(self, action: str) -> StepOutcome:
        self._check_can_step()
        word = action.strip().lower() if isinstance(action, str) else ""
        if word not in ACTIONS:
            shown = str(action)[:40]
            note = f"Unknown action {shown!r}; use one of {', '.join(ACTIONS)}."
            return self._outcome(note, {"invalid_action": True})
        if word == "pickup":
            if self.position == _find(self.rows, "K") and not self.has_key:
                self.has_key = True
                return self._outcome("You picked up the key.", {"picked_up": True})
            return self._outcome("There is no key here.", {"picked_up": False})
        dr, dc = _MOVES[word]
        target = (self.position[0] + dr, self.position[1] + dc)
        if not _open(self.rows, target, self.has_key):
            locked = _open(self.rows, target, True)
            note = "The door is locked; find the key first." if locked else "You bump into a wall."
            return self._outcome(note, {"bumped": True})
        self.position = target
        if target == _find(self.rows, "D"):
            self.done = True
            obs = "You unlock the door and walk through. You win!"
            return StepOutcome(
                obs=obs, reward=self.success_reward, terminated=True, info={"success": True}
            )
        return self._outcome(f"You move {word}.", {"bumped": False})

    def env_state_key(self) -> Hashable | None:
        return (self.layout, self.position[0], self.position[1], self.has_key)

    def render(self) -> str:
        """The grid with A for the agent (the key disappears once picked up)."""
        lines = []
        for r, row in enumerate(self.rows):
            chars = ["." if ch == "K" and self.has_key else ch for ch in row]
            if r == self.position[0]:
                chars[self.position[1]] = "A"
            lines.append("".join(chars))
        return "\n".join(lines)

    def _outcome(self, note: str, info: Info) -> StepOutcome:
        return StepOutcome(obs=self._observation(note), reward=0.0 - self.step_penalty, info=info)

    def _observation(self, note: str) -> str:
        holding = "You have the key." if self.has_key else "You do not have the key."
        return f"{note}\n{self.render()}\n{holding} Actions: {', '.join(ACTIONS)}."

    def _check_can_step(self) -> None:
        name = type(self).__name__
        if self.done is None:
            raise RuntimeError(f"{name}.step called before reset(); call reset(seed) first")
        if self.done:
            raise RuntimeError(
                f"{name}.step called after the episode ended (the agent reached the door); "
                "call reset() to start a new one"
            )
