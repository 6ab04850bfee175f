"""Steps of a timeline: `AgentStep` (one model call), `EnvironmentStep` (one env transition),
the env's `StepOutcome`, and `step_from_dict`. Grouping steps into turns and rollouts lives in
`ludic.types.rollout`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ludic.types.messages import (
    JSON,
    Info,
    Message,
    ParseResult,
    ToolCall,
    ToolResult,
    new_id,
)
from ludic.types.tokens import TokenTrace

ActionTarget = Literal["internal", "external", "env"]
TruncationReason = Literal["max_steps", "env", "max_seq_len"]
ACTION_TARGETS: tuple[str, ...] = ("internal", "external", "env")
TRUNCATION_REASONS: tuple[str, ...] = ("max_steps", "env", "max_seq_len")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepOutcome:
    """What an env returns for one agent after `step` (the env's state identity, used by GiGPO,
    comes from `LudicEnv.state_key`, not from here).

    `terminated`: the episode reached a terminal state (won, lost, answered). `truncated`: it
    was cut off for an outside reason (a time limit inside the env). Both True is recorded as
    terminated only, as Gymnasium reads the pair (`ludic.interaction.termination.env_end_fields`)."""

    obs: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Info = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentStep:
    """One model call. Every call is recorded, including tool loops inside a turn.

    `action_target` says what the protocol does next: "internal" (the agent ran a tool itself),
    "external" (the protocol must handle the tool calls), "env" (a final action for the env).
    `reward` is the parser's reward for this call (0 unless it parsed an action or failed).
    """

    id: str = field(default_factory=new_id)
    index: int = 0
    turn_id: str = ""
    agent_id: str = "agent_0"
    loop_index: int = 0
    prompt_messages: tuple[Message, ...] = ()
    completion: str = ""
    trace: TokenTrace | None = None
    finish_reason: str | None = None
    policy_version: int | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    action_target: ActionTarget = "env"
    parse_result: ParseResult | None = None
    reward: float = 0.0
    info: Info = field(default_factory=dict)

    kind: Literal["agent"] = field(default="agent", init=False)

    def __post_init__(self) -> None:
        if self.action_target not in ACTION_TARGETS:
            raise ValueError(
                f"AgentStep.action_target must be one of {ACTION_TARGETS}, got "
                f"{self.action_target!r}"
            )

    def to_dict(self) -> JSON:
        return {
            "kind": "agent",
            "id": self.id,
            "index": self.index,
            "turn_id": self.turn_id,
            "agent_id": self.agent_id,
            "loop_index": self.loop_index,
            "prompt_messages": [dict(m) for m in self.prompt_messages],
            "completion": self.completion,
            "trace": None if self.trace is None else self.trace.to_dict(),
            "finish_reason": self.finish_reason,
            "policy_version": self.policy_version,
            "tool_calls": [t.to_dict() for t in self.tool_calls],
            "tool_results": [t.to_dict() for t in self.tool_results],
            "action_target": self.action_target,
            "parse_result": None if self.parse_result is None else self.parse_result.to_dict(),
            "reward": self.reward,
            "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AgentStep:
        trace = d.get("trace")
        pr = d.get("parse_result")
        return cls(
            id=d["id"],
            index=int(d["index"]),
            turn_id=d["turn_id"],
            agent_id=d["agent_id"],
            loop_index=int(d["loop_index"]),
            prompt_messages=tuple(dict(m) for m in d.get("prompt_messages", ())),
            completion=d["completion"],
            trace=None if trace is None else TokenTrace.from_dict(trace),
            finish_reason=d.get("finish_reason"),
            policy_version=d.get("policy_version"),
            tool_calls=tuple(ToolCall.from_dict(t) for t in d.get("tool_calls", ())),
            tool_results=tuple(ToolResult.from_dict(t) for t in d.get("tool_results", ())),
            action_target=d["action_target"],
            parse_result=None if pr is None else ParseResult.from_dict(pr),
            reward=float(d.get("reward", 0.0)),
            info=dict(d.get("info", {})),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class EnvironmentStep:
    """One env transition as one agent saw it.

    `agent_step_ids` name the AgentSteps whose final action produced this transition; it is
    empty when the agent did not act (another agent moved and this agent observed the outcome).
    `truncation_reason` is "max_steps" (protocol limit) or "env" (env cut the episode off).
    `state_key` is the env's key AFTER this step (of the state `next_obs` shows); the state
    the agent acted from is `Turn.state_key` (the agent step's `info["state_key"]`), which is
    what GiGPO groups by.
    """

    id: str = field(default_factory=new_id)
    index: int = 0
    turn_id: str = ""
    agent_id: str = "agent_0"
    prev_obs: str = ""
    action: str | None = None
    next_obs: str | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    truncation_reason: TruncationReason | None = None
    state_key: str | None = None
    agent_step_ids: tuple[str, ...] = ()
    info: Info = field(default_factory=dict)

    kind: Literal["env"] = field(default="env", init=False)

    def __post_init__(self) -> None:
        if self.truncation_reason is not None and self.truncation_reason not in (
            TRUNCATION_REASONS
        ):
            raise ValueError(
                f"EnvironmentStep.truncation_reason must be one of {TRUNCATION_REASONS} or None, "
                f"got {self.truncation_reason!r}"
            )

    def to_dict(self) -> JSON:
        return {
            "kind": "env",
            "id": self.id,
            "index": self.index,
            "turn_id": self.turn_id,
            "agent_id": self.agent_id,
            "prev_obs": self.prev_obs,
            "action": self.action,
            "next_obs": self.next_obs,
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "truncation_reason": self.truncation_reason,
            "state_key": self.state_key,
            "agent_step_ids": list(self.agent_step_ids),
            "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EnvironmentStep:
        return cls(
            id=d["id"],
            index=int(d["index"]),
            turn_id=d["turn_id"],
            agent_id=d["agent_id"],
            prev_obs=d["prev_obs"],
            action=d.get("action"),
            next_obs=d.get("next_obs"),
            reward=float(d.get("reward", 0.0)),
            terminated=bool(d["terminated"]),
            truncated=bool(d["truncated"]),
            truncation_reason=d.get("truncation_reason"),
            state_key=d.get("state_key"),
            agent_step_ids=tuple(d.get("agent_step_ids", ())),
            info=dict(d.get("info", {})),
        )


Step: TypeAlias = AgentStep | EnvironmentStep


def step_from_dict(d: Mapping[str, Any]) -> Step:
    """Rebuild an AgentStep or EnvironmentStep from its `to_dict` form (by its "kind")."""
    kind = d.get("kind")
    if kind == "agent":
        return AgentStep.from_dict(d)
    if kind == "env":
        return EnvironmentStep.from_dict(d)
    raise ValueError(f"step record has kind {kind!r}; expected 'agent' or 'env'")
