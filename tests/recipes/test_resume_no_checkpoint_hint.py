"""`ludic train --resume` that finds no usable checkpoint says how to start a new run: "run
without --resume" only when OUT_DIR holds no checkpoint. With damaged ones there, a run without
--resume is refused as an earlier run's directory, so the refusal names another --out-dir (it
sent the user from one refusal to the other)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ludic.models import load_model, tiny_model_dir
from ludic.recipes.configs import RESUME_LATEST, TrainConfig
from ludic.recipes.resume_refusal import no_checkpoint_message
from ludic.recipes.train_start import _resume
from ludic.recipes.training import check_run_dir, make_trainer
from ludic.training import make_grpo


class NoBatches:
    async def next_batch(self) -> Any:
        raise AssertionError("the test never trains")


def _trainer(out: Path) -> Any:
    model, tokenizer = load_model(tiny_model_dir(), dtype="float32")
    return make_trainer(model, tokenizer, make_grpo(), NoBatches(), out=out, lr=1e-3)


def test_every_checkpoint_damaged_names_another_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "run"
    saved = _trainer(out).save_checkpoint()
    weights = saved / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 4  # a flipped bit: the manifest's sha256 no longer matches
    weights.write_bytes(bytes(data))
    with pytest.raises(FileNotFoundError) as raised:
        _resume(_trainer(out), TrainConfig(out_dir=out, resume=RESUME_LATEST), Console(quiet=True))
    message = str(raised.value)
    assert "is damaged" in message and "another --out-dir" in message
    assert "run without --resume" not in message
    with pytest.raises(FileExistsError):  # what running without --resume would meet
        check_run_dir(out, None)


def test_an_out_dir_without_checkpoints_is_told_to_run_without_resume(tmp_path: Path) -> None:
    message = no_checkpoint_message("no complete checkpoint under x", tmp_path / "fresh")
    assert message.endswith("run without --resume to start a new run")
    check_run_dir(tmp_path / "fresh", None)  # and that run is accepted


def test_a_mistyped_resume_path_names_the_out_dirs_checkpoints_not_deleting_them(
    tmp_path: Path,
) -> None:
    """`--resume OUT/checkpoints/step_2` where only step_1 exists (a typo) was told to delete
    OUT, which holds that good checkpoint; it now names it and `--resume latest`."""
    out = tmp_path / "run"
    saved = _trainer(out).save_checkpoint()
    typo = str(saved.parent / "step_00000009")
    with pytest.raises(FileNotFoundError) as raised:
        _resume(_trainer(out), TrainConfig(out_dir=out, resume=typo), Console(quiet=True))
    message = str(raised.value)
    assert f"holds {saved.name} (the newest): pass --resume latest" in message, message
    assert "delete" not in message, message
