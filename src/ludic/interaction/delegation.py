"""DelegatingProtocol: a parent agent hands subtasks to sub-agents through a `delegate` tool.

The parent calls the external tool `delegate(task, agent)`; the protocol runs a child episode
with a fresh sub-agent from a registry, feeds the child's answer back as the tool result, and
returns the child rollouts beside the parent's, linked by ids (child `meta.parent_rollout_id`,
`parent_step_id`; the parent step's `info.child_rollout_ids`). Nested delegation is bounded
by `max_depth`. A child rollout carries its sub-agent's own `agent_id` (the registry name when
the sub-agent has the default id or its parent's), so credit assigners group it only with
rollouts of the same sub-agent (see `credit.core.rollout_group_key`). How parent and child
credit relate is left to the credit assigner (`credit.hierarchical`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ludic.agents.base import Agent, derive_call_seed
from ludic.agents.tools import ToolResultTypeError, tool_from_callable, validate_arguments
from ludic.envs.base import LudicEnv, set_parse_failure_ends_episode
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.sampling import SamplingConfig
from ludic.interaction.acting import ToolCallContext
from ludic.interaction.base import checked_agent
from ludic.interaction.info import merge_step_info
from ludic.interaction.single_agent import SingleAgentProtocol
from ludic.interaction.termination import TerminationRule, TerminationRules
from ludic.sandbox.records import SandboxStartError
from ludic.types import (
    AgentStep,
    EnvironmentStep,
    Info,
    Rollout,
    Step,
    StepOutcome,
    ToolCall,
    ToolResult,
)

DELEGATE_TOOL = "delegate"


def delegate(task: str, agent: str = "default") -> str:
    """Hand a self-contained subtask to a sub-agent and get its final answer back.

    Args:
        task: The subtask, stated completely; the sub-agent sees nothing else.
        agent: Which sub-agent to use.
    """
    raise RuntimeError("delegate is an external tool: the DelegatingProtocol runs it")


_DELEGATE_SCHEMA = tool_from_callable(delegate)


class TaskEnv(SingleAgentEnv):
    """A one-step env for sub-agents: the observation is the task, the action the answer.

    `judge(task, answer) -> reward` scores the answer (default: no reward). One task, one
    answer: a reply that fails to parse ends the child episode as a recorded parse failure
    (its raw completion goes back to the parent, see `final_answer`);
    `parse_failure_ends_episode=False` lets the sub-agent retry up to its spec's `max_steps`.
    """

    parse_failure_ends_episode = True  # one answer per episode (see __init__)

    def __init__(
        self,
        task: str,
        judge: Callable[[str, str], float] | None = None,
        *,
        parse_failure_ends_episode: bool | None = None,
    ) -> None:
        self.task = task
        self.judge = judge
        set_parse_failure_ends_episode(self, parse_failure_ends_episode)

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return self.task, {}

    def env_step(self, action: str) -> StepOutcome:
        reward = float(self.judge(self.task, action)) if self.judge is not None else 0.0
        return StepOutcome(obs="", reward=reward, terminated=True)


def final_answer(rollout: Rollout) -> str:
    """The child's last env action, else its last completion."""
    for step in reversed(rollout.steps):
        if isinstance(step, EnvironmentStep) and step.action is not None:
            return step.action
    agent_steps = rollout.agent_steps
    return agent_steps[-1].completion if agent_steps else ""


@dataclass(frozen=True, kw_only=True, slots=True)
class SubAgentSpec:
    """How to build and run one kind of sub-agent. `max_steps` (default 4, or the `MaxSteps`
    rule in `termination`) and `termination` bound its episodes, not the parent's."""

    agent_factory: Callable[[], Agent]
    env_factory: Callable[[str], LudicEnv] = TaskEnv
    max_steps: int | None = None
    termination: Sequence[TerminationRule] = ()
    result_fn: Callable[[Rollout], str] = final_answer

    def __post_init__(self) -> None:
        self.termination_rules()  # a bad spec fails when built, not mid-episode

    def termination_rules(self) -> TerminationRules:
        return TerminationRules.build(
            self.termination, self.max_steps, default_max_steps=4, owner="SubAgentSpec"
        )


