"""Tiny fakes for rollout tests: a counting env, a minimal protocol over a ChatClient, and
builders for hand-made steps with exact token traces."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ludic._aio import maybe_await
from ludic.envs.base import LudicEnv
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.client import ChatClient, ChatRequest
from ludic.inference.sampling import SamplingConfig
from ludic.types import (
    AgentStep,
    EnvironmentStep,
    Info,
    ParseResult,
    Rollout,
    Step,
    StepOutcome,
    TokenTrace,
)


class CountEnv(SingleAgentEnv):
    """Reward 1 when the action is "ok". Terminates after `length` steps (or truncates, with
    `truncate=True`). `fail_at` raises on that step; `hang_at` sleeps forever on that step."""

    def __init__(
        self,
        *,
        length: int = 3,
        truncate: bool = False,
        fail_at: int | None = None,
        fail_with: type[Exception] = RuntimeError,
        hang_at: int | None = None,
        closed: list[str] | None = None,
        live: list[int] | None = None,
    ) -> None:
        self.length = length
        self.truncate = truncate
        self.fail_at = fail_at
        self.fail_with = fail_with
        self.hang_at = hang_at
        self.closed = closed
        self.live = live
        self.t = 0
        self.seed: int | None = None

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.seed = seed
        self.t = 0
        return f"start seed={seed}", {}

    async def env_step(self, action: str) -> StepOutcome:
        if self.live is not None:
            self.live[0] += 1
            self.live[1] = max(self.live[1], self.live[0])
        try:
            await asyncio.sleep(0)
            if self.fail_at == self.t:
                raise self.fail_with(f"env exploded at step {self.t}")
            if self.hang_at == self.t:
                await asyncio.sleep(3600)
        finally:
            if self.live is not None:
                self.live[0] -= 1
        self.t += 1
        done = self.t >= self.length
        return StepOutcome(
            obs=f"obs {self.t}",
            reward=1.0 if action == "ok" else 0.0,
            terminated=done and not self.truncate,
            truncated=done and self.truncate,
        )

    def close(self) -> None:
        if self.closed is not None:
            self.closed.append(str(self.seed))


class LoopProtocol:
    """A minimal single-agent protocol: one model call per turn, full dialog, max_steps cut.
    Before each turn in `forget_at` the dialog is cut to the latest observation (a context
    deletion, so the next prompt no longer extends the previous one)."""

    def __init__(
        self, client: ChatClient, *, max_steps: int = 10, forget_at: Sequence[int] = ()
    ) -> None:
        self.client = client
        self.max_steps = max_steps
        self.forget_at = set(forget_at)

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]:
        aid = env.agent_ids[0]
        obs, _ = (await maybe_await(env.reset(seed=env_seed)))[aid]
        messages: list[dict[str, Any]] = [{"role": "user", "content": obs}]
        steps: list[Step] = []
        meta: Info = {"sampling_seed_seen": None if sampling is None else sampling.seed}
        for i in range(self.max_steps):
            turn_id = f"t{i}"
            if i in self.forget_at:
                messages = [{"role": "user", "content": obs}]
            request = ChatRequest(messages=list(messages), sampling=sampling or SamplingConfig())
            resp = await self.client.complete(request)
            agent_step = AgentStep(
                index=i,
                turn_id=turn_id,
                agent_id=aid,
                prompt_messages=tuple(messages),
                completion=resp.text,
                trace=resp.trace(),
                finish_reason=resp.finish_reason,
                policy_version=resp.policy_version,
                parse_result=ParseResult(action=resp.text),
            )
            out = (await maybe_await(env.step({aid: resp.text})))[aid]
            env_step = EnvironmentStep(
                index=i,
                turn_id=turn_id,
                agent_id=aid,
                prev_obs=obs,
                action=resp.text,
                next_obs=out.obs,
                reward=out.reward,
                terminated=out.terminated,
                truncated=out.truncated,
                truncation_reason="env" if out.truncated else None,
                agent_step_ids=(agent_step.id,),
            )
            steps += [agent_step, env_step]
            messages += [
                {"role": "assistant", "content": resp.text},
                {"role": "user", "content": out.obs},
            ]
            obs = out.obs
            if out.terminated or out.truncated:
                if out.truncated:
                    meta.update(episode_truncated=True, truncation_reason="env")
                break
        else:
            meta.update(episode_truncated=True, truncation_reason="max_steps")
        return [Rollout(agent_id=aid, steps=steps, meta=meta)]


def trace(prompt: Sequence[int], completion: Sequence[int], *, logprobs: bool = True) -> TokenTrace:
    """A trace whose logprob for completion token t at position j is -(t + j / 100)."""
    lp = tuple(-(t + j / 100) for j, t in enumerate(completion)) if logprobs else None
    return TokenTrace(
        prompt_token_ids=tuple(prompt),
        completion_token_ids=tuple(completion),
        completion_logprobs=lp,
    )


def call(
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    turn_id: str = "t0",
    target: str = "env",
    logprobs: bool = True,
    **kwargs: Any,
) -> AgentStep:
    """An agent step with an exact trace."""
    return AgentStep(
        turn_id=turn_id,
        trace=trace(prompt, completion, logprobs=logprobs),
        action_target=target,  # type: ignore[arg-type]
        **kwargs,
    )


def env_step(turn_id: str = "t0", reward: float = 0.0, **kwargs: Any) -> EnvironmentStep:
    return EnvironmentStep(turn_id=turn_id, reward=reward, **kwargs)


def uniform_weights(
    rollouts: Sequence[Rollout], value: float = 1.0
) -> dict[tuple[str, str], float]:
    return {(r.id, t.turn_id): value for r in rollouts for t in r.turns()}
