"""SingleAgentProtocol: the agent <-> env loop for one agent.

Owns truncation semantics (seed 000): env `terminated` / `truncated` end the episode; hitting
`max_steps` marks the last step `truncated` with `truncation_reason="max_steps"`. Parse
failures never reach the env: they become a synthetic EnvironmentStep (state unchanged,
feedback as next observation). External tool calls go to `external_tool_handler`.
"""

from __future__ import annotations

import dataclasses

from ludic.agents.base import Agent, AgentAct
from ludic.envs.base import LudicEnv, call_env, closing_env, state_key_to_str
from ludic.inference.sampling import SamplingConfig
from ludic.interaction.acting import ExternalToolHandler, act_with_tools
from ludic.interaction.collector import TraceCollector
from ludic.interaction.info import merge_step_info
from ludic.types import EnvironmentStep, Info, Rollout, new_id


class SingleAgentProtocol:
    """Run one agent against a single-agent (or one-seat) env.

    `max_steps` counts env steps, synthetic parse-failure steps included.
    `max_external_calls` bounds external tool round trips inside one turn. On a one-seat env
    whose seat is not the agent's id, an agent with the default id "agent_0" takes the seat's
    name; an agent with its own id (a sub-agent, say) keeps it in its rollout and steps.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        max_steps: int = 20,
        external_tool_handler: ExternalToolHandler | None = None,
        max_external_calls: int = 8,
        rollout_id: str | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.agent = agent
        self.max_steps = max_steps
        self.external_tool_handler = external_tool_handler
        self.max_external_calls = max_external_calls
        self.rollout_id = rollout_id

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]:
        aid = seat = self.agent.agent_id
        if aid not in env.agent_ids:
            if len(env.agent_ids) != 1:
                raise ValueError(
                    f"agent_id {aid!r} is not a seat of {type(env).__name__} "
                    f"{list(env.agent_ids)}; use MultiAgentProtocol for multi-seat envs"
                )
            seat = env.agent_ids[0]
            if aid == "agent_0":  # an unnamed agent takes the seat's name; a named one keeps its own
                aid = self.agent.agent_id = seat
        collector = TraceCollector([aid], rollout_ids={aid: self.rollout_id or new_id()})
        async with closing_env(env):
            await self._run_episode(env, aid, collector, sampling, env_seed, seat=seat)
        return collector.rollouts(env_seed=env_seed)

    async def _run_episode(
        self,
        env: LudicEnv,
        aid: str,
        collector: TraceCollector,
        sampling: SamplingConfig | None,
        env_seed: int | None,
        *,
        seat: str,
    ) -> None:
        resets = await call_env(env, env.reset, seed=env_seed)
        obs, reset_info = resets[seat]
        self.agent.reset(env.system_prompt)
        self.agent.on_env_reset(obs, reset_info)

        for _ in range(self.max_steps):
            turn_id = new_id()
            step_info = {"observation": obs, "state_key": state_key_to_str(env.state_key(seat))}
            act = await act_with_tools(
                self.agent,
                turn_id=turn_id,
                sampling=sampling,
                step_info=step_info,
                rollout_id=collector.rollout_ids[aid],
                handler=self.external_tool_handler,
                max_external_calls=self.max_external_calls,
            )
            collector.add_agent_steps(aid, act.steps)
            index = collector.num_env_steps(aid)
            env_step = await self._env_step(env, aid, act, obs, index, seat=seat)
            collector.add_env_step(aid, env_step)
            self.agent.on_after_step(env_step.next_obs, env_step.info)
            if act.action is not None:
                obs = env_step.next_obs or ""
            if env_step.terminated or env_step.truncated:
                if env_step.truncated:
                    collector.update_meta(aid, episode_truncated=True, truncation_reason="env")
                return
        mark_max_steps_truncation(collector, aid)

    @staticmethod
    async def _env_step(
        env: LudicEnv, aid: str, act: AgentAct, obs: str, index: int, *, seat: str
    ) -> EnvironmentStep:
        """Step the env with the turn's action, or record the parse failure without it."""
        agent_step_ids = tuple(s.id for s in act.steps)
        if act.action is None:
            return synthetic_failure_step(
                act, obs, index=index, agent_id=aid, agent_step_ids=agent_step_ids
            )
        outcome = (await call_env(env, env.step, {seat: act.action}))[seat]
        return EnvironmentStep(
            index=index,
            turn_id=act.final_step.turn_id,
            agent_id=aid,
            prev_obs=obs,
            action=act.action,
            next_obs=outcome.obs,
            reward=outcome.reward,
            terminated=outcome.terminated,
            truncated=outcome.truncated,
            truncation_reason="env" if outcome.truncated else None,
            state_key=state_key_to_str(env.state_key(seat)),
            agent_step_ids=agent_step_ids,
            info=dict(outcome.info),
        )


def synthetic_failure_step(
    act: AgentAct, obs: str, *, index: int, agent_id: str, agent_step_ids: tuple[str, ...]
) -> EnvironmentStep:
    """The step recorded for a parse failure: no env call, state unchanged, feedback shown."""
    pr = act.parse_result
    feedback = pr.obs if pr is not None and pr.obs is not None else "Invalid reply."
    info: Info = {"parse_error": True, "synthetic": True}
    if act.final_step.info.get("incomplete_completion"):
        info["incomplete_completion"] = True
    return EnvironmentStep(
        index=index,
        turn_id=act.final_step.turn_id,
        agent_id=agent_id,
        prev_obs=obs,
        action=None,
        next_obs=feedback,
        reward=0.0,
        terminated=False,
        truncated=False,
        state_key=act.final_step.info.get("state_key"),
        agent_step_ids=agent_step_ids,
        info=info,
    )


def mark_max_steps_truncation(collector: TraceCollector, agent_id: str) -> None:
    """Seed 000: the last step becomes truncated with reason "max_steps" (keeping next_obs)."""
    last = collector.last_env_step(agent_id)
    if last is not None:
        collector.replace_last_env_step(
            agent_id,
            dataclasses.replace(
                last,
                truncated=True,
                truncation_reason="max_steps",
                info=merge_step_info(last.info, {"truncation_reason": "max_steps"}),
            ),
        )
    collector.update_meta(agent_id, episode_truncated=True, truncation_reason="max_steps")
