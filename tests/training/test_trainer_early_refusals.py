"""The Trainer refuses what cannot train when it is built or run, not after a batch was
generated (fails if a KL preset without `ref_model` is accepted, or `run(-3)` does nothing)."""

from __future__ import annotations

import pytest
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import Trainer, TrainerConfig, make_grpo


class CountingSource(ListSource):
    """Counts `next_batch` calls: a refusal must come before the first."""

    def __init__(self) -> None:
        super().__init__([mixed_items(2)])
        self.calls = 0

    async def next_batch(self):  # type: ignore[no-untyped-def]
        self.calls += 1
        return await super().next_batch()


def test_kl_preset_without_ref_model_is_refused_by_the_constructor() -> None:
    source = CountingSource()
    with pytest.raises(ValueError, match=r"needs reference-model logprobs.*ref_model=.*kl_beta=0"):
        Trainer(tiny_llama(), make_grpo(kl_beta=0.04), source, TrainerConfig())
    assert source.calls == 0
    Trainer(tiny_llama(), make_grpo(kl_beta=0.04), source, TrainerConfig(), ref_model=tiny_llama())


@pytest.mark.parametrize("steps", [-3, 1.5, True])
def test_run_refuses_a_negative_or_non_int_step_count(steps: object) -> None:
    source = CountingSource()
    trainer = Trainer(tiny_llama(), make_grpo(), source, TrainerConfig())
    with pytest.raises(ValueError, match=r"num_steps must be an int >= 0, got"):
        trainer.run(steps, progress=False)  # type: ignore[arg-type]
    assert source.calls == 0 and trainer.step == 0
    assert trainer.run(0, progress=False) == []
