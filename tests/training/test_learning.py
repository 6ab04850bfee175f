"""End to end on one CPU: GRPO on the tiny local model, served by the embedded engine and synced
in process, raises a simple reward (the share of "o" characters in a 16-token reply)."""

from __future__ import annotations

import copy
import statistics

import pytest

from ludic.agents import Agent
from ludic.distributed import InProcessPublisher
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.models import TinyModelSpec, build_tiny_model
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RolloutBatchSource, Trainer, TrainerConfig, make_grpo
from ludic.types import Info, StepOutcome

SPEC = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tokenizer_vocab_size=300,
)
STEPS = 30


class SayOEnv(SingleAgentEnv):
    """One turn; reward = fraction of the reply's characters that are "o"."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=action.count("o") / max(1, len(action)), terminated=True)


@pytest.mark.slow
def test_grpo_raises_reward_on_tiny_model() -> None:
    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer) as engine:
        sampling = SamplingConfig(max_tokens=16)
        rollouts = RolloutEngine(
            env_registry={"say_o": SayOEnv},
            protocol_registry={
                "single": lambda: SingleAgentProtocol(
                    Agent(engine, reject_incomplete_completions=False),
                    max_steps=1,
                )
            },
        )
        algorithm = make_grpo()
        source = RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: [
                RolloutRequest(
                    env=ComponentSpec(name="say_o"),
                    protocol=ComponentSpec(name="single"),
                    sampling=sampling,
                )
                for _ in range(2)
            ],
            credit_assigner=algorithm.credit_assigner,
            strategy=GRPORequestStrategy(group_size=8),
            seed_sequencer=SeedSequencer(run_seed=0),
        )
        config = TrainerConfig(lr=1e-2, max_lag=0, pad_token_id=tokenizer.pad_token_id, seed=0)
        trainer = Trainer(model, algorithm, source, config, publisher=InProcessPublisher(engine))
        history = trainer.run(STEPS, progress=False)
        assert engine.policy_version == trainer.policy_version == STEPS

    rewards = [h["reward_mean"] for h in history]
    # The engine serves every update before the next batch: nothing is ever stale.
    assert all(h["dropped_stale"] == 0 for h in history)
    early, late = statistics.mean(rewards[:5]), statistics.mean(rewards[-5:])
    assert late > early + 0.25, rewards
