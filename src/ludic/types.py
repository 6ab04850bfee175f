"""Core records shared by every layer: messages, token traces, steps and rollouts.

Every record round-trips exactly through JSON (`to_dict` / `from_dict`), because offline data
files and the Redis pipeline carry them. Records are plain data: no behaviour beyond validation
and small derived views (`Rollout.turns()`). Nothing here imports torch.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

# A chat message in the OpenAI format: {"role": ..., "content": ..., optional "tool_calls",
# "tool_call_id", "name"}. Kept as a plain dict so it goes to any OpenAI-compatible server as is.
Message: TypeAlias = dict[str, Any]
JSON: TypeAlias = dict[str, Any]
Info: TypeAlias = dict[str, Any]

ActionTarget = Literal["internal", "external", "env"]
TruncationReason = Literal["max_steps", "env", "max_seq_len"]
ACTION_TARGETS: tuple[str, ...] = ("internal", "external", "env")
TRUNCATION_REASONS: tuple[str, ...] = ("max_steps", "env", "max_seq_len")


def new_id() -> str:
    """A fresh random id (hex uuid4)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True, slots=True)
class BehaviorSampling:
    """The sampling transform that defines behaviour logprobs (one definition for every backend).

    The behaviour logprob of a sampled token is its log-probability under the distribution it
    was actually drawn from: softmax(logits / temperature), restricted to the top-k / top-p
    support and renormalised there (top-k first, then top-p on the top-k survivors' renormalised
    probabilities; a token is dropped by top-p when the mass of the tokens ranked above it
    already reaches top_p, so the top token always survives). Temperature 0 (greedy) counts as
    temperature 1 with the same support: greedy rows report the model's own (truncated)
    distribution, which the trainer recomputes the same way; a greedy sample is not a draw
    from it, so do not train ratio losses on greedy rollouts. Tokens forced by the backend
    (`max_think` closing a think block) are drawn from a point mass: they are not policy
    actions and are left out of the loss (see `TokenTrace.forced_positions`).

    The embedded engine's "processed" logprobs mode computes exactly this
    (`ludic.inference.token_sampling`); vLLM does with `logprobs-mode=processed_logprobs`. The
    trainer recomputes logprobs under the same transform, per sample, so the importance ratio
    of an on-policy sample is exactly 1. `top_k` -1 (or 0) and `top_p` 1 turn the filters off.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and 0 < self.top_p <= 1):
            raise ValueError(
                f"BehaviorSampling: need temperature >= 0 and 0 < top_p <= 1, got "
                f"temperature={self.temperature}, top_p={self.top_p}"
            )
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", int(self.top_k) if self.top_k > 0 else -1)
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def is_identity(self) -> bool:
        """True when the transform leaves the model's distribution unchanged (temperature 1 or
        greedy, no top-k, no top-p)."""
        return self.temperature in (0.0, 1.0) and self.top_k <= 0 and self.top_p >= 1.0

    def to_dict(self) -> JSON:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BehaviorSampling:
        return cls(
            temperature=float(d.get("temperature", 1.0)),
            top_k=int(d.get("top_k", -1)),
            top_p=float(d.get("top_p", 1.0)),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenTrace:
    """The exact tokens of one model call: what the server saw and what it sampled.

    `completion_logprobs` are the behaviour policy's logprobs of each sampled token (see
    `BehaviorSampling` for the definition); they may be absent (None) for backends that cannot
    return them, but never partially present. `sampling` is the transform they were computed
    under (None: unknown, treated as the identity). `forced_positions` index completion tokens
    the backend forced instead of sampling (max_think); they are not trained on.
    """

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...] | None = None
    sampling: BehaviorSampling | None = None
    forced_positions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(map(int, self.prompt_token_ids)))
        object.__setattr__(self, "completion_token_ids", tuple(map(int, self.completion_token_ids)))
        object.__setattr__(self, "forced_positions", tuple(map(int, self.forced_positions)))
        n = len(self.completion_token_ids)
        if any(not 0 <= i < n for i in self.forced_positions):
            raise ValueError(
                f"TokenTrace: forced_positions {list(self.forced_positions)} must index the "
                f"{n} completion tokens"
            )
        if self.completion_logprobs is not None:
            lp = tuple(float(x) for x in self.completion_logprobs)
            object.__setattr__(self, "completion_logprobs", lp)
            if len(lp) != n:
                raise ValueError(
                    f"TokenTrace: {len(lp)} completion logprobs for "
                    f"{n} completion tokens; a backend must return "
                    "one logprob per sampled token (or none at all)"
                )

    def to_dict(self) -> JSON:
        d: JSON = {
            "prompt_token_ids": list(self.prompt_token_ids),
            "completion_token_ids": list(self.completion_token_ids),
            "completion_logprobs": (
                None if self.completion_logprobs is None else list(self.completion_logprobs)
            ),
        }
        if self.sampling is not None:
            d["sampling"] = self.sampling.to_dict()
        if self.forced_positions:
            d["forced_positions"] = list(self.forced_positions)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenTrace:
        lp = d.get("completion_logprobs")
        sampling = d.get("sampling")
        return cls(
            prompt_token_ids=tuple(d["prompt_token_ids"]),
            completion_token_ids=tuple(d["completion_token_ids"]),
            completion_logprobs=None if lp is None else tuple(lp),
            sampling=None if sampling is None else BehaviorSampling.from_dict(sampling),
            forced_positions=tuple(d.get("forced_positions", ())),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """A tool call the model made. `arguments` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> JSON:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        return cls(id=d["id"], name=d["name"], arguments=d["arguments"])

    def to_message_part(self) -> JSON:
        """OpenAI `tool_calls` entry for an assistant message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """The result fed back to the model for one tool call; `is_error` marks failures."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False

    def to_dict(self) -> JSON:
        return {
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "content": self.content,
            "is_error": self.is_error,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolResult:
        return cls(
            tool_call_id=d["tool_call_id"],
            name=d["name"],
            content=d["content"],
            is_error=bool(d.get("is_error", False)),
        )

    def to_message(self) -> Message:
        return {
            "role": "tool",
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "content": self.content,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ParseResult:
    """What a parser made of a completion.

    `action` is the env action, or None on a parse failure. `reward` is the parser's intrinsic
    reward (format bonus or failure penalty). `obs` is feedback for the agent on failure.
    """

    action: str | None
    reward: float = 0.0
    obs: str | None = None

    @property
    def ok(self) -> bool:
        return self.action is not None

    def to_dict(self) -> JSON:
        return {"action": self.action, "reward": self.reward, "obs": self.obs}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParseResult:
        return cls(action=d.get("action"), reward=float(d.get("reward", 0.0)), obs=d.get("obs"))


@dataclass(frozen=True, kw_only=True, slots=True)
class StepOutcome:
    """What an env returns for one agent after `step` (the env's state identity, used by GiGPO,
    comes from `LudicEnv.state_key`, not from here)."""

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


@dataclass(frozen=True, kw_only=True, slots=True)
class Turn:
    """A derived view: the agent steps of one turn and the env step they led to.

    `reward` is the turn's total: parser rewards of its agent steps, the env step's reward, and
    rewards of env steps the agent only observed before its next turn (`observed_steps`).
    """

    turn_id: str
    agent_steps: tuple[AgentStep, ...]
    env_step: EnvironmentStep | None
    observed_steps: tuple[EnvironmentStep, ...] = ()

    @property
    def reward(self) -> float:
        r = sum(s.reward for s in self.agent_steps)
        if self.env_step is not None:
            r += self.env_step.reward
        return r + sum(s.reward for s in self.observed_steps)

    @property
    def last_step(self) -> Step:
        """The step whose outcome closes the turn (env step, else the last agent step)."""
        if self.env_step is not None:
            return self.env_step
        return self.agent_steps[-1]

    @property
    def state_key(self) -> str | None:
        """Key of the state the agent acted from, set by the protocol on its first agent step."""
        return self.agent_steps[0].info.get("state_key") if self.agent_steps else None

    @property
    def observation(self) -> str:
        """The observation the agent acted on (for state grouping when no key exists)."""
        if self.agent_steps:
            return str(self.agent_steps[0].info.get("observation", ""))
        return ""


@dataclass(kw_only=True, slots=True)
class Rollout:
    """One agent's timeline for one episode: AgentSteps and EnvironmentSteps in order.

    `meta` carries episode-level facts: `episode_truncated`, `truncation_reason`, `env_seed`,
    `sampling_seed`, `group_id`, `request_id`, `parent_rollout_id` (delegation), `error` /
    `error_type` for a failed episode, and anything the protocol or caller adds.
    """

    id: str = field(default_factory=new_id)
    agent_id: str = "agent_0"
    steps: list[Step] = field(default_factory=list)
    meta: Info = field(default_factory=dict)

    @property
    def agent_steps(self) -> list[AgentStep]:
        return [s for s in self.steps if isinstance(s, AgentStep)]

    @property
    def env_steps(self) -> list[EnvironmentStep]:
        return [s for s in self.steps if isinstance(s, EnvironmentStep)]

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def failed(self) -> bool:
        """True when the episode raised or timed out (see `meta["error"]`)."""
        return "error" in self.meta

    @property
    def group_id(self) -> str | None:
        gid = self.meta.get("group_id")
        return None if gid is None else str(gid)

    def turns(self) -> list[Turn]:
        """Group the timeline into turns (see `Turn`), in order."""
        turns: list[Turn] = []
        pending: list[AgentStep] = []
        for s in self.steps:
            if isinstance(s, AgentStep):
                if pending and s.turn_id != pending[-1].turn_id:
                    turns.append(
                        Turn(turn_id=pending[-1].turn_id, agent_steps=tuple(pending), env_step=None)
                    )
                    pending = []
                pending.append(s)
            elif pending:
                turns.append(
                    Turn(turn_id=pending[-1].turn_id, agent_steps=tuple(pending), env_step=s)
                )
                pending = []
            elif turns:
                last = turns[-1]
                turns[-1] = Turn(
                    turn_id=last.turn_id,
                    agent_steps=last.agent_steps,
                    env_step=last.env_step,
                    observed_steps=(*last.observed_steps, s),
                )
            else:
                # An outcome observed before this agent ever acted: a turn with no agent steps.
                turns.append(Turn(turn_id=s.turn_id, agent_steps=(), env_step=s))
        if pending:
            turns.append(
                Turn(turn_id=pending[-1].turn_id, agent_steps=tuple(pending), env_step=None)
            )
        return turns

    def to_dict(self) -> JSON:
        return {
            "id": self.id,
            "agent_id": self.agent_id,
            "steps": [s.to_dict() for s in self.steps],
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rollout:
        return cls(
            id=d["id"],
            agent_id=d.get("agent_id", "agent_0"),
            steps=[step_from_dict(s) for s in d.get("steps", ())],
            meta=dict(d.get("meta", {})),
        )


__all__ = [
    "ACTION_TARGETS",
    "JSON",
    "TRUNCATION_REASONS",
    "ActionTarget",
    "AgentStep",
    "BehaviorSampling",
    "EnvironmentStep",
    "Info",
    "Message",
    "ParseResult",
    "Rollout",
    "Step",
    "StepOutcome",
    "TokenTrace",
    "ToolCall",
    "ToolResult",
    "TruncationReason",
    "Turn",
    "new_id",
    "step_from_dict",
]
