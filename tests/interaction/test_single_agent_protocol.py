"""SingleAgentProtocol: every row of the truncation semantics (seed 000), parse failures that
never reach the env, external tool round trips, seeds and bookkeeping."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

import pytest
from interaction_fakes import CountingEnv

from ludic.agents import Agent, ReActAgent, ToolAgent, ToolResultTypeError
from ludic.agents.base import INCOMPLETE_FEEDBACK
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol, ToolCallContext
from ludic.parsers import xml_tag_parser
from ludic.types import AgentStep, EnvironmentStep, Rollout, ToolCall, ToolResult

MOVE = xml_tag_parser("move", penalty=-0.5)


async def run(
    replies: Sequence[str | tuple[str, str]],
    env: CountingEnv,
    *,
    max_steps: int = 10,
    **agent_kwargs: object,
) -> tuple[Rollout, ScriptedClient]:
    client = ScriptedClient(list(replies))
    agent = Agent(client, parser=MOVE, **agent_kwargs)  # type: ignore[arg-type]
    (rollout,) = await SingleAgentProtocol(agent, max_steps=max_steps).run(env, env_seed=5)
    assert Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))) == rollout
    return rollout, client


async def test_env_termination_ends_the_episode() -> None:
    env = CountingEnv(length=2)
    rollout, _ = await run(["<move>good</move>", "<move>bad</move>"], env)
    assert [type(s).__name__ for s in rollout.steps] == [
        "AgentStep",
        "EnvironmentStep",
        "AgentStep",
        "EnvironmentStep",
    ]
    e0, e1 = rollout.env_steps
    a0, a1 = rollout.agent_steps
    assert (e0.prev_obs, e0.action, e0.next_obs, e0.reward) == (
        "state 0 (seed 5)",
        "good",
        "state 1",
        1.0,
    )
    assert (e1.prev_obs, e1.next_obs, e1.terminated, e1.truncated) == (
        "state 1",
        "state 2",
        True,
        False,
    )
    assert e1.truncation_reason is None and e0.agent_step_ids == (a0.id,)
    assert (e0.turn_id, e1.turn_id) == (a0.turn_id, a1.turn_id) and a0.turn_id != a1.turn_id
    assert [e0.index, e1.index] == [0, 1] and [a0.index, a1.index] == [0, 1]
    assert e0.info == {"t": 1} and e0.state_key == "1"
    assert a0.info["state_key"] == "0" and a0.info["observation"] == "state 0 (seed 5)"
    assert "episode_truncated" not in rollout.meta and rollout.meta["env_seed"] == 5
    assert rollout.total_reward == 1.0 and env.closed == 1
    assert [t.env_step for t in rollout.turns()] == [e0, e1]


async def test_env_truncation_is_reason_env() -> None:
    rollout, _ = await run(["<move>x</move>"], CountingEnv(length=1, truncate=True))
    (e,) = rollout.env_steps
    assert e.truncated and not e.terminated and e.truncation_reason == "env"
    assert rollout.meta["episode_truncated"] is True and rollout.meta["truncation_reason"] == "env"


async def test_max_steps_truncates_the_last_step() -> None:
    env = CountingEnv(length=None)
    rollout, _ = await run(["<move>x</move>"], env, max_steps=3)
    steps = rollout.env_steps
    assert len(steps) == 3 and len(env.actions) == 3
    assert [s.truncated for s in steps] == [False, False, True]
    last = steps[-1]
    assert last.truncation_reason == "max_steps" and last.info["truncation_reason"] == "max_steps"
    assert not last.terminated and last.next_obs == "state 3" and last.info["t"] == 3
    assert rollout.meta["episode_truncated"] is True
    assert rollout.meta["truncation_reason"] == "max_steps"


async def test_max_steps_on_a_parse_failure_keeps_the_synthetic_next_obs() -> None:
    env = CountingEnv(length=None)
    rollout, _ = await run(["<move>x</move>", "no tag"], env, max_steps=2)
    last = rollout.env_steps[-1]
    assert last.truncated and last.truncation_reason == "max_steps"
    assert last.info["parse_error"] is True and last.info["synthetic"] is True
    assert last.next_obs is not None and "Could not find <move>" in last.next_obs
    assert len(env.actions) == 1


async def test_ending_exactly_at_max_steps_is_not_truncation() -> None:
    rollout, _ = await run(["<move>x</move>"], CountingEnv(length=2), max_steps=2)
    assert rollout.env_steps[-1].terminated and not rollout.env_steps[-1].truncated
    assert "episode_truncated" not in rollout.meta


async def test_finish_reason_is_separate_from_truncation() -> None:
    env = CountingEnv(length=1)
    rollout, _ = await run(
        [("<move>x</move> tail", "length")], env, reject_incomplete_completions=False
    )
    (a,) = rollout.agent_steps
    (e,) = rollout.env_steps
    assert a.finish_reason == "length" and a.info["finish_reason"] == "length"
    assert e.action == "x" and e.terminated and not e.truncated and e.truncation_reason is None
    assert "episode_truncated" not in rollout.meta and env.actions == ["x"]


async def test_incomplete_completion_is_a_parse_failure_with_feedback() -> None:
    env = CountingEnv(length=1)
    rollout, client = await run(
        [("<move>good</move> but cut", "length"), "<move>good</move>"],
        env,
        reject_incomplete_completions=True,
    )
    a0, a1 = rollout.agent_steps
    synthetic, real = rollout.env_steps
    assert env.actions == ["good"]  # the cut-off reply never reached the env
    assert a0.info["incomplete_completion"] is True and a0.info["finish_reason"] == "length"
    assert a0.reward < 0 and a0.parse_result is not None and a0.parse_result.action is None
    assert synthetic.info["incomplete_completion"] is True and synthetic.info["parse_error"]
    assert synthetic.action is None and synthetic.next_obs == INCOMPLETE_FEEDBACK
    assert synthetic.agent_step_ids == (a0.id,) and synthetic.reward == 0.0
    # The raw cut-off text and then the feedback are in the next prompt.
    assert a1.prompt_messages[-2:] == (
        {"role": "assistant", "content": "<move>good</move> but cut"},
        {"role": "user", "content": INCOMPLETE_FEEDBACK},
    )
    assert real.prev_obs == "state 0 (seed 5)" and real.terminated
    assert len(client.requests) == 2


@pytest.mark.parametrize("reply", ["no tag", "<move></move>", "<move>unclosed"])
async def test_parse_failure_never_steps_the_env(reply: str) -> None:
    env = CountingEnv(length=1)
    rollout, _ = await run([reply, "<move>good</move>"], env)
    assert env.actions == ["good"]
    bad, good = rollout.agent_steps
    synthetic, real = rollout.env_steps
    assert bad.reward == -0.5 and bad.info["parse_error"] is True
    assert synthetic.prev_obs == "state 0 (seed 5)" and synthetic.action is None
    assert synthetic.state_key == "0" and not synthetic.terminated and not synthetic.truncated
    assert good.prompt_messages[-1] == {"role": "user", "content": synthetic.next_obs}
    assert good.info["observation"] == "state 0 (seed 5)"  # state unchanged
    assert real.index == 1 and rollout.total_reward == pytest.approx(-0.5 + 1.0)
    turns = rollout.turns()
    assert [t.env_step for t in turns] == [synthetic, real]
    assert turns[0].reward == -0.5


async def test_react_agent_internal_tools_then_env_step_in_one_turn() -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    client = ScriptedClient(
        [
            '<think>use the tool</think><tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}'
            "</tool_call>",
            "<move>good</move>",
        ]
    )
    agent = ReActAgent(client, tools=[add], parser=MOVE)
    env = CountingEnv(length=1)
    (rollout,) = await SingleAgentProtocol(agent).run(env)
    tool_step, final = rollout.agent_steps
    (e,) = rollout.env_steps
    assert [tool_step.action_target, final.action_target] == ["internal", "env"]
    assert tool_step.turn_id == final.turn_id == e.turn_id
    assert e.agent_step_ids == (tool_step.id, final.id)
    assert tool_step.trace is not None and final.trace is not None
    assert final.prompt_messages[-1]["role"] == "tool"
    assert final.prompt_messages[-1]["content"] == "5"
    (turn,) = rollout.turns()
    assert turn.agent_steps == (tool_step, final) and turn.env_step == e


def ask(question: str) -> str:
    """Ask the protocol."""
    raise AssertionError("external")


EXTERNAL_CALL = '<tool_call>{"name": "ask", "arguments": {"question": "q?"}}</tool_call>'


async def run_external(
    handler: object, replies: Sequence[str], **kwargs: object
) -> tuple[Rollout, CountingEnv]:
    agent = ToolAgent(ScriptedClient(list(replies)), external_tools=[ask], parser=MOVE)
    env = CountingEnv(length=1)
    protocol = SingleAgentProtocol(agent, external_tool_handler=handler, **kwargs)  # type: ignore[arg-type]
    (rollout,) = await protocol.run(env)
    return rollout, env


async def test_external_tools_go_to_the_handler_and_results_come_back() -> None:
    seen: list[tuple[list[str], ToolCallContext]] = []

    async def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        seen.append(([c.name for c in calls], ctx))
        return [ToolResult(tool_call_id=c.id, name=c.name, content="answer!") for c in calls]

    rollout, env = await run_external(handler, [EXTERNAL_CALL, "<move>good</move>"])
    external, final = rollout.agent_steps
    (e,) = rollout.env_steps
    assert external.action_target == "external" and external.parse_result is None
    assert [r.content for r in external.tool_results] == ["answer!"]
    assert external.tool_results[0].tool_call_id == external.tool_calls[0].id
    assert final.action_target == "env" and env.actions == ["good"]
    assert [external.loop_index, final.loop_index] == [0, 1]
    assert e.agent_step_ids == (external.id, final.id)
    assert final.prompt_messages[-1] == external.tool_results[0].to_message()
    ((names, ctx),) = seen
    assert names == ["ask"] and ctx.rollout_id == rollout.id
    assert ctx.agent_step_id == external.id and ctx.turn_id == external.turn_id
    assert ctx.agent_id == "agent_0"


async def test_external_tools_without_handler_get_error_results() -> None:
    rollout, _ = await run_external(None, [EXTERNAL_CALL, "<move>good</move>"])
    (result,) = rollout.agent_steps[0].tool_results
    assert result.is_error and "no handler for external tools" in result.content


async def test_a_failing_or_forgetful_handler_gives_error_results() -> None:
    async def raising(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        raise ConnectionError("down")

    rollout, _ = await run_external(raising, [EXTERNAL_CALL, "<move>good</move>"])
    (result,) = rollout.agent_steps[0].tool_results
    assert result.is_error and "ConnectionError: down" in result.content

    async def forgetful(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        return []

    rollout, _ = await run_external(forgetful, [EXTERNAL_CALL, "<move>good</move>"])
    (result,) = rollout.agent_steps[0].tool_results
    assert result.is_error and "returned no result" in result.content
    assert rollout.agent_steps[1].prompt_messages[-1] == result.to_message()


async def test_a_sync_handler_runs_on_a_worker_thread() -> None:
    threads: list[int] = []

    def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        threads.append(threading.get_ident())
        return [ToolResult(tool_call_id=c.id, name=c.name, content="sync answer") for c in calls]

    rollout, env = await run_external(handler, [EXTERNAL_CALL, "<move>good</move>"])
    (result,) = rollout.agent_steps[0].tool_results
    assert not result.is_error and result.content == "sync answer" and env.actions == ["good"]
    assert threads and threads[0] != threading.get_ident()


@pytest.mark.parametrize(
    ("returned", "named"),
    [
        ("answer!", "returned 'answer!' (a str), not a list of ToolResult"),
        (["answer!"], "returned a list whose item 0 is 'answer!' (a str), not a ToolResult"),
        (None, "returned None (a NoneType), not a list of ToolResult"),
    ],
)
async def test_a_handler_returning_the_wrong_shape_fails_the_episode_naming_it(
    returned: object, named: str
) -> None:
    """The handler's bug, not the model's: the model used to read it as its tool's answer."""

    async def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> object:
        return returned

    with pytest.raises(ToolResultTypeError) as failed:
        await run_external(handler, [EXTERNAL_CALL, "<move>good</move>"])
    message = str(failed.value)
    assert message.startswith("external_tool_handler test_a_handler_returning_the_wrong_shape")
    assert named in message and "return one ToolResult per call" in message
    assert "tool_results_from_json" in message


