"""Resuming on another number of ranks than the checkpoint was written by: every rank takes
rank 0's RNG and data position and rank 0 warns, a one-process checkpoint included (it holds no
per-rank states). The 2-rank runs of a resume are in test_fsdp.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo, read_checkpoint
from ludic.training.checkpoint import rank_state_for


def _one_process_checkpoint(root: Path) -> Path:
    config = TrainerConfig(lr=1e-3, checkpoint=CheckpointConfig(dir=str(root), every_n_steps=1))
    trainer = Trainer(tiny_llama(seed=0), make_grpo(), ListSource([mixed_items(2, seed=1)]), config)
    trainer.run(1, progress=False)
    return root / "step_00000001"


def test_a_one_process_checkpoint_resumed_on_two_ranks_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loaded = read_checkpoint(_one_process_checkpoint(tmp_path / "ckpt"))
    assert loaded.rank_states is None  # one process: no per-rank states
    caplog.clear()  # the Trainer's own warnings (this test's checkpoints hold no tokenizer)
    with caplog.at_level(logging.WARNING, logger="ludic.training.checkpoint"):
        assert rank_state_for(loaded, 0, 1).data_state == {"position": 1}
        assert caplog.messages == []  # the same world size: nothing to say
        assert rank_state_for(loaded, 0, 2).data_state == {"position": 1}
        assert rank_state_for(loaded, 1, 2).data_state == {"position": 1}
    assert caplog.messages == [
        "step_00000001 was written by 1 rank, resuming on 2: every rank takes rank 0's RNG and "
        "data position"
    ]  # rank 0 alone says it
