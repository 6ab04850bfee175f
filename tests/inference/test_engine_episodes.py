"""The embedded engine driving real episodes through Agent + SingleAgentProtocol."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch

from ludic.agents.base import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference import SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.interaction.single_agent import SingleAgentProtocol
from ludic.models import load_tiny_model
from ludic.types import Info, StepOutcome


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread: OpenMP threads spin badly on a shared, oversubscribed CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class CountdownEnv(SingleAgentEnv):
    """Any reply is a move; the episode ends after three moves."""

    def __init__(self) -> None:
        self.moves = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.moves = 0
        return "Board: 1 2 3\nYour move as <move>N</move>.", {}

    def env_step(self, action: str) -> StepOutcome:
        self.moves += 1
        return StepOutcome(
            obs=f"Moves so far: {self.moves}. Your move.", reward=1.0, terminated=self.moves == 3
        )


async def test_concurrent_episodes_record_the_engines_exact_traces() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer, policy_version=7) as engine:

        async def episode(seed: int) -> list:  # type: ignore[type-arg]
            agent = Agent(
                engine,
                sampling=SamplingConfig(max_tokens=12, seed=seed),
                reject_incomplete_completions=False,
            )
            return await SingleAgentProtocol(agent, max_steps=5).run(CountdownEnv(), env_seed=seed)

        results = await asyncio.gather(*(episode(seed) for seed in range(4)))
    for rollouts in results:
        (rollout,) = rollouts
        steps = rollout.agent_steps
        assert len(steps) == 3 and rollout.total_reward > 0
        for step in steps:
            assert step.trace is not None and step.policy_version == 7
            rendered = tokenizer.apply_chat_template(
                list(step.prompt_messages), add_generation_prompt=True, tokenize=False
            )
            assert list(step.trace.prompt_token_ids) == tokenizer.encode(
                rendered, add_special_tokens=False
            )
            assert (
                len(step.trace.completion_logprobs or ())
                == len(step.trace.completion_token_ids)
                > 0
            )
        # Each later prompt holds the earlier completion text.
        assert steps[0].completion in tokenizer.decode(list(steps[1].trace.prompt_token_ids))
    first_moves = {r[0].agent_steps[0].completion for r in results}
    assert len(first_moves) > 1, "different seeds should sample different moves"
