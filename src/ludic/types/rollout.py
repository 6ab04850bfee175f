"""One agent's episode: `Rollout` (the ordered timeline of steps, JSON round-trip) and its
derived `Turn` view. The step records themselves live in `ludic.types.steps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ludic.types.messages import JSON, Info, new_id
from ludic.types.steps import AgentStep, EnvironmentStep, Step, step_from_dict


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
