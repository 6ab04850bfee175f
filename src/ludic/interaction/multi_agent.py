"""MultiAgentProtocol: several agents, one env, one rollout per agent.

Each agent sees the outcome of every env step that concerns it, including steps in which it
did not act (an opponent's move), and its terminal reward. Agents act concurrently when the env
makes several active at once. An agent whose reply fails to parse gets a synthetic step and
acts again; the env is stepped only once every active agent has a valid action (valid actions
wait; one still waiting when the episode ends closes its turn with an unexecuted step,
`info["action_not_executed"]`). On an env that takes one reply per episode
(`parse_failure_ends_episode`) a parse failure instead ends the episode, recorded on the
failing agent's step as in SingleAgentProtocol (`termination_reason` "parse_error"), and for
every seat still playing, since the env cannot step without that agent's action. A seat that
took no part (the episode ended before it acted or was told anything) gets no rollout: an empty
one would enter its seat's group baseline and the batch's mean reward as a return of 0 that
nobody earned. It does not schedule turns itself: `env.active_agents` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from ludic.agents.base import Agent, AgentAct, derive_call_seed
from ludic.envs.base import (
    LudicEnv,
    call_env,
    closing_env,
    read_current_observation,
    read_state_key,
)
from ludic.inference.sampling import SamplingConfig
from ludic.interaction.acting import ExternalToolHandler, act_with_tools
from ludic.interaction.base import EnvReturns, checked_agent, checked_env, checked_env_seed
from ludic.interaction.collector import TraceCollector
from ludic.interaction.info import merge_step_info
from ludic.interaction.single_agent import parse_failure_end, synthetic_failure_step
from ludic.interaction.termination import (
    Termination,
    TerminationRule,
    TerminationRules,
    TurnView,
    env_end_fields,
    env_ended,
    record_termination,
    unexecuted_step,
)
from ludic.types import EnvironmentStep, Rollout, StepOutcome, new_id


class MultiAgentProtocol:
    """Run `agents` (keyed by env seat) on a multi-agent env.

    `max_steps` (default 50, or the smallest `MaxSteps` rule in `termination`) bounds protocol
    iterations (env steps plus rounds of parse failures). `termination` rules are checked for
    each agent's turn as in SingleAgentProtocol ("act" phase on every reply, "env" phase after
    the env step or parse failure of an agent that acted; `TurnView.env_steps` is that agent's
    own timeline). A rule that fires ends the episode for every agent the env has not finished,
    each recorded with the same reason (`record_termination`). Seats without an agent are an
    error: every seat the env schedules must have an agent.

    `run` returns one rollout per seat that has a step (one it acted in or only observed);
    a seat with none, say the second player of a game the first ended at its first reply, gets
    no rollout, and the others' `meta["seats_without_steps"]` lists it. An episode in which no
    seat has a step (no seat was ever active) is an error naming the env.
    """

    def __init__(
        self,
        agents: Mapping[str, Agent],
        *,
        max_steps: int | None = None,
        termination: Sequence[TerminationRule] = (),
        external_tool_handler: ExternalToolHandler | None = None,
        max_external_calls: int = 8,
    ) -> None:
        if not agents:
            raise ValueError("MultiAgentProtocol needs at least one agent")
        self.termination = TerminationRules.build(
            termination, max_steps, default_max_steps=50, owner="MultiAgentProtocol"
        )
        self.agents = {aid: checked_agent(a, "MultiAgentProtocol") for aid, a in agents.items()}
        for aid, agent in self.agents.items():
            agent.agent_id = aid
        self.max_steps = self.termination.max_steps
        self.external_tool_handler = external_tool_handler
        self.max_external_calls = max_external_calls

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]:
        env = checked_env(env, "MultiAgentProtocol")
        env_seed = checked_env_seed(env_seed)
        missing = [a for a in env.agent_ids if a not in self.agents]
        if missing:
            strays = [a for a in self.agents if a not in env.agent_ids]
            stray_note = f"; agents given for {strays}, which are not seats" if strays else ""
            raise ValueError(
                f"no agent for env seat(s) {missing} (the env's seats: {list(env.agent_ids)}"
                f"{stray_note}); pass agents for every seat, keyed by env.agent_ids"
            )
        collector = TraceCollector(self.agents)
        async with closing_env(env):
            await self._run_episode(env, collector, sampling, env_seed)
        return _seats_that_took_part(collector.rollouts(env_seed=env_seed), env)

    async def _run_episode(
        self,
        env: LudicEnv,
        collector: TraceCollector,
        sampling: SamplingConfig | None,
        env_seed: int | None,
    ) -> None:
        returns = EnvReturns(env)
        resets = returns.resets(await call_env(env, env.reset, seed=env_seed))
        obs: dict[str, str] = {}
        for aid, agent in self.agents.items():
            agent.reset(env.system_prompt)
            if aid in resets:
                obs[aid], reset_info = returns.reset_of(resets, aid)
                agent.on_env_reset(obs[aid], reset_info)
        pending: dict[str, AgentAct] = {}
        finished: set[str] = set()
        seat_sampling = {aid: _seat_sampling(sampling, i) for i, aid in enumerate(self.agents)}
        for _ in range(self.max_steps):
            active = [a for a in returns.active(env.active_agents) if a not in finished]
            if not active:
                return
            stop = await self._collect_actions(env, active, pending, obs, collector, seat_sampling)
            if stop is not None:
                self._end(stop, pending, finished, obs, collector)
                return
            if any(a not in pending for a in active):
                continue  # valid actions wait while the others retry
            actions = {a: pending[a].action or "" for a in active}
            outcomes = returns.outcomes(await call_env(env, env.step, actions))
            unanswered = [a for a in active if a not in outcomes]
            if unanswered:
                raise ValueError(
                    f"{type(env).__name__}.step returned no outcome for acting agent(s) "
                    f"{unanswered}; an env must return an outcome for every agent that acted"
                )
            for aid in outcomes:
                if aid not in self.agents:
                    continue
                outcome = returns.outcome_of(outcomes, aid)
                step = self._record_outcome(env, aid, outcome, pending.get(aid), obs, collector)
                ended = env_ended(step)
                if ended is not None and aid not in finished:
                    finished.add(aid)
                    record_termination(collector, aid, ended)
            acted, pending = pending, {}
            stop = self._check_env_phase(acted, finished, collector)
            if stop is not None:
                self._end(stop, pending, finished, obs, collector)
                return
            if finished >= set(self.agents):
                return
        self._end(self.termination.out_of_steps(), pending, finished, obs, collector)

    def _end(
        self,
        stop: Termination,
        pending: Mapping[str, AgentAct],
        finished: set[str],
        obs: Mapping[str, str],
        collector: TraceCollector,
    ) -> None:
        """End the episode for every agent the env has not finished, with the same reason."""
        for aid in self.agents:
            if aid in finished:
                continue
            if aid in pending:  # a valid action still waiting: close its turn unexecuted
                step = unexecuted_step(
                    pending[aid],
                    obs.get(aid, ""),
                    index=collector.num_env_steps(aid),
                    agent_id=aid,
                    info={"action_not_executed": True},
                )
                collector.add_env_step(aid, step)
            record_termination(collector, aid, stop)

    def _check_env_phase(
        self, acted: Mapping[str, AgentAct], finished: set[str], collector: TraceCollector
    ) -> Termination | None:
        """Env-phase rules for each agent that acted in this env step and is still playing."""
        for aid, act in acted.items():
            if aid in finished:
                continue
            history = collector.env_steps(aid)
            view = TurnView(phase="env", act=act, env_step=history[-1], env_steps=history)
            stop = self.termination.check(view)
            if stop is not None:
                return stop
        return None

    async def _collect_actions(
        self,
        env: LudicEnv,
        active: Sequence[str],
        pending: dict[str, AgentAct],
        obs: Mapping[str, str],
        collector: TraceCollector,
        sampling: Mapping[str, SamplingConfig | None],
    ) -> Termination | None:
        """Ask every active agent without a valid action; record parse failures. Returns the
        first termination a rule gives for these replies (the rest are still recorded)."""
        waiting = [a for a in active if a not in pending]
        acts = await asyncio.gather(
            *(
                act_with_tools(
                    self.agents[aid],
                    turn_id=new_id(),
                    sampling=sampling[aid],
                    step_info={
                        "observation": obs.get(aid, ""),
                        "state_key": read_state_key(env, aid),
                    },
                    rollout_id=collector.rollout_ids[aid],
                    handler=self.external_tool_handler,
                    max_external_calls=self.max_external_calls,
                )
                for aid in waiting
            )
        )
        stop: Termination | None = None
        for aid, act in zip(waiting, acts, strict=True):
            collector.add_agent_steps(aid, act.steps)
            index = collector.num_env_steps(aid)
            if stop is None:
                history = collector.env_steps(aid)
                stop = self.termination.check(
                    TurnView(phase="act", act=act, env_step=None, env_steps=history)
                )
                if stop is not None:
                    step = unexecuted_step(
                        act, obs.get(aid, ""), index=index, agent_id=aid, info={"synthetic": True}
                    )
                    collector.add_env_step(aid, step)
                    continue
            if act.action is not None:
                pending[aid] = act
                continue
            step = synthetic_failure_step(
                act,
                obs.get(aid, ""),
                index=index,
                agent_id=aid,
                agent_step_ids=tuple(s.id for s in act.steps),
                current_obs=read_current_observation(env, aid),
            )
            collector.add_env_step(aid, step)
            self.agents[aid].on_after_step(step.next_obs, step.info)
            if stop is None:
                history = collector.env_steps(aid)
                stop = parse_failure_end(env, step) or self.termination.check(
                    TurnView(phase="env", act=act, env_step=step, env_steps=history)
                )
        return stop

    def _record_outcome(
        self,
        env: LudicEnv,
        aid: str,
        outcome: StepOutcome,
        act: AgentAct | None,
        obs: dict[str, str],
        collector: TraceCollector,
    ) -> EnvironmentStep:
        """One EnvironmentStep in `aid`'s timeline; `act` is None if it only observed."""
        step = EnvironmentStep(
            index=collector.num_env_steps(aid),
            turn_id=act.final_step.turn_id if act is not None else new_id(),
            agent_id=aid,
            prev_obs=obs.get(aid, ""),
            action=act.action if act is not None else None,
            next_obs=outcome.obs,
            reward=outcome.reward,
            **env_end_fields(outcome),
            state_key=read_state_key(env, aid),
            agent_step_ids=tuple(s.id for s in act.steps) if act is not None else (),
            info=merge_step_info(outcome.info, {} if act is not None else {"observed": True}),
        )
        collector.add_env_step(aid, step)
        obs[aid] = outcome.obs
        self.agents[aid].on_after_step(outcome.obs, outcome.info)
        return step


def _seats_that_took_part(rollouts: list[Rollout], env: LudicEnv) -> list[Rollout]:
    """The rollouts with at least one step; the others' seats are named in the kept ones'
    `meta["seats_without_steps"]`. ValueError when no seat has a step."""
    kept = [r for r in rollouts if r.steps]
    if not kept:
        raise ValueError(
            f"{type(env).__name__}: no seat acted or observed anything in this episode "
            f"(env.active_agents named none of {[r.agent_id for r in rollouts]} after reset); "
            "an env must make at least one seat active after reset"
        )
    absent = [r.agent_id for r in rollouts if not r.steps]
    if absent:
        for rollout in kept:
            rollout.meta["seats_without_steps"] = absent
    return kept


def _seat_sampling(sampling: SamplingConfig | None, seat: int) -> SamplingConfig | None:
    """Each seat gets its own episode seed, so two agents never share a call's seed."""
    if sampling is None or sampling.seed is None:
        return sampling
    return sampling.with_seed(derive_call_seed(sampling.seed, -(seat + 1)))
