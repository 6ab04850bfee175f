"""Termination rules (seed 003 Task 2.3): each condition ends the episode and is recorded with
its reason in the last env step's info and in rollout meta."""

from __future__ import annotations

import json
import re

import pytest
from interaction_fakes import TapeEnv

from ludic.agents import Agent, ToolAgent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import (
    ContextBudget,
    CriticalError,
    MaxSteps,
    OutputRegex,
    SingleAgentProtocol,
    TerminateAction,
    Termination,
    TerminationRule,
    TurnView,
)
from ludic.parsers import xml_tag_parser
from ludic.types import Rollout, StepOutcome


async def run(
    replies: list, rules: list[TerminationRule], env: TapeEnv | None = None, **kwargs: object
) -> tuple[Rollout, TapeEnv]:
    env = env or TapeEnv()
    agent = kwargs.pop("agent", None) or Agent(ScriptedClient(replies))
    protocol = SingleAgentProtocol(agent, termination=rules, **kwargs)  # type: ignore[arg-type]
    (rollout,) = await protocol.run(env, env_seed=0)
    return rollout, env


def last_env(rollout: Rollout):
    return rollout.env_steps[-1]


async def test_max_steps_truncates_with_reason() -> None:
    rollout, env = await run(["go"], [MaxSteps(max_steps=3)])
    assert env.seen == ["go"] * 3
    last = last_env(rollout)
    assert (last.terminated, last.truncated, last.truncation_reason) == (False, True, "max_steps")
    assert last.info["termination_reason"] == "max_steps"
    assert rollout.meta["termination_reason"] == "max_steps"
    assert rollout.meta["episode_truncated"] is True
    assert rollout.meta["truncation_reason"] == "max_steps"
    assert [s.truncated for s in rollout.env_steps] == [False, False, True]


async def test_terminate_action_ends_before_the_env_sees_it() -> None:
    rollout, env = await run(["go", " TERMINATE "], [TerminateAction(), MaxSteps(max_steps=9)])
    assert env.seen == ["go"]
    last = last_env(rollout)
    assert last.terminated and not last.truncated and last.next_obs is None
    assert last.action == "TERMINATE" and last.info["synthetic"] is True
    assert last.info["termination_reason"] == "terminate_action"
    assert rollout.meta["termination_reason"] == "terminate_action"
    assert rollout.meta.get("episode_truncated") is None
    assert rollout.total_reward == 1.0  # only the env step that happened
    case = await run(["Terminate"], [TerminateAction(case_sensitive=True), MaxSteps(max_steps=2)])
    assert case[1].seen == ["Terminate", "Terminate"]


async def test_output_regex_lets_the_env_score_the_final_answer_first() -> None:
    rollout, env = await run(
        ["thinking", "FINAL: 42"], [OutputRegex(pattern=r"FINAL: \d+"), MaxSteps(max_steps=9)]
    )
    assert env.seen == ["thinking", "FINAL: 42"]
    last = last_env(rollout)
    assert last.terminated and last.reward == 1.0
    assert last.info["termination_reason"] == "output_regex"
    assert last.info["termination_detail"] == "FINAL: 42"
    assert rollout.meta["termination_detail"] == "FINAL: 42"


async def test_output_regex_before_env_and_on_raw_output_not_the_parsed_action() -> None:
    # The parser extracts <move>, the regex looks at the whole raw completion.
    agent = Agent(ScriptedClient(["<move>1</move>", "<move>2</move> I give up"]))
    agent.parser = xml_tag_parser("move")
    rule = OutputRegex(pattern="give up", flags=re.IGNORECASE, before_env=True)
    rollout, env = await run([], [rule, MaxSteps(max_steps=9)], agent=agent)
    assert env.seen == ["1"]
    assert last_env(rollout).action == "2" and last_env(rollout).info["synthetic"]
    assert rollout.meta["termination_reason"] == "output_regex"


async def test_critical_error_reported_by_the_env() -> None:
    rollout, env = await run(
        ["go"], [CriticalError(), MaxSteps(max_steps=9)], TapeEnv(critical_at=2)
    )
    assert env.seen == ["go", "go"]
    last = last_env(rollout)
    assert last.terminated and last.info["termination_reason"] == "critical_error"
    assert rollout.meta["termination_detail"] == "disk on fire"
    assert not rollout.failed  # reported, not raised: the episode is kept


async def test_critical_error_on_consecutive_parse_failures() -> None:
    agent = Agent(ScriptedClient(["<move>1</move>", "junk", "junk", "junk"]))
    agent.parser = xml_tag_parser("move")
    rule = CriticalError(max_consecutive_parse_errors=2)
    rollout, env = await run([], [rule, MaxSteps(max_steps=9)], agent=agent)
    assert env.seen == ["1"]
    assert len(rollout.env_steps) == 3
    assert rollout.meta["termination_detail"] == "2 parse errors in a row"


