"""The tic-tac-toe rules and minimax solver: known positions, perfect play, the state space."""

from __future__ import annotations

import random

import pytest

from ludic.envs.tictactoe_solver import (
    EMPTY_BOARD,
    apply_move,
    game_value,
    is_over,
    legal_moves,
    minimax_move,
    move_values,
    optimal_moves,
    other,
    random_move,
    side_to_move,
    winner,
)


def test_rules_winner_legal_moves_and_apply() -> None:
    assert winner("XXXOO....") == "X" and winner("X..OX.O.X") == "X"
    assert winner("O.XO.XO..") == "O" and winner("..O.O.O..") == "O"
    assert winner(EMPTY_BOARD) is None and winner("XOXXOOOXX") is None
    assert legal_moves("XO.......") == [3, 4, 5, 6, 7, 8, 9]
    assert legal_moves("XXXOO....") == []  # nobody moves after a win
    assert is_over("XOXXOOOXX") and is_over("XXXOO....") and not is_over("XO.......")
    assert apply_move(EMPTY_BOARD, 5, "X") == "....X...."
    assert apply_move("....X....", 1, "O") == "O...X...."
    assert side_to_move("....X....") == "O" and side_to_move("O...X....") == "X"
    assert other("X") == "O" and other("O") == "X"
    with pytest.raises(ValueError, match="not a legal move"):
        apply_move("....X....", 5, "O")
    with pytest.raises(ValueError, match="not a legal move"):
        apply_move(EMPTY_BOARD, 0, "X")
    with pytest.raises(ValueError, match="9-character string"):
        winner("XO")
    with pytest.raises(ValueError, match="9-character string"):
        legal_moves("XO-......")
    with pytest.raises(ValueError, match="'X' or 'O'"):
        minimax_move(EMPTY_BOARD, "x")


def test_must_win_and_must_block() -> None:
    # X to move with 1-2 taken: 3 wins at once (as does nothing else).
    assert minimax_move("XX.OO....", "X") == 3
    # Same board with O to move: O wins at 6 rather than blocking at 3.
    assert minimax_move("XX.OO....", "O") == 6
    assert move_values("XX.OO....", "O")[6] == 1
    # O must block 3 (anything else loses to X at 3).
    assert optimal_moves("XX..O....", "O") == [3]
    assert move_values("XX..O....", "O")[7] == -1
    # X must block O's 1-2-3 line even though X has its own two in 4..9.
    assert optimal_moves("OO.X...X.", "X") == [3]
    # Against a corner opening only the centre draws; against the centre only the corners.
    assert optimal_moves("X........", "O") == [5]
    assert optimal_moves("....X....", "O") == [1, 3, 7, 9]


def test_perfect_play_from_the_empty_board_is_a_draw() -> None:
    assert game_value(EMPTY_BOARD, "X") == 0
    assert optimal_moves(EMPTY_BOARD, "X") == list(range(1, 10))  # every opening draws
    for seed in range(5):
        rng, board = random.Random(seed), EMPTY_BOARD
        while not is_over(board):
            player = side_to_move(board)
            board = apply_move(board, minimax_move(board, player, rng), player)
        assert winner(board) is None and "." not in board


def test_game_value_of_finished_boards() -> None:
    assert game_value("XXXOO....", "O") == -1 and game_value("XXXOO....", "X") == 1
    assert game_value("XOXXOOOXX", "X") == 0
    with pytest.raises(ValueError, match="game is over"):
        minimax_move("XXXOO....", "O")
    with pytest.raises(ValueError, match="game is over"):
        random_move("XOXXOOOXX", random.Random(0))


def test_minimax_never_loses_to_random_play() -> None:
    rng = random.Random(0)
    for game in range(60):
        solver_mark = "X" if game % 2 == 0 else "O"
        board = EMPTY_BOARD
        while not is_over(board):
            player = side_to_move(board)
            move = minimax_move(board, player) if player == solver_mark else random_move(board, rng)
            board = apply_move(board, move, player)
        assert winner(board) in (solver_mark, None)


def test_every_reachable_position_is_solved_consistently() -> None:
    # Breadth-first over legal play: 5,478 distinct positions (the known count).
    seen, frontier = {EMPTY_BOARD}, [EMPTY_BOARD]
    while frontier:
        board = frontier.pop()
        if is_over(board):
            continue
        player = side_to_move(board)
        values = move_values(board, player)
        assert game_value(board, player) == max(values.values())
        assert minimax_move(board, player) in optimal_moves(board, player)
        for move in legal_moves(board):
            nxt = apply_move(board, move, player)
            # One ply on: the value for the mover is minus the opponent's value.
            assert values[move] == -game_value(nxt, other(player))
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert len(seen) == 5478


def test_minimax_move_ties_use_the_rng_and_prefer_fast_wins() -> None:
    # Every opening is optimal, so an rng spreads the choices; without one: lowest cell.
    assert minimax_move(EMPTY_BOARD, "X") == 1
    picks = {minimax_move(EMPTY_BOARD, "X", random.Random(s)) for s in range(40)}
    assert len(picks) > 3
    # X wins at once at 3 (row) or 7 (column); 9 also keeps a won game but wins later.
    board = "XX.XOO.O."
    assert move_values(board, "X") == {3: 1, 7: 1, 9: 1}
    assert optimal_moves(board, "X") == [3, 7, 9]
    assert {minimax_move(board, "X", random.Random(s)) for s in range(20)} == {3, 7}
