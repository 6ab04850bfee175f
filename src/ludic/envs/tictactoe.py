"""TicTacToeEnv: one agent against a scripted opponent (random, minimax or a mix), with a
minimax check of every agent move (`info["optimal_move"]`).

Cells are numbered 1-9 row by row. The env takes the parsed action (e.g. "5"); extracting it
from `<move>5</move>` is the agent parser's job. It deliberately does not parse XML itself.
"""

from __future__ import annotations

import random
import re
from collections.abc import Hashable
from typing import Literal

from ludic.envs.arg_types import checked_arguments
from ludic.envs.single_agent import SingleAgentEnv
from ludic.envs.tictactoe_solver import (
    EMPTY,
    EMPTY_BOARD,
    apply_move,
    is_over,
    legal_moves,
    minimax_move,
    optimal_moves,
    other,
    random_move,
    side_to_move,
    winner,
)
from ludic.types import Info, StepOutcome

Opponent = Literal["random", "minimax", "mixed"]
IllegalMovePolicy = Literal["end", "retry"]
Observation = Literal["full", "compact"]
OPPONENTS: tuple[str, ...] = ("random", "minimax", "mixed")

SYSTEM_PROMPT = (
    "You are playing tic-tac-toe. Cells are numbered 1-9, row by row:\n"
    " 1 | 2 | 3\n 4 | 5 | 6\n 7 | 8 | 9\n"
    "On your turn, pick an empty cell and reply with its number in a move tag, "
    "for example <move>5</move>."
)
_CELL = re.compile(r"[1-9]")