async def test_critical_error_on_a_failing_tool() -> None:
    def boom(x: int) -> int:
        """Always fails."""
        raise RuntimeError("no")

    call = '<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>'
    agent = ToolAgent(ScriptedClient([call, "go"]), tools=[boom])
    rule = CriticalError(fatal_tool_errors=True)
    rollout, env = await run([], [rule, MaxSteps(max_steps=9)], agent=agent)
    assert env.seen == []
    assert rollout.meta["termination_reason"] == "critical_error"
    assert "RuntimeError: no" in rollout.meta["termination_detail"]


async def test_context_budget_truncates_with_max_seq_len() -> None:
    # Byte-level ids: the prompt grows by every observation; a tight budget cuts turn 3.
    rule = ContextBudget(max_tokens=70)
    rollout, env = await run(["go"], [rule, MaxSteps(max_steps=9)])
    sizes = [
        len(s.trace.prompt_token_ids) + len(s.trace.completion_token_ids)
        for s in rollout.agent_steps
        if s.trace
    ]
    assert all(n <= 70 for n in sizes[:-1]) and sizes[-1] > 70
    assert len(env.seen) == len(sizes) - 1
    last = last_env(rollout)
    assert (last.truncated, last.truncation_reason) == (True, "max_seq_len")
    assert rollout.meta["truncation_reason"] == "max_seq_len"
    assert rollout.meta["termination_reason"] == "context_budget"


async def test_the_env_ending_the_episode_is_recorded_too_and_rules_go_in_order() -> None:
    rollout, _ = await run(["go"], [MaxSteps(max_steps=2)], TapeEnv(end_at=2))
    assert rollout.meta["termination_reason"] == "env_terminated"
    assert last_env(rollout).terminated and not last_env(rollout).truncated
    # Both rules fire on turn 1; the first listed wins.
    first, _ = await run(["FINAL"], [OutputRegex(pattern="FINAL"), MaxSteps(max_steps=1)])
    assert first.meta["termination_reason"] == "output_regex"
    second, _ = await run(["FINAL"], [MaxSteps(max_steps=1), OutputRegex(pattern="FINAL")])
    assert second.meta["termination_reason"] == "max_steps"


async def test_step_records_hold_what_seed_003_asks_for() -> None:
    async def value(obs: str, state_key: str | None) -> float:
        return float(len(obs)) + (0.5 if state_key == "0" else 0.0)

    rollout, _ = await run(["go"], [MaxSteps(max_steps=2)], value_estimator=value)
    a0, a1 = rollout.agent_steps
    e0, _ = rollout.env_steps
    assert a0.info["observation"] == "start" == e0.prev_obs  # observation
    assert a0.info["value_estimate"] == 5.5 and a1.info["value_estimate"] == 5.0
    assert a0.completion == "go" and e0.action == "go"  # raw output / action
    assert a0.trace is not None and a0.trace.completion_logprobs is not None  # logprobs
    assert len(a0.trace.completion_logprobs) == len(a0.trace.completion_token_ids)
    assert e0.index == 0 and not e0.terminated and e0.state_key == "1"  # index, done, key
    assert json.loads(json.dumps(rollout.to_dict())) == rollout.to_dict()


def test_max_steps_and_a_disagreeing_max_steps_rule_is_an_error_and_rules_validate() -> None:
    with pytest.raises(ValueError, match="MaxSteps"):
        SingleAgentProtocol(
            Agent(ScriptedClient(["x"])), max_steps=5, termination=[MaxSteps(max_steps=3)]
        )
    with pytest.raises(ValueError, match="invalid pattern"):
        OutputRegex(pattern="(")
    with pytest.raises(ValueError, match=">= 1"):
        MaxSteps(max_steps=0)
    with pytest.raises(ValueError, match=">= 1"):
        CriticalError(max_consecutive_parse_errors=0)
    with pytest.raises(ValueError, match=">= 1"):
        ContextBudget(max_tokens=0)


async def test_an_env_that_raises_fails_the_episode_and_is_still_closed() -> None:
    class Broken(TapeEnv):
        closed = False

        def env_step(self, action: str) -> StepOutcome:
            raise RuntimeError("env exploded")

        def close(self) -> None:
            self.closed = True

    env = Broken()
    with pytest.raises(RuntimeError, match="exploded"):
        await run(["go"], [CriticalError(), MaxSteps(max_steps=3)], env)
    assert env.closed


async def test_a_custom_rule_sees_both_phases_with_the_history() -> None:
    seen: list[tuple[str, int, bool]] = []

    class Spy:
        def check(self, turn: TurnView) -> Termination | None:
            seen.append((turn.phase, len(turn.env_steps), turn.env_step is None))
            return None

    assert isinstance(Spy(), TerminationRule)
    await run(["go"], [Spy(), MaxSteps(max_steps=2)])
    assert seen == [("act", 0, True), ("env", 1, False), ("act", 1, True), ("env", 2, False)]
