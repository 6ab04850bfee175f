"""A batch source giving the same hand-made samples every step, for tests that train a few
steps only to have weights to publish (token ids within the tiny test model's vocabulary)."""

from __future__ import annotations

from ludic.rollouts.samples import SAWItem
from ludic.training import SAWBatch


class Samples:
    """The same batch of hand-made samples every step (token ids within SPEC's vocabulary)."""

    def __init__(self) -> None:
        self.items = [
            SAWItem(
                input_ids=tuple(3 + (7 * i + 11 * j) % 250 for j in range(12)),
                action_mask=(0,) * 4 + (1,) * 8,
                weight=1.0 if i % 2 else -1.0,
            )
            for i in range(4)
        ]

    async def next_batch(self) -> SAWBatch:
        return SAWBatch(items=self.items, stats={})
