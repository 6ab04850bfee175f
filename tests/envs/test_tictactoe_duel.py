"""TicTacToeDuelEnv: turn order, outcomes for the mover AND the waiting seat, terminal rewards
for both, illegal moves, misuse errors, and two correct rollouts from the multi-agent protocol."""

from __future__ import annotations

import json

import pytest

from ludic.agents import Agent
from ludic.envs.tictactoe_duel import TicTacToeDuelEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.types import Rollout, StepOutcome


def play(env: TicTacToeDuelEnv, *cells: str) -> dict[str, StepOutcome]:
    """Alternate moves from the side to move; return the last step's outcomes."""
    out: dict[str, StepOutcome] = {}
    for cell in cells:
        (mover,) = env.active_agents
        out = dict(env.step({mover: cell}))
    return out


def test_reset_and_turn_order() -> None:
    env = TicTacToeDuelEnv()
    assert env.agent_ids == ("X", "O") and env.active_agents == ()
    resets = env.reset(seed=0)
    assert set(resets) == {"X", "O"} and resets["O"][1] == {"mark": "O"}
    assert "Your turn (X)" in resets["X"][0] and "Waiting for X to move." in resets["O"][0]
    assert env.active_agents == ("X",)
    outs = env.step({"X": "5"})
    assert set(outs) == {"X", "O"} and env.active_agents == ("O",)
    assert outs["X"].info == {"move": 5, "optimal_move": True, "illegal_move": False}
    assert "Waiting for O to move." in outs["X"].obs and outs["X"].reward == 0.0
    # The waiting seat observes the move it did not make.
    assert outs["O"].obs.startswith("X played 5.\nYou are O.") and "Your turn (O)" in outs["O"].obs
    assert outs["O"].info == {"opponent_move": 5} and not outs["O"].terminated
    assert env.state_key("X") == env.state_key("O") == "....X....|O"


def test_win_gives_the_mover_plus_one_and_the_other_minus_one() -> None:
    env = TicTacToeDuelEnv()
    env.reset()
    # X: 1, 2, 3 (top row); O: 4, 5.
    outs = play(env, "1", "4", "2", "5", "3")
    x, o = outs["X"], outs["O"]
    assert (x.reward, x.terminated, x.info["outcome"]) == (1.0, True, "win")
    assert (o.reward, o.terminated, o.info["outcome"]) == (-1.0, True, "loss")
    assert o.info["opponent_move"] == 3 and o.obs.startswith("X played 3.")
    assert o.obs.endswith("Game over: you lose.") and env.active_agents == ()
    assert env.state_key("O") == "XXXOO....|-"


def test_o_can_win_and_x_then_loses() -> None:
    env = TicTacToeDuelEnv(win_reward=3.0, loss_reward=-2.0)
    env.reset()
    outs = play(env, "1", "4", "2", "5", "9", "6")
    assert outs["O"].reward == 3.0 and outs["X"].reward == -2.0
    assert outs["X"].info == {"opponent_move": 6, "outcome": "loss", "success": False}
    assert outs["O"].info["success"] is True


def test_draw_gives_both_the_draw_reward() -> None:
    env = TicTacToeDuelEnv(draw_reward=0.5)
    env.reset()
    # Final board: X O X / X O O / O X X
    outs = play(env, "1", "2", "3", "5", "4", "6", "8", "7", "9")
    for aid in ("X", "O"):
        out = outs[aid]
        assert (out.reward, out.terminated, out.info["outcome"]) == (0.5, True, "draw")
    assert env.board == "XOXXOOOXX"


@pytest.mark.parametrize("action", ["5", "ten", "", "\x00"])
def test_illegal_move_loses_for_the_mover(action: str) -> None:
    env = TicTacToeDuelEnv(illegal_reward=-5.0)
    env.reset()
    env.step({"X": "5"})
    outs = env.step({"O": action})
    assert (outs["O"].reward, outs["O"].info["outcome"]) == (-5.0, "illegal")
    assert outs["O"].info["illegal_move"] is True and outs["O"].obs.startswith("Illegal move:")
    assert (outs["X"].reward, outs["X"].info["outcome"]) == (1.0, "win")
    assert outs["X"].info["opponent_illegal_move"] is True
    assert outs["X"].terminated and outs["O"].terminated and env.active_agents == ()


def test_misuse_raises_clear_errors() -> None:
    env = TicTacToeDuelEnv(x_id="alice", o_id="bob")
    with pytest.raises(RuntimeError, match="before reset"):
        env.step({"alice": "5"})
    env.reset()
    with pytest.raises(KeyError, match="'alice', the side to move"):
        env.step({"bob": "5"})
    with pytest.raises(ValueError, match=r"\['bob'\], who are not to move"):
        env.step({"alice": "5", "bob": "1"})
    play(env, "1", "4", "2", "5", "3")
    with pytest.raises(RuntimeError, match="after the game ended"):
        env.step({"bob": "6"})
    with pytest.raises(ValueError, match="two different names"):
        TicTacToeDuelEnv(x_id="same", o_id="same")


async def test_two_llm_players_get_two_correct_rollouts() -> None:
    move = xml_tag_parser("move")
    x = Agent(ScriptedClient(["<move>1</move>", "<move>2</move>", "<move>3</move>"]), parser=move)
    o = Agent(ScriptedClient(["<move>4</move>", "<move>5</move>"]), parser=move)
    rollouts = await MultiAgentProtocol({"X": x, "O": o}).run(TicTacToeDuelEnv(), env_seed=0)
    by_id = {r.agent_id: r for r in rollouts}
    for r in rollouts:
        assert Rollout.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert by_id["X"].total_reward == 1.0 and by_id["O"].total_reward == -1.0
    # X: its 3 moves and O's 2 observed moves; O: its 2 moves and X's 3 observed moves.
    x_steps, o_steps = by_id["X"].env_steps, by_id["O"].env_steps
    assert [s.action for s in x_steps] == ["1", None, "2", None, "3"]
    assert [s.action for s in o_steps] == [None, "4", None, "5", None]
    assert o_steps[-1].terminated and o_steps[-1].reward == -1.0
    assert o_steps[-1].info["observed"] is True and o_steps[-1].info["outcome"] == "loss"
    assert (o_steps[0].next_obs or "").startswith("X played 1.")
    assert [s.state_key for s in x_steps][-1] == "XXXOO....|-"