def render_board(board: str) -> str:
    """The board as a 3x3 grid; empty cells show their number so the numbering is explicit."""
    cells = [c if c != EMPTY else str(i + 1) for i, c in enumerate(board)]
    rows = [" " + " | ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
    return "\n---+---+---\n".join(rows)


def parse_cell(action: str) -> int | None:
    """The cell number in `action` ("5", " 5 "), or None for anything else (never raises)."""
    text = action.strip() if isinstance(action, str) else ""
    return int(text) if _CELL.fullmatch(text) else None


def turn_text(board: str, mark: str, to_move: str) -> str:
    """The observation for the player holding `mark`: board, whose turn, legal moves."""
    head = f"You are {mark}. Empty cells show their number.\n{render_board(board)}\n"
    if to_move != mark:
        return head + f"Waiting for {to_move} to move."
    moves = ", ".join(str(m) for m in legal_moves(board))
    return head + f"Your turn ({mark}). Legal moves: {moves}. Reply with <move>N</move>."


def compact_text(board: str, mark: str) -> str:
    """The short observation (`observation="compact"`): the board as three rows of cells
    separated by "|", an empty cell showing its number, then whose mark the reader plays, e.g.
    "X|O|3\n4|X|6\n7|8|9\nX to move"."""
    cells = [c if c != EMPTY else str(i + 1) for i, c in enumerate(board)]
    rows = ["|".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
    return "\n".join(rows) + f"\n{mark} to move"


def outcome_for(board: str, mark: str) -> str | None:
    """The result for `mark` once the game is over ("win", "loss" or "draw"), else None."""
    if not is_over(board):
        return None
    won = winner(board)
    return "draw" if won is None else ("win" if won == mark else "loss")


def game_over_text(board: str, mark: str, outcome: str) -> str:
    """The final observation for `mark`: the board and the result."""
    verdict = {"win": "you win", "draw": "a draw", "loss": "you lose", "illegal": "you lose"}
    return f"You are {mark}.\n{render_board(board)}\nGame over: {verdict[outcome]}."


class TicTacToeEnv(SingleAgentEnv):
    """The agent plays `agent_mark` (X moves first) against a scripted opponent.

    Opponents: "random" (a seeded random legal move), "minimax" (perfect play, ties broken by
    the seed) and "mixed" (random with probability `epsilon`, else minimax). Rewards: `win_reward`,
    `draw_reward`, `loss_reward` at the end; the last step's info names the `outcome` and says
    `success` (a win, whatever illegal-move penalties cost on the way). An illegal move (occupied cell, or any text that is
    not a cell number 1-9) either ends the episode with `illegal_reward` (`illegal_move="end"`,
    outcome "illegal") or, with `illegal_move="retry"`, costs `illegal_reward` and lets the agent
    move again (`info["retry"]`). `observation="compact"` shows only the board (empty cells as
    their numbers) and the mark to play, a third of the tokens of the full text, which explains
    the rules and lists the legal moves (`SYSTEM_PROMPT` still explains them). After a reply
    that does not parse, the protocol shows the parser's feedback and then the board again
    (`current_observation`). The state key is `"<board>|<side to move>"`, e.g. `"X...O....|X"`.
    """

    inline_sync_calls = True  # pure and fast: no thread hop (see LudicEnv)

    system_prompt = SYSTEM_PROMPT
    suggested_context = "latest"  # each observation shows the whole board (`ludic train`)

    @checked_arguments
    def __init__(
        self,
        *,
        agent_mark: Literal["X", "O"] = "X",
        opponent: Opponent = "minimax",
        epsilon: float = 0.3,
        win_reward: float = 1.0,
        draw_reward: float = 0.0,
        loss_reward: float = -1.0,
        illegal_reward: float = -1.0,
        illegal_move: IllegalMovePolicy = "end",
        observation: Observation = "full",
    ) -> None:
        if agent_mark not in ("X", "O"):
            raise ValueError(f"agent_mark must be 'X' or 'O', got {agent_mark!r}")
        if opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {OPPONENTS}, got {opponent!r}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        if illegal_move not in ("end", "retry"):
            raise ValueError(f"illegal_move must be 'end' or 'retry', got {illegal_move!r}")
        if observation not in ("full", "compact"):
            raise ValueError(f"observation must be 'full' or 'compact', got {observation!r}")
        self.agent_mark = agent_mark
        self.opponent_mark = other(agent_mark)
        self.opponent = opponent
        self.epsilon = epsilon
        self.rewards = {"win": win_reward, "draw": draw_reward, "loss": loss_reward}
        self.illegal_reward = illegal_reward
        self.illegal_move = illegal_move
        self.observation = observation
        self.board = EMPTY_BOARD
        self.outcome: str | None = None
        self._rng: random.Random | None = None

    def opponent_move(self) -> int:
        """The scripted opponent's choice on the current board (its rng is seeded by reset)."""
        if self._rng is None:
            raise RuntimeError("TicTacToeEnv.opponent_move needs reset(seed) first")
        if self.opponent == "random" or (
            self.opponent == "mixed" and self._rng.random() < self.epsilon
        ):
            return random_move(self.board, self._rng)
        return minimax_move(self.board, self.opponent_mark, self._rng)

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self._rng = random.Random(seed)
        self.board = EMPTY_BOARD
        self.outcome = None
        info: Info = {"agent_mark": self.agent_mark, "opponent": self.opponent}
        if self.agent_mark == "O":
            move = self.opponent_move()
            self.board = apply_move(self.board, move, self.opponent_mark)
            info["opponent_move"] = move
        return self._observation(info.get("opponent_move")), info

    def env_step(self, action: str) -> StepOutcome:
        self._check_can_step()
        cell = parse_cell(action)
        if cell is None or cell not in legal_moves(self.board):
            return self._illegal(action, cell)
        info: Info = {
            "move": cell,
            "optimal_move": cell in optimal_moves(self.board, self.agent_mark),
            "illegal_move": False,
        }
        self.board = apply_move(self.board, cell, self.agent_mark)
        if not is_over(self.board):
            reply = self.opponent_move()
            self.board = apply_move(self.board, reply, self.opponent_mark)
            info["opponent_move"] = reply
        self.outcome = outcome_for(self.board, self.agent_mark)
        if self.outcome is None:
            return StepOutcome(obs=self._observation(info.get("opponent_move")), info=info)
        info["outcome"] = self.outcome
        info["success"] = self.outcome == "win"  # whatever illegal-move penalties cost on the way
        return StepOutcome(
            obs=self._played(info.get("opponent_move"))
            + game_over_text(self.board, self.agent_mark, self.outcome),
            reward=self.rewards[self.outcome],
            terminated=True,
            info=info,
        )

    def env_current_observation(self) -> str | None:
        """The board to play on again, in the active observation mode (full or compact), while
        the game is on; shown below the feedback after a reply that did not parse."""
        if self._rng is None or self.outcome is not None:
            return None
        return self._observation()

    def env_state_key(self) -> Hashable | None:
        to_move = "-" if self.outcome is not None else side_to_move(self.board)
        return f"{self.board}|{to_move}"

    def _illegal(self, action: str, cell: int | None) -> StepOutcome:
        why = (
            f"cell {cell} is taken"
            if cell is not None
            else f"{str(action)[:40]!r} is not a cell 1-9"
        )
        info: Info = {"move": cell, "optimal_move": False, "illegal_move": True}
        if self.illegal_move == "retry":
            info["retry"] = True
            obs = f"Illegal move: {why}. Try again.\n{self._observation()}"
            return StepOutcome(obs=obs, reward=self.illegal_reward, info=info)
        self.outcome = info["outcome"] = "illegal"
        info["success"] = False
        obs = f"Illegal move: {why}. Game over: you lose.\n{render_board(self.board)}"
        return StepOutcome(obs=obs, reward=self.illegal_reward, terminated=True, info=info)

    def _check_can_step(self) -> None:
        name = type(self).__name__
        if self._rng is None:
            raise RuntimeError(f"{name}.step called before reset(); call reset(seed) first")
        if self.outcome is not None:
            raise RuntimeError(
                f"{name}.step called after the episode ended (outcome {self.outcome!r}); "
                "call reset() to start a new game"
            )

    def _played(self, opponent_move: int | None) -> str:
        return "" if opponent_move is None else f"{self.opponent_mark} played {opponent_move}.\n"

    def _observation(self, opponent_move: int | None = None) -> str:
        if self.observation == "compact":
            return compact_text(self.board, self.agent_mark)
        text = turn_text(self.board, self.agent_mark, side_to_move(self.board))
        return self._played(opponent_move) + text
