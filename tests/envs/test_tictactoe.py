"""TicTacToeEnv: observations, rewards for win/draw/loss/illegal, retry mode, the scripted
opponents, the optimal-move check, state keys, misuse errors, and a full protocol episode."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from ludic.agents import Agent
from ludic.envs.tictactoe import TicTacToeEnv, parse_cell, render_board
from ludic.envs.tictactoe_solver import apply_move, minimax_move, optimal_moves, side_to_move
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.types import Message, Rollout


def board_from_obs(obs: str) -> str:
    """Read the 3x3 grid back out of an observation (digits are empty cells)."""
    rows = [line for line in obs.splitlines() if line.count("|") == 2]
    cells = [c.strip() for row in rows[-3:] for c in row.split("|")]
    return "".join(c if c in "XO" else "." for c in cells)


def test_observation_shows_numbering_turn_and_legal_moves() -> None:
    env = TicTacToeEnv()
    obs, info = env.env_reset(seed=0)
    assert " 1 | 2 | 3\n---+---+---\n 4 | 5 | 6\n---+---+---\n 7 | 8 | 9" in obs
    assert "Your turn (X). Legal moves: 1, 2, 3, 4, 5, 6, 7, 8, 9." in obs
    assert info == {"agent_mark": "X", "opponent": "minimax"}
    assert "<move>5</move>" in (env.system_prompt or "")
    assert (
        render_board("X...O....") == " X | 2 | 3\n---+---+---\n 4 | O | 6\n---+---+---\n 7 | 8 | 9"
    )
    assert [parse_cell(s) for s in ("5", " 9\n", "0", "10", "five", "٣", "")] == [
        5, 9, None, None, None, None, None,
    ]  # fmt: skip


def test_compact_observation_is_the_board_and_the_mark_to_play() -> None:
    env = TicTacToeEnv(observation="compact", opponent="random", illegal_move="retry")
    obs, _ = env.env_reset(seed=0)
    assert obs == "1|2|3\n4|5|6\n7|8|9\nX to move"
    out = env.env_step("5")
    reply = out.info["opponent_move"]
    expected = "".join("X" if c == 5 else "O" if c == reply else str(c) for c in range(1, 10))
    rows = "\n".join("|".join(expected[r : r + 3]) for r in (0, 3, 6))
    assert out.obs == f"{rows}\nX to move" and board_from_obs(out.obs) == env.board
    retry = env.env_step("5")
    assert retry.obs == f"Illegal move: cell 5 is taken. Try again.\n{rows}\nX to move"
    as_o, _ = TicTacToeEnv(agent_mark="O", observation="compact").env_reset(seed=1)
    assert as_o.endswith("\nO to move") and as_o.count("X") == 1
    with pytest.raises(ValueError, match="observation must be 'full' or 'compact'"):
        TicTacToeEnv(observation="short")  # type: ignore[arg-type]


def test_agent_as_o_lets_the_opponent_open() -> None:
    env = TicTacToeEnv(agent_mark="O", opponent="random")
    obs, info = env.env_reset(seed=4)
    assert env.board.count("X") == 1 and env.board.count("O") == 0
    assert obs.startswith(f"X played {info['opponent_move']}.\nYou are O.")
    assert env.env_state_key() == f"{env.board}|O"


def test_win_pays_win_reward_and_reports_the_outcome() -> None:
    env = TicTacToeEnv(win_reward=2.0)
    env.env_reset(seed=0)
    env.board = "XX.OO...."
    out = env.env_step("3")
    assert (out.reward, out.terminated) == (2.0, True)
    assert out.info == {
        **{"move": 3, "optimal_move": True, "illegal_move": False},
        **{"outcome": "win", "success": True},
    }
    assert out.obs.endswith("Game over: you win.") and env.env_state_key() == "XXXOO....|-"


def test_loss_when_the_agent_ignores_a_threat() -> None:
    env = TicTacToeEnv(opponent="minimax")
    env.env_reset(seed=0)
    env.board = "OO.X...X."
    out = env.env_step("9")
    assert out.info["optimal_move"] is False and out.info["opponent_move"] == 3
    assert (out.reward, out.terminated, out.info["outcome"]) == (-1.0, True, "loss")
    assert out.obs.startswith("O played 3.") and out.obs.endswith("Game over: you lose.")


def test_minimax_agent_draws_the_minimax_opponent_with_the_draw_reward() -> None:
    for seed in range(4):
        env = TicTacToeEnv(draw_reward=0.5)
        env.env_reset(seed=seed)
        while True:
            out = env.env_step(str(minimax_move(env.board, "X")))
            assert out.info["optimal_move"] is True
            if out.terminated:
                break
            assert out.reward == 0.0
        assert (out.reward, out.info["outcome"]) == (0.5, "draw") and "." not in env.board


@pytest.mark.parametrize("action", ["5", "banana", "", "<move>1</move>", "0", "1.0"])
def test_illegal_move_ends_the_game_with_the_penalty(action: str) -> None:
    env = TicTacToeEnv(illegal_reward=-2.0)
    env.env_reset(seed=1)
    env.board = "....X...O"
    out = env.env_step(action)
    assert (out.reward, out.terminated) == (-2.0, True)
    assert out.info["illegal_move"] is True and out.info["outcome"] == "illegal"
    assert out.info["optimal_move"] is False and out.obs.startswith("Illegal move:")
    assert env.board == "....X...O"
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.env_step("1")


def test_retry_mode_keeps_the_game_going() -> None:
    env = TicTacToeEnv(illegal_move="retry", illegal_reward=-0.1, opponent="random")
    env.env_reset(seed=2)
    env.env_step("5")
    before = env.board
    out = env.env_step("5")
    assert (out.reward, out.terminated) == (-0.1, False)
    assert out.info == {"move": 5, "optimal_move": False, "illegal_move": True, "retry": True}
    assert out.obs.startswith("Illegal move: cell 5 is taken. Try again.") and env.board == before
    legal = next(c for c in range(1, 10) if env.board[c - 1] == ".")
    assert env.env_step(str(legal)).info["illegal_move"] is False


def test_misuse_raises_clear_errors() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        TicTacToeEnv().env_step("5")
    with pytest.raises(ValueError, match="opponent must be one of"):
        TicTacToeEnv(opponent="perfect")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epsilon"):
        TicTacToeEnv(opponent="mixed", epsilon=1.5)
    with pytest.raises(ValueError, match="illegal_move"):
        TicTacToeEnv(illegal_move="ignore")  # type: ignore[arg-type]


def play_first_legal(env: TicTacToeEnv, seed: int) -> list[tuple[str, int | None]]:
    """Keys and opponent replies of a game where the agent always takes the lowest cell."""
    env.env_reset(seed=seed)
    trace: list[tuple[str, int | None]] = []
    while env.outcome is None:
        cell = next(c for c in range(1, 10) if env.board[c - 1] == ".")
        out = env.env_step(str(cell))
        trace.append((str(env.env_state_key()), out.info.get("opponent_move")))
    return trace


def test_opponents_are_seeded_and_behave_as_named() -> None:
    random_env = TicTacToeEnv(opponent="random")
    games = [play_first_legal(random_env, s) for s in range(12)]
    assert games[3] == play_first_legal(TicTacToeEnv(opponent="random"), 3)  # deterministic
    assert len({g[0][1] for g in games}) > 3  # seeds change the random replies
    # Minimax punishes "always the lowest cell" in every game; seeds only break its ties.
    minimax = TicTacToeEnv(opponent="minimax")
    for seed in range(12):
        play_first_legal(minimax, seed)
        assert minimax.outcome == "loss"
    # "mixed": epsilon 0 only ever plays optimal replies; epsilon 1 sometimes blunders.
    assert opponent_optimality(TicTacToeEnv(opponent="mixed", epsilon=0.0)) == {True}
    assert opponent_optimality(TicTacToeEnv(opponent="mixed", epsilon=1.0)) == {True, False}
    assert opponent_optimality(TicTacToeEnv(opponent="minimax")) == {True}
    assert opponent_optimality(TicTacToeEnv(opponent="random")) == {True, False}


def opponent_optimality(env: TicTacToeEnv) -> set[bool]:
    """Whether each opponent reply over 20 games was minimax-optimal."""
    optimal = set()
    for seed in range(20):
        env.env_reset(seed=seed)
        while env.outcome is None:
            cell = next(c for c in range(1, 10) if env.board[c - 1] == ".")
            after_agent = apply_move(env.board, cell, "X")
            reply = env.env_step(str(cell)).info.get("opponent_move")
            if reply is not None:
                optimal.add(reply in optimal_moves(after_agent, "O"))
    return optimal


def test_state_keys_repeat_across_episodes_with_different_seeds() -> None:
    env = TicTacToeEnv(opponent="random")
    keys_by_seed = []
    for seed in range(8):
        env.env_reset(seed=seed)
        keys = [env.env_state_key()]
        env.env_step("5")
        keys.append(env.env_state_key())
        keys_by_seed.append(set(keys))
    assert all(".........|X" in keys for keys in keys_by_seed)
    after_first_move = [k for keys in keys_by_seed for k in keys if k != ".........|X"]
    assert len(set(after_first_move)) < len(after_first_move)  # some seeds share a later state
    assert all(str(k).endswith("|X") for k in after_first_move)


def minimax_reply(messages: Sequence[Message]) -> str:
    board = board_from_obs(messages[-1]["content"] or "")
    return f"I play <move>{minimax_move(board, side_to_move(board))}</move>"


async def test_a_full_episode_through_the_single_agent_protocol() -> None:
    agent = Agent(ScriptedClient(minimax_reply), parser=xml_tag_parser("move"))
    protocol = SingleAgentProtocol(agent, max_steps=9)
    (rollout,) = await protocol.run(TicTacToeEnv(), env_seed=7)
    assert Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))) == rollout
    steps = rollout.env_steps
    assert steps[-1].terminated and steps[-1].info["outcome"] == "draw"
    assert all(s.info["optimal_move"] for s in steps) and rollout.total_reward == 0.0
    assert rollout.agent_steps[0].prompt_messages[0]["content"] == TicTacToeEnv.system_prompt
