"""Resuming an online run against a fresh inference engine (the bug of issue 19): the engine
starts at policy version 0 while the checkpoint is at version 2, and with `max_lag=1` every
sample would be stale. `Trainer.resume` publishes the restored weights, so the run trains; a
trainer that cannot reach the engine stops with the cause instead of looping on no-op steps."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ludic.agents import Agent
from ludic.distributed import InProcessPublisher
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.models import TinyModelSpec, load_tiny_model
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import (
    CheckpointConfig,
    RolloutBatchSource,
    Trainer,
    TrainerConfig,
    TrainingStalledError,
    make_grpo,
)
from ludic.types import Info, StepOutcome

SPEC = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tokenizer_vocab_size=300,
)


class SayOEnv(SingleAgentEnv):
    """One turn; reward = fraction of the reply's characters that are "o"."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=action.count("o") / max(1, len(action)), terminated=True)


def online_trainer(engine: EmbeddedEngine, checkpoints: Path, *, publish: bool = True) -> Trainer:
    """GRPO on the embedded engine with `max_lag=1`, checkpoints every 2 steps."""
    model, tokenizer = load_tiny_model(seed=0, spec=SPEC)
    sampling = SamplingConfig(max_tokens=8)
    rollouts = RolloutEngine(
        env_registry={"say_o": SayOEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(
                Agent(engine, reject_incomplete_completions=False), max_steps=1
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
        strategy=GRPORequestStrategy(group_size=4),
        seed_sequencer=SeedSequencer(run_seed=0),
    )
    config = TrainerConfig(
        lr=1e-2,
        max_lag=1,
        max_skipped_steps=2,
        pad_token_id=tokenizer.pad_token_id,
        checkpoint=CheckpointConfig(dir=str(checkpoints), every_n_steps=2),
    )
    publisher = InProcessPublisher(engine) if publish else None
    return Trainer(model, algorithm, source, config, publisher=publisher)


def fresh_engine() -> EmbeddedEngine:
    model, tokenizer = load_tiny_model(seed=0, spec=SPEC)
    return EmbeddedEngine(copy.deepcopy(model), tokenizer)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after 2 steps (policy version 2)."""
    root = tmp_path_factory.mktemp("online") / "ckpt"
    with fresh_engine() as engine:
        history = online_trainer(engine, root).run(2, progress=False)
        assert engine.policy_version == 2
    assert all(h.get("skipped_empty", 0.0) == 0.0 for h in history)
    return root


def test_resume_against_a_fresh_engine_trains(checkpoints: Path, tmp_path: Path) -> None:
    with fresh_engine() as engine:
        assert engine.policy_version == 0
        trainer = online_trainer(engine, tmp_path / "ckpt")
        assert trainer.resume(checkpoints) == 2
        assert engine.policy_version == 2  # published before the first rollout
        history: list[dict[str, Any]] = trainer.run(2, progress=False)
        assert engine.policy_version == trainer.policy_version == 4
    assert [h["dropped_stale"] for h in history] == [0.0, 0.0]
    assert all(h["num_samples"] > 0 and "skipped_empty" not in h for h in history)


def test_a_resumed_run_that_cannot_reach_the_engine_stops_with_the_cause(
    checkpoints: Path, tmp_path: Path
) -> None:
    with fresh_engine() as engine:  # serves version 0; nothing ever publishes to it
        trainer = online_trainer(engine, tmp_path / "ckpt", publish=False)
        trainer.resume(checkpoints)
        with pytest.raises(TrainingStalledError) as caught:
            trainer.run(10, progress=False)
    message = str(caught.value)
    assert "policy_version 2, sample versions 0..0, max_lag 1" in message
    assert "is the inference server serving the trainer's weights?" in message
    assert trainer.step == 4  # two skipped steps, then the error
