"""A learner launch whose last step was skipped (every sample stale) on a checkpoint-due step
still saves its final checkpoint before acknowledging the samples: the Trainer writes no
checkpoint on a skipped step (a launch that trained nothing wrote step 1 with unchanged
weights), so the learner's `not due(step)` test skipped the final save and the launch's trained
step was lost while its samples were acked. A real Trainer; the source is a stand-in."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from training_fakes import item, tiny_llama

from ludic.pipeline.learner_report import TOTAL_KEYS
from ludic.pipeline.learner_run import _train
from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo
from ludic.training.batching.types import SAWBatch


class _Source:
    """Step 1's samples are fresh (version 0), step 2's stale at policy 1 (max_lag 0); what
    the checkpoints dir holds when the samples are acknowledged is kept."""

    rank, world_size, on_first_sample = 0, 1, None
    timed_out, timed_out_dropped = False, 0

    def __init__(self, ckpt: Path) -> None:
        self.ckpt, self.position, self.acked_with = ckpt, 0, None
        self.totals = dict.fromkeys(TOTAL_KEYS, 0)

    async def next_batch(self) -> SAWBatch:
        self.position += 1
        return SAWBatch(items=[item(8 + i, versions=[0], seed=i) for i in range(3)], stats={})

    async def ack_checkpointed(self) -> None:
        self.acked_with = sorted(p.name for p in self.ckpt.glob("step_*"))


def test_the_final_checkpoint_holds_the_trained_step_before_the_ack(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    source = _Source(ckpt)
    config = TrainerConfig(
        lr=1e-3, max_lag=0, checkpoint=CheckpointConfig(dir=str(ckpt), every_n_steps=2)
    )
    trainer = Trainer(tiny_llama(seed=0), make_grpo(), source, config)
    history = asyncio.run(_train(SimpleNamespace(steps=2), source, trainer))
    assert "skipped_empty" not in history[0] and history[1].get("skipped_empty") == 1.0
    assert source.acked_with == ["step_00000002"]  # policy version 1: step 1's update
    assert trainer.checkpointed_step == 2
