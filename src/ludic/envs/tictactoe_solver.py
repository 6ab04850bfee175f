"""Tic-tac-toe rules and an exact minimax solver (memoised over all 5,478 reachable positions).

A board is a 9-character string of "X", "O" and "." (empty), row by row; public helpers speak
in cell numbers 1-9 (cell = index + 1). It deliberately knows nothing about prompts, rewards or
episodes: the envs in `tictactoe.py` and `tictactoe_duel.py` build on it.
"""

from __future__ import annotations

import random
from functools import cache

EMPTY = "."
MARKS = ("X", "O")
EMPTY_BOARD = EMPTY * 9
_LINES = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8),
    (0, 3, 6), (1, 4, 7), (2, 5, 8),
    (0, 4, 8), (2, 4, 6),
)  # fmt: skip


def validate_board(board: str) -> None:
    """Raise ValueError unless `board` is 9 characters of X, O and '.'."""
    if not isinstance(board, str) or len(board) != 9 or set(board) - {"X", "O", EMPTY}:
        raise ValueError(
            f"a tic-tac-toe board is a 9-character string of 'X', 'O' and '.', got {board!r}"
        )


def _validate_player(player: str) -> None:
    if player not in MARKS:
        raise ValueError(f"player must be 'X' or 'O', got {player!r}")


def other(player: str) -> str:
    """The opponent's mark."""
    _validate_player(player)
    return "O" if player == "X" else "X"


def winner(board: str) -> str | None:
    """'X' or 'O' if that mark has three in a row, else None."""
    validate_board(board)
    return _winner(board)


def _winner(board: str) -> str | None:
    for a, b, c in _LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def _place(board: str, cell: int, player: str) -> str:
    return board[: cell - 1] + player + board[cell:]


def legal_moves(board: str) -> list[int]:
    """Empty cells (1-9) in increasing order; empty once someone has won."""
    if winner(board) is not None:
        return []
    return [i + 1 for i, cell in enumerate(board) if cell == EMPTY]


def is_over(board: str) -> bool:
    """True when a mark has won or the board is full."""
    return winner(board) is not None or EMPTY not in board


def apply_move(board: str, cell: int, player: str) -> str:
    """The board after `player` marks `cell` (1-9); ValueError if the move is not legal."""
    _validate_player(player)
    if cell not in legal_moves(board):
        raise ValueError(f"cell {cell} is not a legal move on board {board!r}")
    return _place(board, cell, player)


@cache
def _score(board: str, to_move: str) -> int:
    """Negamax score for the side to move: > 0 win, 0 draw, < 0 loss; the magnitude is
    1 + the empty cells left when the game ends, so faster wins and slower losses score higher."""
    if _winner(board) is not None:  # the previous mover won
        return -(1 + board.count(EMPTY))
    if EMPTY not in board:
        return 0
    opponent = "O" if to_move == "X" else "X"
    return max(
        -_score(_place(board, i + 1, to_move), opponent)
        for i, cell in enumerate(board)
        if cell == EMPTY
    )


def _move_scores(board: str, player: str) -> dict[int, int]:
    validate_board(board)
    _validate_player(player)
    moves = legal_moves(board)
    if not moves:
        raise ValueError(f"no legal moves on board {board!r}: the game is over")
    return {m: -_score(apply_move(board, m, player), other(player)) for m in moves}


def game_value(board: str, player: str) -> int:
    """Game-theoretic value for `player` to move under perfect play: 1 win, 0 draw, -1 loss."""
    validate_board(board)
    _validate_player(player)
    if is_over(board):
        won = winner(board)
        return 0 if won is None else (1 if won == player else -1)
    score = _score(board, player)
    return (score > 0) - (score < 0)


def move_values(board: str, player: str) -> dict[int, int]:
    """For each legal cell, the game value for `player` after playing it (1, 0 or -1)."""
    return {m: (s > 0) - (s < 0) for m, s in _move_scores(board, player).items()}


def optimal_moves(board: str, player: str) -> list[int]:
    """Cells that keep the best reachable game value (a win in 3 is as optimal as a win in 1)."""
    values = move_values(board, player)
    best = max(values.values())
    return [m for m, v in values.items() if v == best]


def minimax_move(board: str, player: str, rng: random.Random | None = None) -> int:
    """A perfect-play move for `player`: the best game value, winning fastest and losing slowest.

    Ties go to the lowest cell, or to a choice by `rng` when one is given.
    """
    scores = _move_scores(board, player)
    best = max(scores.values())
    choices = [m for m, s in scores.items() if s == best]
    return choices[0] if rng is None else rng.choice(choices)


def random_move(board: str, rng: random.Random) -> int:
    """A uniformly random legal cell."""
    moves = legal_moves(board)
    if not moves:
        raise ValueError(f"no legal moves on board {board!r}: the game is over")
    return rng.choice(moves)


def side_to_move(board: str) -> str:
    """'X' when both marks were played equally often (X moves first), else 'O'."""
    validate_board(board)
    return "X" if board.count("X") == board.count("O") else "O"
