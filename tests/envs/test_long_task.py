"""MemoryCorridorEnv: rules, state keys, the context-length penalty, and the point of the task:
with a small budget, only an agent that deletes old rooms from its context reaches the exit."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest

from ludic.agents import Agent
from ludic.agents.context_editing import ContextEditingAgent
from ludic.envs.long_task import MemoryCorridorEnv, context_length_penalty
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import ContextBudget, MaxSteps, SingleAgentProtocol
from ludic.types import Message, Rollout


def test_reset_is_seeded_and_the_note_room_holds_the_code() -> None:
    env = MemoryCorridorEnv(length=5, filler_words=4)
    obs, info = env.env_reset(seed=3)
    again = MemoryCorridorEnv(length=5, filler_words=4)
    assert again.env_reset(seed=3) == (obs, info)
    assert obs.startswith("Room 1 of 5.")
    assert 1 <= env.code_room <= 4 and len(env.code) == 1
    seen = []
    for _ in range(4):
        seen.append(env.env_step("next").obs)
    notes = [o for o in [obs, *seen] if f"the code is {env.code}." in o]
    assert len(notes) == 1 and notes[0].startswith(f"Room {env.code_room} of 5.")
    assert seen[-1] == "Room 5 of 5: the exit. The door asks for the code."
    rooms = {MemoryCorridorEnv(code_digits=3).env_reset(seed=s)[1]["code_room"] for s in range(20)}
    assert len(rooms) > 1
    binary = MemoryCorridorEnv(code_digits=4, code_alphabet="01")
    binary.env_reset(seed=5)
    assert len(binary.code) == 4 and set(binary.code) <= {"0", "1"}
    with pytest.raises(ValueError, match="code_alphabet"):
        MemoryCorridorEnv(code_alphabet="")


def test_moves_bounds_answers_and_state_keys() -> None:
    env = MemoryCorridorEnv(length=3, filler_words=2, invalid_penalty=-0.1)
    env.env_reset(seed=0)
    env.code_room, env.code, env.seen_code = 2, "7", False
    assert env.env_state_key() == (1, 0)
    out = env.env_step("back")
    assert out.obs.startswith("There is no room that way.") and env.room == 1
    assert env.env_step("Next").info == {"room": 2} and env.env_state_key() == (2, 1)
    early = env.env_step("answer 7")
    assert early.info["invalid_action"] and early.reward == -0.1 and not early.terminated
    junk = env.env_step("dance")
    assert "Unknown action 'dance'" in junk.obs and junk.reward == -0.1
    env.env_step("back")
    assert env.env_state_key() == (1, 1)  # the note was seen: a different state than at start
    env.env_step("next")
    env.env_step("next")
    assert env.env_state_key() == (3, 1)
    win = env.env_step("answer 7")
    assert (win.reward, win.terminated, win.info) == (1.0, True, {"success": True})
    with pytest.raises(RuntimeError, match="reset"):
        env.env_step("next")
    env.env_reset(seed=0)
    env.code = "7"
    env.env_step("next")
    env.env_step("next")
    lose = env.env_step("answer 8")
    assert (lose.reward, lose.terminated, lose.info["success"]) == (0.0, True, False)


def test_context_length_penalty() -> None:
    # -coef * max(0, n - budget) / budget
    assert context_length_penalty(100, budget_tokens=100) == 0.0
    assert context_length_penalty(150, budget_tokens=100) == -0.5
    assert context_length_penalty(300, budget_tokens=100, coef=0.5) == -1.0
    env = MemoryCorridorEnv(context_budget_tokens=200, penalty_coef=2.0)
    assert env.context_penalty(250) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="budget_tokens"):
        context_length_penalty(1, budget_tokens=0)
    with pytest.raises(ValueError, match="length"):
        MemoryCorridorEnv(length=1)


def walker(*, deletes: bool):
    """A scripted policy: walk to the exit, answer the code it still has in context; with
    `deletes`, first remove every observation but the code note and the current room."""

    def reply(messages: Sequence[Message]) -> str:
        last = messages[-1]
        observations = [m for m in messages if m["role"] == "user"]
        old = [
            int(m["content"][2 : m["content"].index("]")])  # "[#12] Room ..."
            for m in observations[:-1]
            if deletes and "the code is" not in m["content"]
        ]
        if old and last["role"] == "user":
            args = {"name": "delete_context", "arguments": {"message_ids": old}}
            return f"<tool_call>{json.dumps(args)}</tool_call>"
        if "the exit" in observations[-1]["content"]:
            codes = re.findall(r"the code is (\d)", " ".join(m["content"] for m in messages))
            return f"answer {codes[0] if codes else '?'}"
        return "next"

    return reply


async def run_walker(agent: Agent, env: MemoryCorridorEnv) -> Rollout:
    rules = [ContextBudget(max_tokens=env.context_budget_tokens), MaxSteps(max_steps=20)]
    (rollout,) = await SingleAgentProtocol(agent, termination=rules).run(env, env_seed=1)
    return rollout


async def test_full_history_overflows_the_budget_but_deleting_reaches_the_exit() -> None:
    def make_env() -> MemoryCorridorEnv:
        return MemoryCorridorEnv(length=6, filler_words=30, context_budget_tokens=1000)

    keeper = Agent(ScriptedClient(walker(deletes=False)))
    full = await run_walker(keeper, make_env())
    assert full.meta["termination_reason"] == "context_budget"
    assert full.meta["truncation_reason"] == "max_seq_len" and full.total_reward == 0.0

    env = make_env()
    deleter = ContextEditingAgent(ScriptedClient(walker(deletes=True)), instructions=None)
    done = await run_walker(deleter, env)
    assert done.meta["termination_reason"] == "env_terminated"
    assert done.total_reward == 1.0
    edits = [s for s in done.agent_steps if "context_edits" in s.info]
    assert len(edits) >= 3  # it had to delete several times on the way
    longest = max(
        len(s.trace.prompt_token_ids) + len(s.trace.completion_token_ids)
        for s in done.agent_steps
        if s.trace
    )
    assert longest <= 1000
    # The note survived every deletion: the code is still in the final prompt.
    assert f"the code is {env.code}" in json.dumps(done.agent_steps[-1].prompt_messages)
