"""`make_trainer(out="runs/x")` takes a str path as it takes a Path (fails with
"'str' object has no attribute 'mkdir'" if it does not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.models import load_model, tiny_model_dir
from ludic.recipes.training import make_trainer
from ludic.rollouts.samples import SAWItem
from ludic.training import make_grpo


class OneBatch:
    async def next_batch(self):  # type: ignore[no-untyped-def]
        from ludic.training import SAWBatch

        item = SAWItem(
            input_ids=(5, 6, 7, 8), action_mask=(0, 0, 1, 1), weight=1.0, meta={"reward": 1.0}
        )
        return SAWBatch(items=[item, item])


def test_make_trainer_accepts_a_str_out_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model, tokenizer = load_model(tiny_model_dir(), dtype="float32")
    trainer = make_trainer(model, tokenizer, make_grpo(), OneBatch(), out="runs/x", lr=1e-3)
    trainer.run(1, progress=False)
    trainer.save_checkpoint()
    trainer.close()
    (line,) = (tmp_path / "runs" / "x" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["step"] == 1
    assert (tmp_path / "runs" / "x" / "checkpoints" / "step_00000001").is_dir()