async def test_too_many_external_round_trips_end_the_turn_as_a_parse_failure() -> None:
    async def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        return [ToolResult(tool_call_id=c.id, name=c.name, content="more") for c in calls]

    rollout, env = await run_external(handler, [EXTERNAL_CALL], max_external_calls=1, max_steps=1)
    assert env.actions == []
    steps = rollout.agent_steps
    assert [s.action_target for s in steps] == ["external", "env"]
    assert [s.loop_index for s in steps] == [0, 1]
    assert steps[-1].info["tool_loop_exhausted"] is True
    (e,) = rollout.env_steps
    assert (
        e.info["parse_error"] and e.next_obs is not None and "2 external tool calls" in e.next_obs
    )
    assert e.truncation_reason == "max_steps"


async def test_sampling_seeds_are_distinct_per_call_and_reproducible() -> None:
    async def seeds() -> list[int | None]:
        client = ScriptedClient(["no tag", "<move>a</move>"])
        protocol = SingleAgentProtocol(Agent(client, parser=MOVE), max_steps=4)
        await protocol.run(CountingEnv(length=None), sampling=SamplingConfig(seed=11))
        return [r.sampling.seed for r in client.requests]

    first = await seeds()
    assert first == await seeds() and len(first) == 4 and len(set(first)) == 4


