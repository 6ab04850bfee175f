"""`publish_every` counts updates along a renumbered learner's branch: a learner forked past a
killed one's versions (numbered 5 on from 0, or 6 on from its checkpoint's 3) publishes every
2nd update as an unforked one does, not at the first even version number (after 1 update, then
every 2), nor an odd interval after its resume."""

from __future__ import annotations

import pytest
from pipeline_fakes import SMALL_SPEC, sample

from ludic.models import load_model, tiny_model_dir
from ludic.pipeline.versions import Forks
from ludic.training import SAWBatch, Trainer, TrainerConfig
from ludic.training.algorithm import make_grpo

pytestmark = pytest.mark.timeout(120)


class _Batches:
    """The same two samples each step: advantages of both signs, so every step changes weights."""

    async def next_batch(self) -> SAWBatch:
        return SAWBatch(items=[sample(weight=1.0), sample(weight=-0.5)], stats={})


class _Versions:
    def __init__(self) -> None:
        self.versions: list[int] = []

    def publish(self, weights: object, *, version: int) -> None:
        self.versions.append(version)


@pytest.mark.parametrize(
    ("resumed", "new", "published"),
    [(0, 5, [7, 9]), (3, 6, [7, 9])],  # branch positions 2, 4 (fresh) and 4, 6 (resumed at 3)
)
async def test_publish_every_counts_updates_along_the_forked_branch(
    resumed: int, new: int, published: list[int]
) -> None:
    model, _ = load_model(tiny_model_dir(spec=SMALL_SPEC), dtype="float32")
    publisher = _Versions()
    config = TrainerConfig(lr=1e-3, publish_every=2)
    trainer = Trainer(model, make_grpo(), _Batches(), config, publisher=publisher)
    forks = Forks()
    forks.add(resumed, new)
    trainer.policy_version = new  # as `fork_versions` leaves it
    trainer.version_position = forks.position
    await trainer.train(4, progress=False)
    assert trainer.policy_version == new + 4
    assert publisher.versions == published
