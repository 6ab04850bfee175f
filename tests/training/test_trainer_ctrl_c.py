"""Ctrl-C stops `Trainer.run` at the next step, also when no step ever waits on anything (a
batch source that is pure computation, such as an offline JSONL source): `asyncio.run` turns
the first SIGINT into a cancellation of its task, which lands only where the task suspends."""

from __future__ import annotations

import signal

import pytest
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import SAWBatch, Trainer, TrainerConfig, make_grpo


class CtrlCAtSecondBatch(ListSource):
    """Sends this process a SIGINT (a terminal's Ctrl-C) as it serves its second batch."""

    async def next_batch(self) -> SAWBatch:
        if self.position == 1:
            signal.raise_signal(signal.SIGINT)
        return await super().next_batch()


def test_a_first_ctrl_c_stops_the_run_at_the_next_step() -> None:
    source = CtrlCAtSecondBatch([mixed_items(2, seed=1)])
    trainer = Trainer(tiny_llama(seed=0), make_grpo(), source, TrainerConfig(lr=1e-3))
    with pytest.raises(KeyboardInterrupt):
        trainer.run(8, progress=False)
    assert source.position <= 3, f"the run went on for {source.position} batches after Ctrl-C"
