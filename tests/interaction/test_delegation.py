"""DelegatingProtocol: delegate calls run child episodes whose rollouts come back beside the
parent's, linked both ways; every misuse is an error result, never a crash."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from interaction_fakes import CountingEnv

from ludic.agents import Agent, ToolAgent, ToolResultTypeError
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import DelegatingProtocol, SubAgentSpec, TaskEnv, delegate, final_answer
from ludic.parsers import xml_tag_parser
from ludic.sandbox import SandboxStartError
from ludic.types import AgentStep, Rollout, StepOutcome

MOVE = xml_tag_parser("move")


def delegate_call(arguments: object) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>{{"name": "delegate", "arguments": {text}}}</tool_call>'


def parent(*replies: str) -> ToolAgent:
    return ToolAgent(ScriptedClient(list(replies)), external_tools=[delegate], parser=MOVE)


def solver(answer: str) -> Callable[[], Agent]:
    return lambda: Agent(ScriptedClient([f"<move>{answer}</move>"]), parser=MOVE)


async def run(protocol: DelegatingProtocol, **kwargs: object) -> list[Rollout]:
    rollouts = await protocol.run(CountingEnv(length=1), **kwargs)  # type: ignore[arg-type]
    for r in rollouts:
        assert Rollout.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    return rollouts


def tool_result(rollout: Rollout) -> str:
    (result,) = rollout.agent_steps[0].tool_results
    return result.content


async def test_delegation_returns_linked_parent_and_child_rollouts() -> None:
    def judge(task: str, answer: str) -> float:
        return 1.0 if answer == "5" else 0.0

    registry = {
        "math": SubAgentSpec(agent_factory=solver("5"), env_factory=lambda t: TaskEnv(t, judge))
    }
    boss = parent(delegate_call({"task": "2+3?", "agent": "math"}), "<move>good</move>")
    parent_rollout, child = await run(DelegatingProtocol(boss, registry))

    external, final = parent_rollout.agent_steps
    assert external.action_target == "external" and external.parse_result is None
    assert final.action_target == "env" and parent_rollout.env_steps[0].action == "good"
    # The child's answer is the tool result, fed back into the parent's next prompt.
    assert tool_result(parent_rollout) == "5"
    assert final.prompt_messages[-1]["role"] == "tool"
    assert final.prompt_messages[-1]["content"] == "5"
    # Links both ways.
    assert child.meta["parent_rollout_id"] == parent_rollout.id
    assert child.meta["parent_step_id"] == external.id
    assert child.meta["parent_turn_id"] == external.turn_id
    assert child.meta["delegated_task"] == "2+3?" and child.meta["sub_agent"] == "math"
    assert child.meta["delegation_depth"] == 1
    assert external.info["child_rollout_ids"] == [child.id]
    assert "child_rollout_ids" not in final.info
    assert parent_rollout.meta["child_rollout_ids"] == [child.id]
    # The child is a full episode of its own.
    assert child.agent_steps[0].prompt_messages[-1] == {"role": "user", "content": "2+3?"}
    assert child.env_steps[0].terminated and child.total_reward == 1.0
    assert child.id != parent_rollout.id


async def test_several_delegations_keep_call_order_and_get_distinct_seeds() -> None:
    seeds: list[int | None] = []

    def recording_solver() -> Agent:
        client = ScriptedClient(["<move>ok</move>"])
        original = client.complete

        async def complete(request):  # type: ignore[no-untyped-def]
            seeds.append(request.sampling.seed)
            return await original(request)

        client.complete = complete  # type: ignore[method-assign]
        return Agent(client, parser=MOVE)

    boss = parent(
        delegate_call({"task": "a"}) + delegate_call({"task": "b"}),
        "<move>good</move>",
    )
    registry = {"default": SubAgentSpec(agent_factory=recording_solver)}
    rollouts = await run(DelegatingProtocol(boss, registry), sampling=SamplingConfig(seed=4))
    parent_rollout, first, second = rollouts
    assert [first.meta["delegated_task"], second.meta["delegated_task"]] == ["a", "b"]
    assert parent_rollout.agent_steps[0].info["child_rollout_ids"] == [first.id, second.id]
    assert parent_rollout.meta["child_rollout_ids"] == [first.id, second.id]
    assert len(seeds) == 2 and None not in seeds and seeds[0] != seeds[1]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"task": "x", "agent": "nobody"}, "no sub-agent named 'nobody'; have ['default']"),
        ({"agent": "default"}, "missing required argument(s): task"),
        ({"task": 3}, "argument 'task' must be string"),
        ('"just a string"', "not valid JSON"),
        ('"[1]"', "arguments must be a JSON object"),
        ({"task": "x", "colour": 1}, "unknown argument(s): colour"),
        ({"task": "x", "agent": ["default"]}, "argument 'agent' must be string"),
    ],
)
async def test_bad_delegate_calls_are_error_results(arguments: object, problem: str) -> None:
    registry = {"default": SubAgentSpec(agent_factory=solver("x"))}
    boss = parent(delegate_call(arguments), "<move>good</move>")
    rollouts = await run(DelegatingProtocol(boss, registry))
    assert len(rollouts) == 1 and rollouts[0].meta["child_rollout_ids"] == []
    (result,) = rollouts[0].agent_steps[0].tool_results
    assert result.is_error and problem in result.content


async def test_protocol_level_checks_apply_when_the_agent_does_not_validate() -> None:
    """A backend that parses tool calls itself may hand over anything; the protocol checks."""

    def loose_delegate(task: str = "", agent: str = "default", extra: str = "") -> str:
        """Loose."""
        return ""

    boss = ToolAgent(
        ScriptedClient(
            [
                '<tool_call>{"name": "loose_delegate", "arguments": {}}</tool_call>',
                "<move>good</move>",
            ]
        ),
        external_tools=[loose_delegate],
        parser=MOVE,
    )
    registry = {"default": SubAgentSpec(agent_factory=solver("x"))}
    (only,) = await run(DelegatingProtocol(boss, registry))
    assert "unknown external tool 'loose_delegate'" in tool_result(only)


async def test_depth_limit_is_an_error_result_in_the_child() -> None:
    def delegating_child() -> Agent:
        return parent(delegate_call({"task": "deeper"}), "<move>mine</move>")

    registry = {"default": SubAgentSpec(agent_factory=delegating_child)}
    boss = parent(delegate_call({"task": "sub"}), "<move>good</move>")
    parent_rollout, child = await run(DelegatingProtocol(boss, registry, max_depth=1))
    assert "delegation depth limit (1) reached" in tool_result(child)
    assert child.meta["child_rollout_ids"] == [] and tool_result(parent_rollout) == "mine"


async def test_nested_delegation_links_each_child_to_its_own_parent() -> None:
    def middle() -> Agent:
        return parent(delegate_call({"task": "leaf", "agent": "leaf"}), "<move>mid</move>")

    registry = {
        "default": SubAgentSpec(agent_factory=middle),
        "leaf": SubAgentSpec(agent_factory=solver("leafy")),
    }
    boss = parent(delegate_call({"task": "sub"}), "<move>good</move>")
    top, mid, leaf = await run(DelegatingProtocol(boss, registry, max_depth=2))
    assert top.meta["child_rollout_ids"] == [mid.id]  # direct children only
    assert mid.meta["parent_rollout_id"] == top.id and mid.meta["delegation_depth"] == 1
    assert mid.meta["child_rollout_ids"] == [leaf.id]
    assert leaf.meta["parent_rollout_id"] == mid.id and leaf.meta["delegation_depth"] == 2
    assert leaf.meta["parent_step_id"] == mid.agent_steps[0].id
    assert tool_result(mid) == "leafy" and tool_result(top) == "mid"


async def test_a_failing_child_episode_is_an_error_result() -> None:
    def broken_env(task: str) -> CountingEnv:
        return CountingEnv(fail_on_step=True)

    registry = {"default": SubAgentSpec(agent_factory=solver("x"), env_factory=broken_env)}
    boss = parent(delegate_call({"task": "t"}), "<move>good</move>")
    (only,) = await run(DelegatingProtocol(boss, registry))
    assert "sub-agent episode failed: RuntimeError: the env broke" in tool_result(only)


async def test_a_child_whose_sandbox_never_started_fails_the_parent() -> None:
    """The host's failure: the boss must not read it as its sub-agent's answer."""

    class HostDown(CountingEnv):
        def env_step(self, action: str) -> StepOutcome:
            raise SandboxStartError("the sandbox did not start: bwrap: no namespaces")

    registry = {
        "default": SubAgentSpec(agent_factory=solver("x"), env_factory=lambda t: HostDown())
    }
    boss = parent(delegate_call({"task": "t"}), "<move>good</move>")
    with pytest.raises(SandboxStartError, match=r"handler: the sandbox did not start: bwrap"):
        await run(DelegatingProtocol(boss, registry))


async def test_a_child_whose_own_tool_returns_no_json_is_this_calls_error_only() -> None:
    """A child's tool bug fails the child's episode, as a child env that raises does: the
    boss reads it as that call's error (only a result_fn's bug or the host's failure fails the
    boss's episode)."""

    def tags() -> set[str]:
        """Tags of the task."""
        return {"a", "b"}

    def child() -> Agent:
        replies = ['<tool_call>{"name": "tags", "arguments": {}}</tool_call>', "<move>x</move>"]
        return ToolAgent(ScriptedClient(replies), tools=[tags], parser=MOVE)

    registry = {"default": SubAgentSpec(agent_factory=child)}
    boss = parent(delegate_call({"task": "t"}), "<move>good</move>")
    (only,) = await run(DelegatingProtocol(boss, registry))
    assert "sub-agent episode failed: ToolResultTypeError: tool 'tags'" in tool_result(only)