async def test_agent_takes_the_envs_only_seat_and_rollout_id_is_kept() -> None:
    env = CountingEnv(length=1)
    env.agent_id = "player"
    agent = Agent(ScriptedClient(["<move>x</move>"]), parser=MOVE)
    (rollout,) = await SingleAgentProtocol(agent, rollout_id="r1").run(env)
    assert rollout.id == "r1" and rollout.agent_id == "player"
    assert {s.agent_id for s in rollout.steps} == {"player"}


async def test_env_errors_propagate_and_the_env_is_still_closed() -> None:
    env = CountingEnv(fail_on_step=True)
    with pytest.raises(RuntimeError, match="the env broke"):
        await SingleAgentProtocol(Agent(ScriptedClient(["x"]))).run(env)
    assert env.closed == 1


def test_bad_max_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        SingleAgentProtocol(Agent(ScriptedClient(["x"])), max_steps=0)


async def test_system_prompt_comes_from_the_env_unless_the_agent_has_one() -> None:
    rollout, _ = await run(["<move>x</move>"], CountingEnv(length=1))
    first = rollout.agent_steps[0]
    assert first.prompt_messages[0] == {"role": "system", "content": "You play the counting game."}
    assert isinstance(rollout.steps[0], AgentStep) and isinstance(rollout.steps[1], EnvironmentStep)
