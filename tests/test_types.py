"""Core records: validation, exact JSON round trips (hand-made and hypothesis-generated) and
the turn grouping of a rollout timeline."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.types import (
    AgentStep,
    EnvironmentStep,
    ParseResult,
    Rollout,
    TokenTrace,
    ToolCall,
    ToolResult,
    step_from_dict,
)


def via_json(d: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(d))
    assert isinstance(out, dict)
    return out


def trace(n: int = 2) -> TokenTrace:
    return TokenTrace(
        prompt_token_ids=(1, 2, 3),
        completion_token_ids=tuple(range(10, 10 + n)),
        completion_logprobs=tuple(-0.125 * (i + 1) for i in range(n)),
    )


def agent_step(**kw: Any) -> AgentStep:
    defaults: dict[str, Any] = dict(
        turn_id="t0",
        prompt_messages=({"role": "user", "content": "hi"},),
        completion="<move>1</move>",
        trace=trace(),
        finish_reason="stop",
        policy_version=3,
        parse_result=ParseResult(action="1", reward=0.5),
        reward=0.5,
        info={"finish_reason": "stop", "nested": {"a": [1, 2.5, None]}},
    )
    defaults.update(kw)
    return AgentStep(**defaults)


# ---- TokenTrace ---------------------------------------------------------------------------


def test_token_trace_rejects_logprob_count_mismatch() -> None:
    with pytest.raises(ValueError, match="2 completion logprobs for 3 completion tokens"):
        TokenTrace(
            prompt_token_ids=(1,), completion_token_ids=(1, 2, 3), completion_logprobs=(-1, -2)
        )


def test_token_trace_normalises_to_tuples_of_int_and_float() -> None:
    t = TokenTrace(prompt_token_ids=[1, 2], completion_token_ids=[3], completion_logprobs=[-1])
    assert t.prompt_token_ids == (1, 2) and t.completion_token_ids == (3,)
    assert t.completion_logprobs == (-1.0,) and isinstance(t.completion_logprobs[0], float)


@pytest.mark.parametrize("logprobs", [None, (-0.5, -1.25)])
def test_token_trace_round_trips(logprobs: tuple[float, ...] | None) -> None:
    t = TokenTrace(prompt_token_ids=(5,), completion_token_ids=(6, 7), completion_logprobs=logprobs)
    assert TokenTrace.from_dict(via_json(t.to_dict())) == t


# ---- small records ------------------------------------------------------------------------


def test_tool_call_and_result_round_trip_and_render_as_openai_messages() -> None:
    call = ToolCall(id="c1", name="add", arguments='{"a": 1}')
    assert ToolCall.from_dict(via_json(call.to_dict())) == call
    assert call.to_message_part() == {
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 1}'},
    }
    result = ToolResult(tool_call_id="c1", name="add", content="2", is_error=True)
    assert ToolResult.from_dict(via_json(result.to_dict())) == result
    assert result.to_message() == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "add",
        "content": "2",
    }


@pytest.mark.parametrize(
    "pr",
    [ParseResult(action="a", reward=0.25), ParseResult(action=None, reward=-1.0, obs="bad")],
)
def test_parse_result_round_trips(pr: ParseResult) -> None:
    assert ParseResult.from_dict(via_json(pr.to_dict())) == pr
    assert pr.ok is (pr.action is not None)


def test_agent_step_round_trips_with_tools_and_trace() -> None:
    step = agent_step(
        tool_calls=(ToolCall(id="c", name="f", arguments="{}"),),
        tool_results=(ToolResult(tool_call_id="c", name="f", content="x"),),
        action_target="internal",
        parse_result=None,
        reward=0.0,
    )
    back = step_from_dict(via_json(step.to_dict()))
    assert back == step and isinstance(back, AgentStep)


def test_agent_step_without_trace_round_trips() -> None:
    step = AgentStep(trace=None, policy_version=None, finish_reason=None)
    assert AgentStep.from_dict(via_json(step.to_dict())) == step


def test_environment_step_round_trips() -> None:
    step = EnvironmentStep(
        turn_id="t",
        prev_obs="a",
        action="x",
        next_obs=None,
        reward=1.5,
        terminated=False,
        truncated=True,
        truncation_reason="max_steps",
        state_key="(1, 2)",
        agent_step_ids=("s1", "s2"),
        info={"truncation_reason": "max_steps"},
    )
    back = step_from_dict(via_json(step.to_dict()))
    assert back == step and isinstance(back, EnvironmentStep)


def test_bad_action_target_and_truncation_reason_are_refused() -> None:
    with pytest.raises(ValueError, match="action_target"):
        AgentStep(action_target="somewhere")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="truncation_reason"):
        EnvironmentStep(truncation_reason="tired")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind"):
        step_from_dict({"kind": "other"})


def test_rollout_with_both_step_kinds_round_trips() -> None:
    a = agent_step()
    e = EnvironmentStep(turn_id="t0", prev_obs="o", action="1", next_obs="o2", reward=1.0)
    rollout = Rollout(
        agent_id="p1",
        steps=[a, e],
        meta={"episode_truncated": True, "truncation_reason": "env", "env_seed": 7},
    )
    back = Rollout.from_dict(via_json(rollout.to_dict()))
    assert back == rollout
    assert back.agent_steps == [a] and back.env_steps == [e]
    assert back.total_reward == pytest.approx(1.5)
    assert not back.failed and Rollout(meta={"error": "x"}).failed


# ---- hypothesis-generated records -----------------------------------------------------------

ids = st.text(min_size=1, max_size=8)
texts = st.text(max_size=30)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | finite | texts
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
infos = st.dictionaries(texts, json_value, max_size=4)


@st.composite
def traces(draw: st.DrawFn) -> TokenTrace:
    completion = draw(st.lists(st.integers(0, 300_000), max_size=6))
    logprobs = draw(
        st.none() | st.lists(finite, min_size=len(completion), max_size=len(completion))
    )
    return TokenTrace(
        prompt_token_ids=tuple(draw(st.lists(st.integers(0, 300_000), max_size=6))),
        completion_token_ids=tuple(completion),
        completion_logprobs=None if logprobs is None else tuple(logprobs),
    )


parse_results = st.builds(
    ParseResult, action=st.none() | texts, reward=finite, obs=st.none() | texts
)
tool_calls = st.builds(ToolCall, id=ids, name=ids, arguments=texts)
tool_results = st.builds(
    ToolResult, tool_call_id=ids, name=ids, content=texts, is_error=st.booleans()
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": texts}
)
agent_steps = st.builds(
    AgentStep,
    id=ids,
    index=st.integers(0, 100),
    turn_id=ids,
    agent_id=ids,
    loop_index=st.integers(0, 10),
    prompt_messages=st.lists(messages, max_size=3).map(tuple),
    completion=texts,
    trace=st.none() | traces(),
    finish_reason=st.none() | st.sampled_from(["stop", "length", "tool_calls"]),
    policy_version=st.none() | st.integers(0, 10**6),
    tool_calls=st.lists(tool_calls, max_size=2).map(tuple),
    tool_results=st.lists(tool_results, max_size=2).map(tuple),
    action_target=st.sampled_from(["internal", "external", "env"]),
    parse_result=st.none() | parse_results,
    reward=finite,
    info=infos,
)
env_steps = st.builds(
    EnvironmentStep,
    id=ids,
    index=st.integers(0, 100),
    turn_id=ids,
    agent_id=ids,
    prev_obs=texts,
    action=st.none() | texts,
    next_obs=st.none() | texts,
    reward=finite,
    terminated=st.booleans(),
    truncated=st.booleans(),
    truncation_reason=st.none() | st.sampled_from(["max_steps", "env", "max_seq_len"]),
    state_key=st.none() | texts,
    agent_step_ids=st.lists(ids, max_size=3).map(tuple),
    info=infos,
)
rollouts = st.builds(
    Rollout,
    id=ids,
    agent_id=ids,
    steps=st.lists(agent_steps | env_steps, max_size=5),
    meta=infos,
)


@settings(max_examples=60, deadline=None)
@given(rollouts)
def test_generated_rollouts_round_trip_exactly(rollout: Rollout) -> None:
    assert Rollout.from_dict(via_json(rollout.to_dict())) == rollout


@settings(max_examples=60, deadline=None)
@given(traces())
def test_generated_traces_round_trip_exactly(t: TokenTrace) -> None:
    assert TokenTrace.from_dict(via_json(t.to_dict())) == t


# ---- turns ------------------------------------------------------------------------------


def test_turns_group_tool_loops_with_their_env_step() -> None:
    s0 = AgentStep(id="a0", turn_id="t0", action_target="internal")
    s1 = AgentStep(id="a1", turn_id="t0", loop_index=1, reward=0.25)
    e0 = EnvironmentStep(turn_id="t0", agent_step_ids=("a0", "a1"), reward=1.0)
    s2 = AgentStep(id="a2", turn_id="t1")
    e1 = EnvironmentStep(turn_id="t1", agent_step_ids=("a2",), reward=2.0, terminated=True)
    turns = Rollout(steps=[s0, s1, e0, s2, e1]).turns()
    assert [t.turn_id for t in turns] == ["t0", "t1"]
    assert turns[0].agent_steps == (s0, s1) and turns[0].env_step is e0
    assert turns[0].reward == pytest.approx(1.25) and turns[0].last_step is e0
    assert turns[1].agent_steps == (s2,) and turns[1].env_step is e1


def test_parse_failure_turn_is_closed_by_its_synthetic_step_or_by_the_next_turn() -> None:
    bad = AgentStep(
        id="b", turn_id="t0", reward=-1.0, parse_result=ParseResult(action=None, reward=-1.0)
    )
    synthetic = EnvironmentStep(
        turn_id="t0", agent_step_ids=("b",), next_obs="fix it", info={"parse_error": True}
    )
    good = AgentStep(id="g", turn_id="t1")
    turns = Rollout(steps=[bad, synthetic, good]).turns()
    assert [(t.turn_id, t.env_step) for t in turns] == [("t0", synthetic), ("t1", None)]
    assert turns[0].reward == -1.0
    # Without an env step, an agent step of another turn closes the pending one.
    turns = Rollout(steps=[bad, good]).turns()
    assert [(t.turn_id, t.env_step, t.last_step) for t in turns] == [
        ("t0", None, bad),
        ("t1", None, good),
    ]


def test_observed_steps_join_the_previous_turn_and_add_their_reward() -> None:
    """Multi-agent: the opponent moved (observed, no agent steps of ours) between our turns."""
    opening = EnvironmentStep(turn_id="o0", next_obs="opponent opened", reward=0.0)
    mine = AgentStep(
        id="m", turn_id="t0", info={"state_key": "k0", "observation": "opponent opened"}
    )
    mine_env = EnvironmentStep(turn_id="t0", agent_step_ids=("m",), reward=0.0)
    observed = EnvironmentStep(turn_id="o1", reward=-1.0, terminated=True, info={"observed": True})
    turns = Rollout(steps=[opening, mine, mine_env, observed]).turns()
    assert len(turns) == 2
    assert turns[0].agent_steps == () and turns[0].env_step is opening
    assert turns[0].state_key is None and turns[0].observation == ""
    assert turns[1].env_step is mine_env and turns[1].observed_steps == (observed,)
    assert turns[1].reward == -1.0
    assert turns[1].state_key == "k0" and turns[1].observation == "opponent opened"


def test_step_kind_is_fixed_by_the_class() -> None:
    assert AgentStep().kind == "agent" and EnvironmentStep().kind == "env"
    with pytest.raises(TypeError):
        AgentStep(kind="env")  # type: ignore[call-arg]
