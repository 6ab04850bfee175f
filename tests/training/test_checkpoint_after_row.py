"""A checkpoint of step N is written after step N's metrics row: a run killed between the two
resumed at N + 1 with row N missing for good (found in review)."""

from __future__ import annotations

import json
from pathlib import Path

from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, JsonlLogger, Trainer, TrainerConfig, make_grpo


def test_each_checkpoint_finds_its_steps_row_already_written(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    config = TrainerConfig(
        lr=1e-3, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=1)
    )
    trainer = Trainer(
        tiny_llama(seed=0),
        make_grpo(),
        ListSource([mixed_items(3, seed=1)]),
        config,
        logger=JsonlLogger(metrics),
    )
    rows_at_save: list[list[int]] = []
    save = trainer.save_checkpoint

    def save_and_look() -> Path:
        rows_at_save.append([json.loads(line)["step"] for line in metrics.read_text().splitlines()])
        return save()

    trainer.save_checkpoint = save_and_look  # type: ignore[method-assign]
    trainer.run(2, progress=False)
    assert rows_at_save == [[1], [1, 2]]
