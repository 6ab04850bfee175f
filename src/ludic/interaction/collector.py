"""TraceCollector: per-agent timelines for one episode, turned into Rollouts at the end."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ludic.types import AgentStep, EnvironmentStep, Info, Rollout, Step, new_id


class TraceCollector:
    """Accumulates each agent's steps in order and numbers them."""

    def __init__(self, agent_ids: Iterable[str], *, rollout_ids: dict[str, str] | None = None):
        self._steps: dict[str, list[Step]] = {aid: [] for aid in agent_ids}
        self._env_counts: dict[str, int] = dict.fromkeys(self._steps, 0)
        self.rollout_ids = {aid: (rollout_ids or {}).get(aid) or new_id() for aid in self._steps}
        self._meta: dict[str, Info] = {aid: {} for aid in self._steps}

    def add_agent_steps(self, agent_id: str, steps: Sequence[AgentStep]) -> None:
        self._steps[agent_id].extend(steps)

    def add_env_step(self, agent_id: str, step: EnvironmentStep) -> None:
        self._steps[agent_id].append(step)
        self._env_counts[agent_id] += 1

    def last_env_step(self, agent_id: str) -> EnvironmentStep | None:
        for s in reversed(self._steps[agent_id]):
            if isinstance(s, EnvironmentStep):
                return s
        return None

    def replace_last_env_step(self, agent_id: str, step: EnvironmentStep) -> None:
        steps = self._steps[agent_id]
        for i in range(len(steps) - 1, -1, -1):
            if isinstance(steps[i], EnvironmentStep):
                steps[i] = step
                return
        raise ValueError(f"agent {agent_id!r} has no environment step to replace")

    def env_steps(self, agent_id: str) -> tuple[EnvironmentStep, ...]:
        return tuple(s for s in self._steps[agent_id] if isinstance(s, EnvironmentStep))

    def num_env_steps(self, agent_id: str) -> int:
        return self._env_counts[agent_id]

    def update_meta(self, agent_id: str, **meta: object) -> None:
        self._meta[agent_id].update(meta)

    def rollouts(self, **meta: object) -> list[Rollout]:
        return [
            Rollout(
                id=self.rollout_ids[aid],
                agent_id=aid,
                steps=list(steps),
                meta={**meta, **self._meta[aid]},
            )
            for aid, steps in self._steps.items()
        ]
