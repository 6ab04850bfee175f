"""A tool's result must be JSON: numpy values become plain ones, and a value JSON cannot hold
fails that episode naming the tool, where in the result and the type. Such a value used to
reach the model as `json.dumps(value, default=str)`: `np.int64(3)` read `"3"`, an array
`"[1 2]"`, a set `"{1, 2}"` and an object its repr with a memory address, in silence."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ludic.agents import ToolAgent, ToolResultTypeError, tool_results_from_json
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.interaction.acting import ToolCallContext
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, read_rollouts_jsonl
from ludic.types import Info, Rollout, StepOutcome, ToolCall, ToolResult


class OneStepEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "use the tool, then answer", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True)


class Opaque:
    """An object JSON has no form for."""


def circular() -> list[object]:
    loop: list[object] = []
    loop.append(loop)
    return loop


def returning(value: object) -> Callable[[], object]:
    def look() -> object:
        """Look something up."""
        return value

    return look


def call(name: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


def tool_protocol(value: object) -> SingleAgentProtocol:
    agent = ToolAgent(
        ScriptedClient([call("look"), "<move>a</move>"]),
        tools=[returning(value)],
        parser=xml_tag_parser("move"),
    )
    return SingleAgentProtocol(agent, max_steps=1)


async def first_tool_result(protocol: SingleAgentProtocol) -> ToolResult:
    (rollout,) = await protocol.run(OneStepEnv(), env_seed=0)
    json.dumps(rollout.to_dict())
    return rollout.agent_steps[0].tool_results[0]


@pytest.mark.parametrize(
    ("value", "content"),
    [
        (np.int64(3), "3"),
        (np.float32(0.5), "0.5"),
        ({"a": np.array([1, 2]), "ok": np.bool_(True)}, '{"a": [1, 2], "ok": true}'),
        ([np.float64(0.25), "x"], '[0.25, "x"]'),
        ("plain text", "plain text"),
        ({"n": 1}, '{"n": 1}'),
    ],
)
async def test_numpy_values_reach_the_model_as_plain_json(value: object, content: str) -> None:
    result = await first_tool_result(tool_protocol(value))
    assert not result.is_error and result.content == content


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({1, 2}, r"returned result = \{1, 2\} \(a set\)"),
        (Opaque(), r"returned result = a [\w.]*Opaque, which"),
        ({"hits": [Opaque()]}, r"returned result\['hits'\]\[0\] = a [\w.]*Opaque, which"),
        ({(1, 2): "x"}, r"returned result with the key \(1, 2\) \(a tuple\)"),
        (b"raw", r"returned result = b'raw' \(a bytes\)"),
        (circular(), r"returned result holding itself \(a circular reference\)"),
    ],
)
async def test_a_value_json_cannot_hold_fails_that_episode_naming_the_tool(
    value: object, named: str, tmp_path: Path
) -> None:
    values = {"fine": np.int64(1), "bad": value}
    log = tmp_path / "rollouts.jsonl"
    engine = RolloutEngine(
        env_registry={"one": OneStepEnv},
        protocol_registry={"p": lambda which: tool_protocol(values[which])},
        jsonl_log=log,
    )
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="one"), protocol=ComponentSpec(name="p", kwargs={"which": w})
        )
        for w in ("fine", "bad")
    ]
    fine, bad = await engine.run(requests)
    assert not fine.failed and "log_error" not in fine.meta
    assert bad.failed and bad.meta["error_type"] == "ToolResultTypeError"
    assert re.search(f"tool 'look' {named}", bad.meta["error"])
    assert sorted(r.failed for r in read_rollouts_jsonl(log)) == [False, True]


def test_tool_results_from_json_converts_and_refuses_the_same_way() -> None:
    calls = [ToolCall(id="c1", name="search", arguments="{}")]
    (result,) = tool_results_from_json(calls, [{"score": np.float64(0.5)}])
    assert result.content == '{"score": 0.5}'
    with pytest.raises(
        ToolResultTypeError, match=r"tool 'search' returned result = \{3\} \(a set\)"
    ):
        tool_results_from_json(calls, [{3}])


EXTERNAL_CALL = '<tool_call>{"name": "ask", "arguments": {"question": "q?"}}</tool_call>'


def ask(question: str) -> str:
    """Ask the environment a question.

    Args:
        question: what to ask
    """
    raise AssertionError("external tools are handled by the protocol")


async def run_external(handler: Callable[..., Any]) -> Rollout:
    agent = ToolAgent(
        ScriptedClient([EXTERNAL_CALL, "<move>a</move>"]),
        external_tools=[ask],
        parser=xml_tag_parser("move"),
    )
    protocol = SingleAgentProtocol(agent, external_tool_handler=handler, max_steps=1)
    (rollout,) = await protocol.run(OneStepEnv(), env_seed=0)
    return rollout


async def test_an_external_result_json_cannot_hold_fails_the_episode() -> None:
    """Not an error result the model reads (what a raising handler gives): the handler's bug."""

    def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        return tool_results_from_json(calls, [Opaque()])

    with pytest.raises(ToolResultTypeError, match=r"tool 'ask' returned result = a [\w.]+Opaque"):
        await run_external(handler)


async def test_a_tool_result_whose_content_is_not_text_fails_the_episode() -> None:
    def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        return [ToolResult(tool_call_id=c.id, name=c.name, content={"a": 1}) for c in calls]  # type: ignore[arg-type]

    with pytest.raises(
        ToolResultTypeError, match=r"tool 'ask' whose content is \{'a': 1\} \(a dict\)"
    ):
        await run_external(handler)


async def test_external_numpy_outputs_reach_the_model_as_plain_json() -> None:
    def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
        return tool_results_from_json(calls, [np.array([1.5, 2.0])])

    rollout = await run_external(handler)
    (result,) = rollout.agent_steps[0].tool_results
    assert not result.is_error and result.content == "[1.5, 2.0]"
