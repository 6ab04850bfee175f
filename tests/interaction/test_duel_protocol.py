"""Two LLM agents play the built-in TicTacToeDuelEnv through MultiAgentProtocol: each gets a
full rollout with the opponent's moves as observed steps and its own terminal reward."""

from __future__ import annotations

import json

from ludic.agents import Agent
from ludic.envs import TicTacToeDuelEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.types import AgentStep, Rollout


def kinds(rollout: Rollout) -> str:
    return "".join("A" if isinstance(s, AgentStep) else "E" for s in rollout.steps)


def player(*replies: str) -> Agent:
    return Agent(ScriptedClient(list(replies)), parser=xml_tag_parser("move"))


async def test_two_llm_players_get_two_correct_rollouts() -> None:
    # X: 1, 2, 3 (top row). O: 4, a reply without a move, then 5. X wins on its third move.
    x = player("<move>1</move>", "<move>2</move>", "<move>3</move>")
    o = player("<move>4</move>", "let me think", "<move>5</move>")
    rollouts = await MultiAgentProtocol({"X": x, "O": o}).run(TicTacToeDuelEnv(), env_seed=0)
    by_id = {r.agent_id: r for r in rollouts}
    rx, ro = by_id["X"], by_id["O"]
    for r in rollouts:
        assert Rollout.from_dict(json.loads(json.dumps(r.to_dict()))) == r
        assert "episode_truncated" not in r.meta

    # X: its three moves, each followed by its own outcome; O's two moves observed between.
    assert kinds(rx) == "AEEAEEAE"
    x_env = rx.env_steps
    assert [e.action for e in x_env] == ["1", None, "2", None, "3"]
    assert [e.info.get("observed", False) for e in x_env] == [False, True, False, True, False]
    assert [e.info.get("opponent_move") for e in x_env if e.info.get("observed")] == [4, 5]
    assert x_env[-1].reward == 1.0 and x_env[-1].terminated and x_env[-1].info["outcome"] == "win"
    assert rx.total_reward == 1.0

    # O: X's opening observed before it ever acted, its parse failure (no env step), its
    # moves, and X's winning move observed with O's terminal -1.
    assert kinds(ro) == "EAEEAEAEE"
    o_env = ro.env_steps
    assert o_env[0].agent_step_ids == () and "X played 1" in (o_env[0].next_obs or "")
    synthetic = o_env[3]
    assert synthetic.info["parse_error"] is True and synthetic.action is None
    assert [e.action for e in o_env] == [None, "4", None, None, "5", None]
    last = o_env[-1]
    assert last.agent_step_ids == () and last.terminated and last.reward == -1.0
    assert last.info["outcome"] == "loss" and ro.total_reward < 0
    # O's prompt for its first move showed X's move; every O step names seat O.
    first_o = ro.agent_steps[0]
    assert "X played 1" in first_o.prompt_messages[-1]["content"]
    assert {s.agent_id for s in ro.steps} == {"O"}

    # Turns: O's first turn holds only the observed opening; X's win and O's loss land in
    # the right turns.
    o_turns = ro.turns()
    assert o_turns[0].agent_steps == () and o_turns[-1].observed_steps == (last,)
    assert o_turns[-1].reward == -1.0
    assert rx.turns()[-1].reward == 1.0
    assert x.client.calls == 3 and o.client.calls == 3  # type: ignore[attr-defined]
