"""Samples from the real agents and protocols: ReAct tool loops stitch into one masked sample
per turn; a rewriting context strategy yields snapshots in episode mode."""

from __future__ import annotations

from typing import Any

from rollout_fakes import CountEnv, uniform_weights

from ludic.agents import Agent, ReActAgent
from ludic.context import TruncatedThinkingContext
from ludic.inference.scripted import ScriptedClient, encode_text, hermes_tool_call
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, build_samples
from ludic.types import Rollout


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return a + b


TOOL_CALL = hermes_tool_call({"name": "add", "arguments": {"a": 2, "b": 3}})


async def run_one(make_agent: Any, *, length: int, max_steps: int = 5) -> Rollout:
    engine = RolloutEngine(
        env_registry={"count": lambda **kw: CountEnv(**kw)},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(make_agent(), max_steps=max_steps)
        },
    )
    request = RolloutRequest(
        env=ComponentSpec(name="count", kwargs={"length": length}),
        protocol=ComponentSpec(name="single"),
    )
    (rollout,) = await engine.run([request])
    assert not rollout.failed, rollout.meta
    return rollout


async def test_react_turn_is_one_sample_with_tool_results_masked() -> None:
    rollout = await run_one(
        lambda: ReActAgent(ScriptedClient([TOOL_CALL, TOOL_CALL, "ok"]), tools=[add]), length=2
    )
    samples = build_samples([rollout], uniform_weights([rollout]))
    turns = [t for t in rollout.turns() if t.agent_steps]
    assert len(samples) == len(turns) == 2
    for sample, turn in zip(samples, turns, strict=True):
        calls = turn.agent_steps
        assert [c.action_target for c in calls] == ["internal", "internal", "env"]
        traces = [c.trace for c in calls]
        assert all(t is not None for t in traces)
        # Append-only: the sample is exactly the last call's prompt plus its completion ...
        last = traces[-1]
        assert sample.input_ids == last.prompt_token_ids + last.completion_token_ids
        # ... and exactly the completions are action tokens, at the offsets the server saw.
        expected_mask = [0] * sample.num_tokens
        expected_lp = [0.0] * sample.num_tokens
        for t in traces:
            start = len(t.prompt_token_ids)
            for j, (tok, lp) in enumerate(
                zip(t.completion_token_ids, t.completion_logprobs, strict=True)
            ):
                assert sample.input_ids[start + j] == tok
                expected_mask[start + j] = 1
                expected_lp[start + j] = lp
        assert list(sample.action_mask) == expected_mask
        assert list(sample.behavior_logprobs) == expected_lp
        # The tool result ("5") sits in a masked stretch between two completions.
        gap = sample.input_ids[
            len(traces[0].prompt_token_ids) + len(traces[0].completion_token_ids) : len(
                traces[1].prompt_token_ids
            )
        ]
        assert bytes(encode_text("5")) in bytes(t for t in gap if t < 256)
        assert sample.meta["num_segments"] == 1 and sample.meta["is_snapshot"] is False


async def test_truncated_thinking_yields_snapshots_in_episode_mode() -> None:
    def agent() -> Agent:
        return Agent(
            ScriptedClient(["<think>long thoughts</think>ok"]), context=TruncatedThinkingContext()
        )

    rollout = await run_one(agent, length=3)
    # Turn mode: each turn is one call, so no rewrite is ever seen inside a sample.
    per_turn = build_samples([rollout], uniform_weights([rollout]))
    assert [s.meta["num_segments"] for s in per_turn] == [1, 1, 1]
    # Episode mode: every new turn rewrites the previous assistant message.
    per_episode = build_samples([rollout], uniform_weights([rollout], 0.5), mode="episode")
    assert [s.meta["is_snapshot"] for s in per_episode] == [True, True, False]
    assert [s.meta["turn_ids"] for s in per_episode] == [[t.turn_id] for t in rollout.turns()]
    for sample, step in zip(per_episode, rollout.agent_steps, strict=True):
        assert step.trace is not None
        assert sample.input_ids == step.trace.prompt_token_ids + step.trace.completion_token_ids
        assert sample.weight == 0.5 and sample.meta["rollout_id"] == rollout.id


async def test_tool_call_text_the_template_renders_differently_splits_into_exact_samples() -> None:
    """A call written without the template's newlines is re-rendered differently in the next
    prompt: not append-only, so each model call becomes its own exact sample. That is template
    drift, not a context edit: no sample is a snapshot."""
    compact = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    rollout = await run_one(
        lambda: ReActAgent(ScriptedClient([compact, compact, "ok"]), tools=[add]), length=2
    )
    samples = build_samples([rollout], uniform_weights([rollout]))
    calls = [s for t in rollout.turns() for s in t.agent_steps]
    assert len(samples) == len(calls) == 6
    for sample, step in zip(samples, calls, strict=True):
        trace = step.trace
        assert trace is not None
        assert sample.input_ids == trace.prompt_token_ids + trace.completion_token_ids
        assert sum(sample.action_mask) == len(trace.completion_token_ids)
    assert not any(s.meta["is_snapshot"] for s in samples)
    # Per turn: two drift splits (after each tool call), then the final piece.
    assert [s.meta["drift_split"] for s in samples] == [True, True, False] * 2
    assert {(s.meta["segment_index"], s.meta["num_segments"]) for s in samples} == {(0, 1)}
