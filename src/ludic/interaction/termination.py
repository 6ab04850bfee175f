"""Episode termination as composable rules (seed 003, Task 2.3) and TerminatingProtocol, the
single-agent loop that applies them and records why each episode ended.

A "critical error" here is one an env or a tool reports in its info; an env or client that
raises still fails the episode (the RolloutEngine records it). Rules keep no state.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ludic._aio import maybe_await
from ludic.agents.base import Agent, AgentAct
from ludic.envs.base import LudicEnv, call_env, closing_env, state_key_to_str
from ludic.inference.sampling import SamplingConfig
from ludic.interaction.acting import ExternalToolHandler, act_with_tools
from ludic.interaction.collector import TraceCollector
from ludic.interaction.info import merge_step_info
from ludic.interaction.single_agent import synthetic_failure_step
from ludic.types import AgentStep, EnvironmentStep, Info, Rollout, TruncationReason, new_id

Phase = Literal["act", "env"]
ValueEstimator = Callable[[str, str | None], float | Awaitable[float]]


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnView:
    """What a rule sees. Phase "act": the agent has acted, the env has not seen the action
    (`env_step` is None). Phase "env": after the env step (or the synthetic parse-failure
    step). `env_steps` holds every env step of the episode so far (at phase "env" the last one
    is `env_step`)."""

    phase: Phase
    act: AgentAct
    env_step: EnvironmentStep | None
    env_steps: tuple[EnvironmentStep, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Termination:
    """Why an episode ends. `truncated` means cut off (no terminal state reached) and then
    `truncation_reason` is set; otherwise the episode counts as terminated."""

    reason: str
    truncated: bool = False
    truncation_reason: TruncationReason | None = None
    detail: str = ""


@runtime_checkable
class TerminationRule(Protocol):
    """Returns a Termination when the episode must end after this turn, else None."""

    def check(self, turn: TurnView) -> Termination | None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class MaxSteps:
    """Cut the episode after `max_steps` env steps (parse failures included)."""

    max_steps: int

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"MaxSteps.max_steps must be >= 1, got {self.max_steps}")

    def check(self, turn: TurnView) -> Termination | None:
        if turn.phase == "env" and len(turn.env_steps) >= self.max_steps:
            return Termination(
                reason="max_steps",
                truncated=True,
                truncation_reason="max_steps",
                detail=f"{self.max_steps} steps",
            )
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class TerminateAction:
    """End the episode when the agent's action is one of `actions` (stripped, case-insensitive
    unless `case_sensitive`). The env never sees the terminate action."""

    actions: tuple[str, ...] = ("terminate",)
    case_sensitive: bool = False

    def check(self, turn: TurnView) -> Termination | None:
        action = turn.act.action
        if turn.phase != "act" or action is None:
            return None
        norm: Callable[[str], str] = (
            (lambda s: s.strip()) if self.case_sensitive else (lambda s: s.strip().casefold())
        )
        if norm(action) in {norm(a) for a in self.actions}:
            return Termination(reason="terminate_action", detail=action.strip())
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputRegex:
    """End the episode when the raw output of the turn's last model call matches `pattern`
    (`re.search`). By default the env sees the action first (an answer still gets scored);
    `before_env=True` ends the episode without stepping the env."""

    pattern: str
    flags: int = 0
    before_env: bool = False

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern, self.flags)
        except re.error as exc:
            raise ValueError(f"OutputRegex: invalid pattern {self.pattern!r}: {exc}") from None

    def check(self, turn: TurnView) -> Termination | None:
        if turn.phase != ("act" if self.before_env else "env"):
            return None
        match = re.search(self.pattern, turn.act.final_step.completion, self.flags)
        if match is None:
            return None
        return Termination(reason="output_regex", detail=match.group(0))


@dataclass(frozen=True, kw_only=True, slots=True)
class CriticalError:
    """End the episode on an error the env or a tool reports:

    - the env step's `info[info_key]` is truthy;
    - `fatal_tool_errors`: any tool result of the turn is an error;
    - `max_consecutive_parse_errors`: that many parse failures in a row.
    """

    info_key: str = "critical_error"
    fatal_tool_errors: bool = False
    max_consecutive_parse_errors: int | None = None

    def __post_init__(self) -> None:
        n = self.max_consecutive_parse_errors
        if n is not None and n < 1:
            raise ValueError(f"CriticalError.max_consecutive_parse_errors must be >= 1, got {n}")

    def check(self, turn: TurnView) -> Termination | None:
        if turn.phase == "act":
            if self.fatal_tool_errors:
                errors = [r for s in turn.act.steps for r in s.tool_results if r.is_error]
                if errors:
                    return Termination(reason="critical_error", detail=errors[0].content)
            return None
        assert turn.env_step is not None
        value = turn.env_step.info.get(self.info_key)
        if value:
            return Termination(reason="critical_error", detail=str(value))
        n = self.max_consecutive_parse_errors or 0
        recent = turn.env_steps[-n:] if n else ()
        if n and len(recent) == n and all(s.info.get("parse_error") for s in recent):
            return Termination(reason="critical_error", detail=f"{n} parse errors in a row")
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextBudget:
    """Cut the episode when a model call's sequence (prompt + completion tokens) exceeds
    `max_tokens`, as a server with that context length would. The over-long turn's action is
    not sent to the env; the episode is truncated with reason "max_seq_len"."""

    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"ContextBudget.max_tokens must be >= 1, got {self.max_tokens}")

    def check(self, turn: TurnView) -> Termination | None:
        if turn.phase != "act":
            return None
        for step in turn.act.steps:
            n = _sequence_tokens(step)
            if n > self.max_tokens:
                return Termination(
                    reason="context_budget",
                    truncated=True,
                    truncation_reason="max_seq_len",
                    detail=f"{n} tokens > {self.max_tokens}",
                )
        return None


def _sequence_tokens(step: AgentStep) -> int:
    if step.trace is not None:
        return len(step.trace.prompt_token_ids) + len(step.trace.completion_token_ids)
    return int(step.info.get("prompt_tokens", 0)) + int(step.info.get("completion_tokens", 0))


class TerminatingProtocol:
    """SingleAgentProtocol's loop with termination `rules` (checked in order, first wins).

    Per turn: the agent acts; "act"-phase rules may end the episode before the env sees the
    action (a synthetic last step records it); otherwise the env steps (or a parse failure is
    recorded) and the env's own terminated/truncated, then "env"-phase rules, may end it. The
    reason goes to the last env step's `info["termination_reason"]` (+ `termination_detail`)
    and to rollout meta (`termination_reason`, `termination_detail`, and `episode_truncated` /
    `truncation_reason` for a truncation). `rules` must include a `MaxSteps`.

    Seed 003's per-step record (StepData) in Ludic terms:
    observation -> `EnvironmentStep.prev_obs`, `AgentStep.info["observation"]`, and the exact
    prompt in `AgentStep.prompt_messages`; action -> `EnvironmentStep.action` (parsed) and
    `AgentStep.parse_result` / `tool_calls`; raw output -> `AgentStep.completion` (ids in
    `trace.completion_token_ids`); logprobs -> `AgentStep.trace.completion_logprobs`; value
    estimate -> `AgentStep.info["value_estimate"]` when a `value_estimator(obs, state_key)` is
    given; done -> `EnvironmentStep.terminated` / `truncated` (+ `truncation_reason`); step
    info -> `EnvironmentStep.info` (env) and `AgentStep.info` (model call); step index ->
    `EnvironmentStep.index`; resulting history -> the next call's `prompt_messages`.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        rules: Sequence[TerminationRule],
        external_tool_handler: ExternalToolHandler | None = None,
        max_external_calls: int = 8,
        value_estimator: ValueEstimator | None = None,
        rollout_id: str | None = None,
    ) -> None:
        if not any(isinstance(r, MaxSteps) for r in rules):
            raise ValueError(
                "TerminatingProtocol needs a MaxSteps rule (e.g. rules=[MaxSteps(max_steps=20), "
                "...]); without one an episode might never end"
            )
        self.agent = agent
        self.rules = tuple(rules)
        self.external_tool_handler = external_tool_handler
        self.max_external_calls = max_external_calls
        self.value_estimator = value_estimator
        self.rollout_id = rollout_id

    def check(self, turn: TurnView) -> Termination | None:
        for rule in self.rules:
            stop = rule.check(turn)
            if stop is not None:
                return stop
        return None

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]:
        aid = _seat(self.agent, env)
        collector = TraceCollector([aid], rollout_ids={aid: self.rollout_id or new_id()})
        async with closing_env(env):
            stop = await self._run_episode(env, aid, collector, sampling, env_seed)
            _record(collector, aid, stop)
        return collector.rollouts(env_seed=env_seed)

    async def _run_episode(
        self,
        env: LudicEnv,
        aid: str,
        collector: TraceCollector,
        sampling: SamplingConfig | None,
        env_seed: int | None,
    ) -> Termination:
        resets = await call_env(env, env.reset, seed=env_seed)
        obs, reset_info = resets[aid]
        self.agent.reset(env.system_prompt)
        self.agent.on_env_reset(obs, reset_info)
        env_steps: list[EnvironmentStep] = []
        while True:
            act = await act_with_tools(
                self.agent,
                turn_id=new_id(),
                sampling=sampling,
                step_info=await self._step_info(obs, state_key_to_str(env.state_key(aid))),
                rollout_id=collector.rollout_ids[aid],
                handler=self.external_tool_handler,
                max_external_calls=self.max_external_calls,
            )
            collector.add_agent_steps(aid, act.steps)
            index = collector.num_env_steps(aid)
            before = TurnView(phase="act", act=act, env_step=None, env_steps=tuple(env_steps))
            stop = self.check(before)
            if stop is not None:
                collector.add_env_step(aid, _stopped_step(act, obs, stop, index, aid))
                return stop
            if act.action is None:
                ids = tuple(s.id for s in act.steps)
                env_step = synthetic_failure_step(
                    act, obs, index=index, agent_id=aid, agent_step_ids=ids
                )
            else:
                env_step = await _env_step(env, act, obs, index=index, agent_id=aid)
                obs = env_step.next_obs or ""
            self.agent.on_after_step(env_step.next_obs, env_step.info)
            env_steps.append(env_step)
            collector.add_env_step(aid, env_step)
            view = TurnView(phase="env", act=act, env_step=env_step, env_steps=tuple(env_steps))
            stop = _env_ended(env_step) or self.check(view)
            if stop is not None:
                return stop

    async def _step_info(self, obs: str, state_key: str | None) -> Info:
        info: Info = {"observation": obs, "state_key": state_key}
        if self.value_estimator is not None:
            info["value_estimate"] = float(await maybe_await(self.value_estimator(obs, state_key)))
        return info


