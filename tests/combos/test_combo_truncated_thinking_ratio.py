"""A context that rewrites earlier turns (TruncatedThinkingContext) in episode sample mode, with
a ratio loss sampled at temperature 0.7 / top-p 0.9: the history rewrite closes each sequence as
a snapshot, and on the first, on-policy step every action token's behaviour logprob lines up
with the trainer's recomputation, so the importance ratio is exactly 1 (float32, engine and
trainer batch-invariant). A behaviour logprob shifted by one token, or taken from the prompt
the model did not see, moves it by 1e-2 or more.

The tags are single letters the tiny model writes in most replies, so real sampled replies
hold "thinking" to hide and every episode rewrites its history (no scripted client)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from ludic.agents import Agent
from ludic.context import TruncatedThinkingContext
from ludic.distributed import InProcessPublisher
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.models import build_tiny_model
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SAWItem,
    SeedSequencer,
)
from ludic.training import (
    RLAlgorithm,
    RolloutBatchSource,
    SAWBatch,
    Trainer,
    TrainerConfig,
    make_cispo,
    make_grpo,
    make_gspo,
)
from ludic.types import Info, StepOutcome

PLACEHOLDER = "[cut]"
SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=12)
PRESETS: dict[str, Callable[[], RLAlgorithm]] = {
    "grpo": make_grpo,
    "cispo": make_cispo,
    "gspo": make_gspo,
}


class ThreeTurnEnv(SingleAgentEnv):
    """Three turns; reward = share of "o" in the reply (any graded value will do)."""

    def __init__(self) -> None:
        super().__init__()
        self._turn = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self._turn = 0
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        self._turn += 1
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs="Again.", reward=reward, terminated=self._turn == 3)


class Recording:
    """A batch source that keeps the samples it served."""

    def __init__(self, inner: RolloutBatchSource) -> None:
        self.inner = inner
        self.items: list[SAWItem] = []

    async def next_batch(self) -> SAWBatch:
        batch = await self.inner.next_batch()
        self.items.extend(batch.items)
        return batch


def _first_step(algorithm: RLAlgorithm) -> tuple[dict[str, float], list[SAWItem], object]:
    model, tokenizer = build_tiny_model(seed=0)

    def protocol() -> SingleAgentProtocol:
        context = TruncatedThinkingContext(open_tag="e", close_tag="a", placeholder=PLACEHOLDER)
        agent = Agent(engine, context=context, reject_incomplete_completions=False)
        return SingleAgentProtocol(agent, max_steps=3)

    config = EngineConfig(batch_invariant=True)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=config) as engine:
        rollouts = RolloutEngine(
            env_registry={"three_turns": ThreeTurnEnv}, protocol_registry={"agent": protocol}
        )
        request = RolloutRequest(
            env=ComponentSpec(name="three_turns"),
            protocol=ComponentSpec(name="agent"),
            sampling=SAMPLING,
        )
        source = Recording(
            RolloutBatchSource(
                engine=rollouts,
                requests_fn=lambda: [request, request],
                credit_assigner=algorithm.credit_assigner,
                strategy=GRPORequestStrategy(group_size=2),
                seed_sequencer=SeedSequencer(run_seed=0),
                sample_mode="episode",
            )
        )
        trainer_config = TrainerConfig(
            lr=1e-3, pad_token_id=tokenizer.pad_token_id, seed=0, batch_invariant=True
        )
        trainer = Trainer(
            model, algorithm, source, trainer_config, publisher=InProcessPublisher(engine)
        )
        (metrics,) = trainer.run(1, progress=False)
    return metrics, source.items, tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PRESETS))
def test_rewritten_history_keeps_behaviour_logprobs_on_their_tokens(name: str) -> None:
    metrics, items, tokenizer = _first_step(PRESETS[name]())
    # The rewrite really happened: episodes were split into segments, and a later segment's
    # prompt shows the placeholder where the earlier reply's "thinking" was.
    assert any(s.meta["is_snapshot"] for s in items), [s.meta for s in items]
    later = [s for s in items if s.meta["segment_index"] > 0]
    assert later
    assert any(PLACEHOLDER in tokenizer.decode(s.input_ids) for s in later)  # type: ignore[attr-defined]
    for sample in items:
        assert sample.meta["behavior_sampling"]["temperature"] == 0.7
        assert len(sample.behavior_logprobs) == len(sample.input_ids)
    assert metrics["num_samples"] == len(items)
    assert metrics["num_action_tokens"] == sum(s.num_action_tokens for s in items)
    # Every action token's behaviour logprob is the trainer's own, bit for bit.
    assert metrics["loss/mismatch/tokens"] == 1.0
    assert metrics["loss/mismatch/abs_log_ratio_max"] == 0.0
    ratios = {k: v for k, v in metrics.items() if k.endswith(("/ratio_min", "/ratio_max"))}
    assert ratios and all(v == 1.0 for v in ratios.values()), ratios
