"""MultiAgentProtocol: several agents, one env, one rollout per agent.

Each agent sees the outcome of every env step that concerns it, including steps in which it
did not act (an opponent's move), and its terminal reward. Agents act concurrently when the env
makes several active at once. An agent whose reply fails to parse gets a synthetic step and
acts again; the env is stepped only once every active agent has a valid action (valid actions
wait; one still waiting when `max_steps` runs out closes its turn with an unexecuted step,
`info["action_not_executed"]`). It does not schedule turns itself: `env.active_agents` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from ludic.agents.base import Agent, AgentAct, derive_call_seed
from ludic.envs.base import LudicEnv, call_env, closing_env, state_key_to_str
from ludic.inference.sampling import SamplingConfig
from ludic.interaction.acting import ExternalToolHandler, act_with_tools
from ludic.interaction.collector import TraceCollector
from ludic.interaction.info import merge_step_info
from ludic.interaction.single_agent import mark_max_steps_truncation, synthetic_failure_step
from ludic.types import EnvironmentStep, Rollout, StepOutcome, new_id


class MultiAgentProtocol:
    """Run `agents` (keyed by env seat) on a multi-agent env.

    `max_steps` bounds protocol iterations (env steps plus rounds of parse failures).
    Seats without an agent are an error: every seat the env schedules must have an agent.
    """

    def __init__(
        self,
        agents: Mapping[str, Agent],
        *,
        max_steps: int = 50,
        external_tool_handler: ExternalToolHandler | None = None,
        max_external_calls: int = 8,
    ) -> None:
        if not agents:
            raise ValueError("MultiAgentProtocol needs at least one agent")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.agents = dict(agents)
        for aid, agent in self.agents.items():
            agent.agent_id = aid
        self.max_steps = max_steps
        self.external_tool_handler = external_tool_handler
        self.max_external_calls = max_external_calls

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]:
        missing = [a for a in env.agent_ids if a not in self.agents]
        if missing:
            raise ValueError(f"no agent for env seat(s) {missing}; pass agents for every seat")
        collector = TraceCollector(self.agents)
        async with closing_env(env):
            await self._run_episode(env, collector, sampling, env_seed)
        return collector.rollouts(env_seed=env_seed)

    async def _run_episode(
        self,
        env: LudicEnv,
        collector: TraceCollector,
        sampling: SamplingConfig | None,
        env_seed: int | None,
    ) -> None:
        resets = await call_env(env, env.reset, seed=env_seed)
        obs: dict[str, str] = {}
        for aid, agent in self.agents.items():
            agent.reset(env.system_prompt)
            if aid in resets:
                obs[aid] = resets[aid][0]
                agent.on_env_reset(*resets[aid])
        pending: dict[str, AgentAct] = {}
        finished: set[str] = set()
        seat_sampling = {aid: _seat_sampling(sampling, i) for i, aid in enumerate(self.agents)}
        for _ in range(self.max_steps):
            active = [a for a in env.active_agents if a not in finished]
            if not active:
                return
            await self._collect_actions(env, active, pending, obs, collector, seat_sampling)
            if any(a not in pending for a in active):
                continue  # valid actions wait while the others retry
            outcomes = await call_env(env, env.step, {a: pending[a].action or "" for a in active})
            unanswered = [a for a in active if a not in outcomes]
            if unanswered:
                raise ValueError(
                    f"{type(env).__name__}.step returned no outcome for acting agent(s) "
                    f"{unanswered}; an env must return an outcome for every agent that acted"
                )
            for aid, outcome in outcomes.items():
                if aid not in self.agents:
                    continue
                self._record_outcome(env, aid, outcome, pending.get(aid), obs, collector)
                if outcome.terminated or outcome.truncated:
                    finished.add(aid)
                    if outcome.truncated:
                        collector.update_meta(aid, episode_truncated=True, truncation_reason="env")
            pending.clear()
            if finished >= set(self.agents):
                return
        for aid in self.agents:
            if aid in finished:
                continue
            if aid in pending:  # a valid action still waiting: close its turn unexecuted
                collector.add_env_step(aid, _unexecuted_step(pending[aid], obs, collector, aid))
            mark_max_steps_truncation(collector, aid)

    async def _collect_actions(
        self,
        env: LudicEnv,
        active: Sequence[str],
        pending: dict[str, AgentAct],
        obs: Mapping[str, str],
        collector: TraceCollector,
        sampling: Mapping[str, SamplingConfig | None],
    ) -> None:
        """Ask every active agent without a valid action; record parse failures."""
        waiting = [a for a in active if a not in pending]
        acts = await asyncio.gather(
            *(
                act_with_tools(
                    self.agents[aid],
                    turn_id=new_id(),
                    sampling=sampling[aid],
                    step_info={
                        "observation": obs.get(aid, ""),
                        "state_key": state_key_to_str(env.state_key(aid)),
                    },
                    rollout_id=collector.rollout_ids[aid],
                    handler=self.external_tool_handler,
                    max_external_calls=self.max_external_calls,
                )
                for aid in waiting
            )
        )
        for aid, act in zip(waiting, acts, strict=True):
            collector.add_agent_steps(aid, act.steps)
            if act.action is not None:
                pending[aid] = act
                continue
            step = synthetic_failure_step(
                act,
                obs.get(aid, ""),
                index=collector.num_env_steps(aid),
                agent_id=aid,
                agent_step_ids=tuple(s.id for s in act.steps),
            )
            collector.add_env_step(aid, step)
            self.agents[aid].on_after_step(step.next_obs, step.info)

    def _record_outcome(
        self,
        env: LudicEnv,
        aid: str,
        outcome: StepOutcome,
        act: AgentAct | None,
        obs: dict[str, str],
        collector: TraceCollector,
    ) -> None:
        """One EnvironmentStep in `aid`'s timeline; `act` is None if it only observed."""
        step = EnvironmentStep(
            index=collector.num_env_steps(aid),
            turn_id=act.final_step.turn_id if act is not None else new_id(),
            agent_id=aid,
            prev_obs=obs.get(aid, ""),
            action=act.action if act is not None else None,
            next_obs=outcome.obs,
            reward=outcome.reward,
            terminated=outcome.terminated,
            truncated=outcome.truncated,
            truncation_reason="env" if outcome.truncated else None,
            state_key=state_key_to_str(env.state_key(aid)),
            agent_step_ids=tuple(s.id for s in act.steps) if act is not None else (),
            info=merge_step_info(outcome.info, {} if act is not None else {"observed": True}),
        )
        collector.add_env_step(aid, step)
        obs[aid] = outcome.obs
        self.agents[aid].on_after_step(outcome.obs, outcome.info)


def _seat_sampling(sampling: SamplingConfig | None, seat: int) -> SamplingConfig | None:
    """Each seat gets its own episode seed, so two agents never share a call's seed."""
    if sampling is None or sampling.seed is None:
        return sampling
    return sampling.with_seed(derive_call_seed(sampling.seed, -(seat + 1)))


def _unexecuted_step(
    act: AgentAct, obs: Mapping[str, str], collector: TraceCollector, aid: str
) -> EnvironmentStep:
    """Close the turn of a valid action the env never received (the others were still
    retrying when `max_steps` ran out): state unchanged, no reward, no next observation."""
    return EnvironmentStep(
        index=collector.num_env_steps(aid),
        turn_id=act.final_step.turn_id,
        agent_id=aid,
        prev_obs=obs.get(aid, ""),
        action=act.action,
        next_obs=None,
        state_key=act.final_step.info.get("state_key"),
        agent_step_ids=tuple(s.id for s in act.steps),
        info={"action_not_executed": True},
    )