def _seat(agent: Agent, env: LudicEnv) -> str:
    """The agent's seat; a one-seat env under another name renames the agent to it."""
    if agent.agent_id in env.agent_ids:
        return agent.agent_id
    if len(env.agent_ids) != 1:
        raise ValueError(
            f"agent_id {agent.agent_id!r} is not a seat of {type(env).__name__} "
            f"{list(env.agent_ids)}; use MultiAgentProtocol for multi-seat envs"
        )
    agent.agent_id = env.agent_ids[0]  # its steps must name the seat they act for
    return agent.agent_id


async def _env_step(
    env: LudicEnv, act: AgentAct, obs: str, *, index: int, agent_id: str
) -> EnvironmentStep:
    assert act.action is not None
    outcome = (await call_env(env, env.step, {agent_id: act.action}))[agent_id]
    return EnvironmentStep(
        index=index,
        turn_id=act.final_step.turn_id,
        agent_id=agent_id,
        prev_obs=obs,
        action=act.action,
        next_obs=outcome.obs,
        reward=outcome.reward,
        terminated=outcome.terminated,
        truncated=outcome.truncated,
        truncation_reason="env" if outcome.truncated else None,
        state_key=state_key_to_str(env.state_key(agent_id)),
        agent_step_ids=tuple(s.id for s in act.steps),
        info=dict(outcome.info),
    )


