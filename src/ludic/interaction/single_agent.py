"""SingleAgentProtocol: the agent <-> env loop for one agent.

Owns truncation semantics (seed 000): env `terminated` / `truncated` end the episode; running
out of `max_steps` marks the last step `truncated` with `truncation_reason="max_steps"`;
termination rules (`ludic.interaction.termination`) may end it earlier, and why it ended is
recorded by `record_termination`. Parse failures never reach the env: they become a synthetic
EnvironmentStep (state unchanged, feedback as next observation, followed by the env's
`current_observation` when it offers one), and the agent replies again; an env that takes one
reply per episode (`env.parse_failure_ends_episode`, e.g. `DatasetQAEnv`) ends the episode there
instead (`termination_reason` "parse_error"). External tool calls go to
`external_tool_handler`. It does not retry or time out episodes (the RolloutEngine does).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from ludic._aio import call_off_loop
from ludic.agents.base import Agent, AgentAct
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
from ludic.interaction.termination import (
    Termination,
    TerminationRule,
    TerminationRules,
    TurnView,
    env_end_fields,
    env_ended,
    parse_failure_info,
    record_termination,
    unexecuted_step,
)
from ludic.types import EnvironmentStep, Info, Rollout, new_id

ValueEstimator = Callable[[str, str | None], float | Awaitable[float]]


class SingleAgentProtocol:
    """Run one agent against a single-agent (or one-seat) env.

    `max_steps` (default 20, or the `MaxSteps` rule in `termination`) counts env steps,
    synthetic parse-failure steps included. `termination` rules are checked in order each
    turn: "act"-phase rules before the env sees the action (a synthetic last step records it),
    "env"-phase rules after the env step, once the env's own terminated/truncated did not end
    the episode. The reason goes to the last env step's `info["termination_reason"]` (+
    `termination_detail`) and rollout meta (plus `episode_truncated` / `truncation_reason` for
    a truncation). `max_external_calls` bounds external tool round trips inside one turn. On a
    one-seat env whose seat is not the agent's id, an agent with the default id "agent_0"
    takes the seat's name; an agent with its own id (a sub-agent, say) keeps it.

    Seed 003's per-step record (StepData) in Ludic terms: observation -> `EnvironmentStep.
    prev_obs`, `AgentStep.info["observation"]` and the exact prompt in `AgentStep.
    prompt_messages`; action -> `EnvironmentStep.action`, `AgentStep.parse_result` /
    `tool_calls`; raw output -> `AgentStep.completion`; logprobs -> `AgentStep.trace.
    completion_logprobs`; value estimate -> `AgentStep.info["value_estimate"]` when a
    `value_estimator(obs, state_key)` is given (a sync one runs on a worker thread, as a sync
    tool does, so a critic's forward pass stalls no other episode; concurrent episodes then
    call it at once, so it must be thread-safe: guard one that is not, e.g. one sharing a
    Hugging Face tokenizer, with a `threading.Lock`, or write it `async def`); done -> `EnvironmentStep.
    terminated` / `truncated` (+ `truncation_reason`); step info -> `EnvironmentStep.info` and
    `AgentStep.info`; step index -> `EnvironmentStep.index`.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        max_steps: int | None = None,
        termination: Sequence[TerminationRule] = (),
        external_tool_handler: ExternalToolHandler | None = None,
        max_external_calls: int = 8,
        value_estimator: ValueEstimator | None = None,
        rollout_id: str | None = None,
    ) -> None:
        self.termination = TerminationRules.build(
            termination, max_steps, default_max_steps=20, owner="SingleAgentProtocol"
        )
        self.agent = checked_agent(agent, "SingleAgentProtocol")
        self.max_steps = self.termination.max_steps
        self.external_tool_handler = external_tool_handler
        self.max_external_calls = max_external_calls
        self.value_estimator = value_estimator
        self.rollout_id = rollout_id

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]:
        env = checked_env(env, "SingleAgentProtocol")
        env_seed = checked_env_seed(env_seed)
        aid = seat = self.agent.agent_id
        if aid not in env.agent_ids:
            if len(env.agent_ids) != 1:
                raise ValueError(
                    f"agent_id {aid!r} is not a seat of {type(env).__name__} "
                    f"{list(env.agent_ids)}; use MultiAgentProtocol for multi-seat envs"
                )
            seat = env.agent_ids[0]
            # an unnamed agent takes the seat's name; a named one keeps its own
            if aid == "agent_0":
                aid = self.agent.agent_id = seat
        collector = TraceCollector([aid], rollout_ids={aid: self.rollout_id or new_id()})
        async with closing_env(env):
            stop = await self._run_episode(env, aid, collector, sampling, env_seed, seat=seat)
            record_termination(collector, aid, stop)
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
    ) -> Termination:
        returns = EnvReturns(env)
        resets = returns.resets(await call_env(env, env.reset, seed=env_seed))
        obs, reset_info = returns.reset_of(resets, seat)
        self.agent.reset(env.system_prompt)
        self.agent.on_env_reset(obs, reset_info)

        for _ in range(self.max_steps):
            act = await act_with_tools(
                self.agent,
                turn_id=new_id(),
                sampling=sampling,
                step_info=await self._step_info(obs, read_state_key(env, seat)),
                rollout_id=collector.rollout_ids[aid],
                handler=self.external_tool_handler,
                max_external_calls=self.max_external_calls,
            )
            collector.add_agent_steps(aid, act.steps)
            index = collector.num_env_steps(aid)
            history = collector.env_steps(aid)
            stop = self.termination.check(
                TurnView(phase="act", act=act, env_step=None, env_steps=history)
            )
            if stop is not None:
                info = {"synthetic": True}
                step = unexecuted_step(act, obs, index=index, agent_id=aid, info=info)
                collector.add_env_step(aid, step)
                return stop
            env_step = await self._env_step(env, returns, aid, act, obs, index, seat=seat)
            collector.add_env_step(aid, env_step)
            self.agent.on_after_step(env_step.next_obs, env_step.info)
            if act.action is not None:
                obs = env_step.next_obs or ""
            view = TurnView(phase="env", act=act, env_step=env_step, env_steps=(*history, env_step))
            stop = (
                env_ended(env_step)
                or parse_failure_end(env, env_step)
                or self.termination.check(view)
            )
            if stop is not None:
                return stop
        return self.termination.out_of_steps()

    async def _step_info(self, obs: str, state_key: str | None) -> Info:
        info: Info = {"observation": obs, "state_key": state_key}
        if self.value_estimator is not None:
            value = await call_off_loop(self.value_estimator, obs, state_key)
            info["value_estimate"] = _value_estimate(value, self.value_estimator)
        return info

    @staticmethod
    async def _env_step(
        env: LudicEnv,
        returns: EnvReturns,
        aid: str,
        act: AgentAct,
        obs: str,
        index: int,
        *,
        seat: str,
    ) -> EnvironmentStep:
        """Step the env with the turn's action, or record the parse failure without it."""
        agent_step_ids = tuple(s.id for s in act.steps)
        if act.action is None:
            return synthetic_failure_step(
                act,
                obs,
                index=index,
                agent_id=aid,
                agent_step_ids=agent_step_ids,
                current_obs=read_current_observation(env, seat),
            )
        outcomes = returns.outcomes(await call_env(env, env.step, {seat: act.action}))
        outcome = returns.outcome_of(outcomes, seat)
        return EnvironmentStep(
            index=index,
            turn_id=act.final_step.turn_id,
            agent_id=aid,
            prev_obs=obs,
            action=act.action,
            next_obs=outcome.obs,
            reward=outcome.reward,
            **env_end_fields(outcome),
            state_key=read_state_key(env, seat),
            agent_step_ids=agent_step_ids,
            info=dict(outcome.info),
        )


def parse_failure_end(env: LudicEnv, step: EnvironmentStep) -> Termination | None:
    """End the episode at `step`'s parse failure when the env takes one reply per episode
    (`env.parse_failure_ends_episode`, e.g. a one-question QA env): the failure stays
    recorded as such, with the parser's penalty, and no second reply is asked for. Every
    protocol ends episodes this way (in a multi-agent env, for every seat still playing)."""
    if step.info.get("parse_error") and getattr(env, "parse_failure_ends_episode", False):
        detail = f"{step.agent_id}'s reply did not parse; {type(env).__name__} takes one reply"
        return Termination(reason="parse_error", detail=detail)
    return None


def synthetic_failure_step(
    act: AgentAct,
    obs: str,
    *,
    index: int,
    agent_id: str,
    agent_step_ids: tuple[str, ...],
    current_obs: str | None = None,
) -> EnvironmentStep:
    """The step recorded for a parse failure: no env call, state unchanged, feedback shown,
    followed by `current_obs` (the env's `current_observation`) when the env offers one."""
    pr = act.parse_result
    feedback = pr.obs if pr is not None and pr.obs is not None else "Invalid reply."
    if current_obs is not None:
        feedback = f"{feedback}\n{current_obs}"
    info: Info = {**parse_failure_info(act), "synthetic": True}
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


def _value_estimate(value: object, estimator: object) -> float:
    """A value estimate as a float (a numpy scalar or a one-element tensor too), or a
    TypeError naming the estimator: `float()` alone took a str such as "0.5" and, for None or
    a many-element array, failed the episode without naming where the value came from."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a many-element tensor
        name = getattr(estimator, "__qualname__", type(estimator).__name__)
        raise TypeError(
            f"value_estimator {name} returned {type(value).__name__} {value!r:.60}; return "
            "the value of the observation as a number (a float, a numpy scalar or a "
            "one-element tensor)"
        ) from None