def test_registry_must_not_be_empty_and_delegate_is_not_run_locally() -> None:
    with pytest.raises(ValueError, match="at least one sub-agent"):
        DelegatingProtocol(parent("x"), {})
    with pytest.raises(RuntimeError, match="external tool"):
        delegate("task")


def test_final_answer_prefers_the_last_env_action() -> None:
    bare = Rollout(steps=[AgentStep(completion="raw text")])
    assert final_answer(bare) == "raw text" and final_answer(Rollout()) == ""


async def test_sub_agents_keep_their_own_identity_at_every_depth() -> None:
    """A sub-agent with the default id (or its parent's) is named after its registry entry;
    one with an id of its own keeps it. The parent keeps its id, steps name their agent."""

    def middle() -> Agent:
        return parent(delegate_call({"task": "leaf", "agent": "leaf"}), "<move>mid</move>")

    def named_leaf() -> Agent:
        return Agent(ScriptedClient(["<move>x</move>"]), parser=MOVE, agent_id="researcher")

    for leaf_factory, leaf_id in ((solver("x"), "leaf"), (named_leaf, "researcher")):
        registry = {
            "default": SubAgentSpec(agent_factory=middle),
            "leaf": SubAgentSpec(agent_factory=leaf_factory),
        }
        boss = parent(delegate_call({"task": "sub"}), "<move>good</move>")
        top, mid, leaf = await run(DelegatingProtocol(boss, registry, max_depth=2))
        assert [top.agent_id, mid.agent_id, leaf.agent_id] == ["agent_0", "default", leaf_id]
        for rollout in (top, mid, leaf):
            assert {s.agent_id for s in rollout.steps} == {rollout.agent_id}


async def test_a_result_fn_returning_no_str_fails_the_parent_naming_it() -> None:
    """The result_fn's bug, not the model's: not an error result the boss is penalised for
    (nor a ToolResult whose content the chat template cannot render)."""
    registry = {"math": SubAgentSpec(agent_factory=solver("5"), result_fn=lambda r: {"n": 5})}
    boss = parent(delegate_call({"task": "2+3?", "agent": "math"}), "<move>good</move>")
    with pytest.raises(ToolResultTypeError, match=r"SubAgentSpec 'math': result_fn returned dict"):
        await run(DelegatingProtocol(boss, registry))  # type: ignore[arg-type]