def _env_ended(step: EnvironmentStep) -> Termination | None:
    if step.truncated:
        return Termination(reason="env_truncated", truncated=True, truncation_reason="env")
    if step.terminated:
        return Termination(reason="env_terminated")
    return None


def _stopped_step(
    act: AgentAct, obs: str, stop: Termination, index: int, agent_id: str
) -> EnvironmentStep:
    """The last step of an episode ended before the env saw the action: state unchanged."""
    return EnvironmentStep(
        index=index,
        turn_id=act.final_step.turn_id,
        agent_id=agent_id,
        prev_obs=obs,
        action=act.action,
        next_obs=None,
        reward=0.0,
        terminated=not stop.truncated,
        truncated=stop.truncated,
        truncation_reason=stop.truncation_reason,
        state_key=act.final_step.info.get("state_key"),
        agent_step_ids=tuple(s.id for s in act.steps),
        info={"synthetic": True},
    )


def _record(collector: TraceCollector, agent_id: str, stop: Termination) -> None:
    last = collector.last_env_step(agent_id)
    assert last is not None
    extra: Info = {"termination_reason": stop.reason, "termination_detail": stop.detail}
    if stop.truncated:
        extra["truncation_reason"] = stop.truncation_reason
    collector.replace_last_env_step(
        agent_id,
        dataclasses.replace(
            last,
            terminated=last.terminated or not stop.truncated,
            truncated=stop.truncated,
            truncation_reason=stop.truncation_reason,
            info=merge_step_info(last.info, extra),
        ),
    )
    meta: Info = {"termination_reason": stop.reason, "termination_detail": stop.detail}
    if stop.truncated:
        meta.update(episode_truncated=True, truncation_reason=stop.truncation_reason)
    collector.update_meta(agent_id, **meta)


__all__ = [
    "ContextBudget",
    "CriticalError",
    "MaxSteps",
    "OutputRegex",
    "Phase",
    "TerminateAction",
    "TerminatingProtocol",
    "Termination",
    "TerminationRule",
    "TurnView",
    "ValueEstimator",
]
