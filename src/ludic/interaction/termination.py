"""Episode termination as composable rules (seed 003, Task 2.3), the TerminationRules component
every protocol holds (`termination=[...]`), and the one way an episode's end is recorded.

A "critical error" here is one an env or a tool reports in its info; an env or client that
raises still fails the episode (the RolloutEngine records it). Rules keep no state. This module
runs no loop: each protocol checks the rules at its "act" and "env" phases.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict, runtime_checkable

from ludic.agents.base import AgentAct
from ludic.interaction.collector import TraceCollector
from ludic.interaction.info import merge_step_info
from ludic.types import AgentStep, EnvironmentStep, Info, StepOutcome, TruncationReason

Phase = Literal["act", "env"]


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
        _check_count(self.max_steps, "MaxSteps.max_steps")

    def check(self, turn: TurnView) -> Termination | None:
        if turn.phase == "env" and len(turn.env_steps) >= self.max_steps:
            return max_steps_termination(self.max_steps)
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class TerminateAction:
    """End the episode when the agent's action is one of `actions` (stripped, case-insensitive
    unless `case_sensitive`). The env never sees the terminate action."""

    actions: tuple[str, ...] = ("terminate",)
    case_sensitive: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.actions, str):  # would match each of its characters
            raise TypeError(
                f"TerminateAction.actions is a sequence of actions, got the str "
                f"{self.actions!r}; pass actions=({self.actions!r},)"
            )

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


def _check_count(value: object, name: str) -> None:
    """A TypeError for a count that is not an int ("3", 2.5, True would reach `range` or a
    comparison and fail each episode with a message naming neither), a ValueError below 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an int, got {type(value).__name__} {value!r}; pass an int >= 1"
        )
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _critical_detail(key: str, value: object) -> str:
    """A readable `termination_detail` for a truthy `info[key]`: a message as it is, an
    exception as "Type: message", a bare flag as which key was set, anything else with it."""
    if isinstance(value, str):
        return value.strip() or f"env step info[{key!r}] set"
    if value is True:
        return f"env step info[{key!r}] set"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    return f"env step info[{key!r}] = {value!r}"


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
        if n is not None:
            _check_count(n, "CriticalError.max_consecutive_parse_errors")

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
            return Termination(
                reason="critical_error", detail=_critical_detail(self.info_key, value)
            )
        n = self.max_consecutive_parse_errors or 0
        recent = turn.env_steps[-n:] if n else ()
        if n and len(recent) == n and all(s.info.get("parse_error") for s in recent):
            return Termination(reason="critical_error", detail=f"{n} parse {_errors(n)} in a row")
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextBudget:
    """Cut the episode when a model call's sequence (prompt + completion tokens) exceeds
    `max_tokens`, as a server with that context length would. The over-long turn's action is
    not sent to the env; the episode is truncated with reason "max_seq_len"."""

    max_tokens: int

    def __post_init__(self) -> None:
        _check_count(self.max_tokens, "ContextBudget.max_tokens")

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


@dataclass(frozen=True, slots=True)
class TerminationRules:
    """The termination component every protocol holds: its rules (checked in order, first
    wins) and its step bound `max_steps`, the protocol's last word when no rule fired."""

    rules: tuple[TerminationRule, ...]
    max_steps: int

    @classmethod
    def build(
        cls,
        termination: Sequence[TerminationRule],
        max_steps: int | None,
        *,
        default_max_steps: int,
        owner: str,
    ) -> TerminationRules:
        """`max_steps` or, when None, the smallest `MaxSteps` rule, else `default_max_steps`.
        A `max_steps` that disagrees with a `MaxSteps` rule is an error: one would silently
        win."""
        rules = tuple(termination)
        for rule in rules:
            if not isinstance(rule, TerminationRule):
                raise TypeError(
                    f"{owner}: termination rules need a check(turn) method, got "
                    f"{type(rule).__name__}; use MaxSteps, TerminateAction, OutputRegex, "
                    "CriticalError, ContextBudget or your own TerminationRule"
                )
        if max_steps is not None:
            _check_count(max_steps, f"{owner} max_steps")
        limits = [r.max_steps for r in rules if isinstance(r, MaxSteps)]
        if max_steps is not None and limits and max_steps != min(limits):
            raise ValueError(
                f"{owner}: got max_steps={max_steps} and a MaxSteps rule with "
                f"max_steps={min(limits)}; pass only one of them"
            )
        bound = max_steps if max_steps is not None else min(limits, default=default_max_steps)
        if bound < 1:
            raise ValueError(f"max_steps must be >= 1, got {bound}")
        return cls(rules, bound)

    def check(self, turn: TurnView) -> Termination | None:
        for rule in self.rules:
            stop = rule.check(turn)
            if stop is not None:
                return stop
        return None

    def out_of_steps(self) -> Termination:
        """The episode ran `max_steps` protocol steps without ending."""
        return max_steps_termination(self.max_steps)