class DelegatingProtocol:
    """Run `agent` on the env; its `delegate` tool calls run sub-agent episodes.

    `agent` must list `delegate` (or a callable with the same signature) among its
    `external_tools`. Returns `[parent, *descendants]` in call order; a child that delegates
    in turn (allowed while depth < `max_depth`) is followed by its own children.
    `parent.meta["child_rollout_ids"]` names the direct children only. `max_steps` (default
    20) and `termination` rules bound the parent's episode as in SingleAgentProtocol; each
    child uses its SubAgentSpec's.
    """

    def __init__(
        self,
        agent: Agent,
        registry: Mapping[str, SubAgentSpec],
        *,
        max_steps: int | None = None,
        termination: Sequence[TerminationRule] = (),
        max_depth: int = 1,
        max_external_calls: int = 8,
    ) -> None:
        if not registry:
            raise ValueError("DelegatingProtocol needs at least one sub-agent in its registry")
        self.termination = TerminationRules.build(
            termination, max_steps, default_max_steps=20, owner="DelegatingProtocol"
        )
        self.agent = checked_agent(agent, "DelegatingProtocol")
        self.registry = dict(registry)
        self.max_steps = self.termination.max_steps
        self.max_depth = max_depth
        self.max_external_calls = max_external_calls

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
        depth: int = 0,
    ) -> list[Rollout]:
        """`depth` is how deep this episode already is (0 for the top-level parent)."""
        descendants: list[Rollout] = []
        links: dict[str, list[str]] = {}
        ordinals = itertools.count()  # one child sampling seed per delegate call

        async def handler(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
            results = []
            for call in calls:
                try:
                    result, rollouts = await self._run_child(call, ctx, depth, next(ordinals))
                except (ToolResultTypeError, SandboxStartError):  # a result_fn's bug or the
                    raise  # host's failure (a sandbox that never started), not the model's
                except Exception as exc:  # a factory of the spec that raises: this call's error
                    result = _error(call, f"sub-agent episode failed: {type(exc).__name__}: {exc}")
                    rollouts = []
                results.append(result)
                if rollouts:
                    links.setdefault(ctx.agent_step_id, []).append(rollouts[0].id)
                descendants.extend(rollouts)
            return results

        protocol = SingleAgentProtocol(
            self.agent,
            max_steps=self.max_steps,
            termination=self.termination.rules,
            external_tool_handler=handler,
            max_external_calls=self.max_external_calls,
        )
        (parent,) = await protocol.run(env, env_seed=env_seed, sampling=sampling)
        parent.steps = [_link(s, links) for s in parent.steps]
        parent.meta["child_rollout_ids"] = [cid for ids in links.values() for cid in ids]
        return [parent, *descendants]

    async def _run_child(
        self, call: ToolCall, ctx: ToolCallContext, depth: int, ordinal: int
    ) -> tuple[ToolResult, list[Rollout]]:
        """Run one `delegate` call: `[child, *its descendants]`, or an error and no rollouts."""
        if call.name != DELEGATE_TOOL:
            return _error(call, f"unknown external tool {call.name!r}"), []
        if depth >= self.max_depth:
            limit = f"delegation depth limit ({self.max_depth}) reached; solve it yourself"
            return _error(call, limit), []
        try:
            args = json.loads(call.arguments or "{}")
        except (ValueError, RecursionError):
            return _error(call, "delegate arguments are not valid JSON"), []
        problem = validate_arguments(_DELEGATE_SCHEMA, args)
        if problem:
            return _error(call, f'{problem}; call delegate({{"task": ..., "agent": ...}})'), []
        name = args.get("agent", "default")
        if name not in self.registry:
            return _error(call, f"no sub-agent named {name!r}; have {sorted(self.registry)}"), []
        spec = self.registry[name]
        sampling = ctx.sampling
        if sampling is not None:
            sampling = sampling.with_seed(derive_call_seed(sampling.seed, 10_000 + ordinal))
        sub_agent = spec.agent_factory()
        if sub_agent.agent_id in ("agent_0", self.agent.agent_id):
            sub_agent.agent_id = name  # unnamed, or its parent's identity: take the registry's
        child_rules = spec.termination_rules()
        child_protocol = DelegatingProtocol(
            sub_agent,
            self.registry,
            max_steps=child_rules.max_steps,
            termination=child_rules.rules,
            max_depth=self.max_depth,
            max_external_calls=self.max_external_calls,
        )
        try:
            rollouts = await child_protocol.run(
                spec.env_factory(args["task"]), sampling=sampling, depth=depth + 1
            )
        except SandboxStartError:  # the host's failure: the parent's episode fails too
            raise
        except Exception as exc:  # a broken child episode (its env, its tools) is this call's
            return _error(call, f"sub-agent episode failed: {type(exc).__name__}: {exc}"), []
        rollouts[0].meta.update(
            parent_rollout_id=ctx.rollout_id,
            parent_step_id=ctx.agent_step_id,
            parent_turn_id=ctx.turn_id,
            delegated_task=args["task"],
            sub_agent=name,
            delegation_depth=depth + 1,
        )
        answer = spec.result_fn(rollouts[0])
        if not isinstance(answer, str):
            raise ToolResultTypeError(
                f"SubAgentSpec {name!r}: result_fn returned {type(answer).__name__} "
                f"{answer!r:.60}; it is the delegate tool's result the parent reads: return a "
                "str (json.dumps(...) for structured data)"
            )
        return ToolResult(tool_call_id=call.id, name=call.name, content=answer), rollouts


def _error(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(
        tool_call_id=call.id, name=call.name, content=f"Error: {message}", is_error=True
    )


def _link(step: Step, links: Mapping[str, list[str]]) -> Step:
    if isinstance(step, AgentStep) and step.id in links:
        info = merge_step_info(step.info, {"child_rollout_ids": links[step.id]})
        return dataclasses.replace(step, info=info)
    return step