def _errors(n: int) -> str:
    return "error" if n == 1 else "errors"


def max_steps_termination(max_steps: int) -> Termination:
    return Termination(
        reason="max_steps",
        truncated=True,
        truncation_reason="max_steps",
        detail=f"{max_steps} step{'' if max_steps == 1 else 's'}",
    )


ENV_REASONS = frozenset({"env_terminated", "env_truncated"})


class EnvEndFields(TypedDict):
    terminated: bool
    truncated: bool
    truncation_reason: TruncationReason | None


def env_end_fields(outcome: StepOutcome) -> EnvEndFields:
    """The `terminated`, `truncated` and `truncation_reason` an EnvironmentStep records for an
    env's `outcome`. An outcome both terminated and truncated is recorded as terminated only,
    as Gymnasium reads the pair: the episode reached a terminal state (no value to bootstrap
    from), so it is not a cut-off episode (it keeps its samples where truncated episodes are
    dropped, and its `termination_reason` is "env_terminated")."""
    truncated = outcome.truncated and not outcome.terminated
    return EnvEndFields(
        terminated=outcome.terminated,
        truncated=truncated,
        truncation_reason="env" if truncated else None,
    )


def env_ended(step: EnvironmentStep) -> Termination | None:
    """The env's own terminated / truncated flags as a Termination (termination wins, as in
    `env_end_fields`)."""
    if step.terminated:
        return Termination(reason="env_terminated")
    if step.truncated:
        return Termination(reason="env_truncated", truncated=True, truncation_reason="env")
    return None


def parse_failure_info(act: AgentAct) -> Info:
    """The step info that records `act` as a parse failure (`parse_error`, and
    `incomplete_completion` for a reply cut off at the token limit); {} for a parsed act."""
    if act.action is not None:
        return {}
    info: Info = {"parse_error": True}
    if act.final_step.info.get("incomplete_completion"):
        info["incomplete_completion"] = True
    return info


def unexecuted_step(
    act: AgentAct, obs: str, *, index: int, agent_id: str, info: Info
) -> EnvironmentStep:
    """Close a turn whose action the env never saw (a rule ended the episode first, or other
    seats were still retrying): state unchanged, no reward, no next observation. A reply that
    did not parse is still recorded as a parse failure (`parse_failure_info`), so every count
    of parse failures sees it. Flags for the episode's end come from `record_termination`."""
    return EnvironmentStep(
        index=index,
        turn_id=act.final_step.turn_id,
        agent_id=agent_id,
        prev_obs=obs,
        action=act.action,
        next_obs=None,
        state_key=act.final_step.info.get("state_key"),
        agent_step_ids=tuple(s.id for s in act.steps),
        info=merge_step_info(info, parse_failure_info(act)),
    )


def record_termination(collector: TraceCollector, agent_id: str, stop: Termination) -> None:
    """Record why `agent_id`'s episode ended, the same way in every protocol. Rollout meta gets
    `termination_reason`, `termination_detail` and, for a truncation, `episode_truncated` and
    `truncation_reason`. When the protocol ended it (a rule, out of steps), the last env step
    also gets the flags (`terminated` unless truncated; `truncated` + `truncation_reason`) and
    `info["termination_reason"]` / `termination_detail` (+ `truncation_reason`); when the env
    ended it, its step stays as the env wrote it (its own flags say so). An agent without an
    env step gets the meta only."""
    last = collector.last_env_step(agent_id)
    if last is not None and stop.reason not in ENV_REASONS:
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
    "ENV_REASONS",
    "ContextBudget",
    "CriticalError",
    "EnvEndFields",
    "MaxSteps",
    "OutputRegex",
    "Phase",
    "TerminateAction",
    "Termination",
    "TerminationRule",
    "TerminationRules",
    "TurnView",
    "env_end_fields",
    "env_ended",
    "max_steps_termination",
    "parse_failure_info",
    "record_termination",
    "unexecuted_step",
]
