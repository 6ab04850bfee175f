"""A learner that stopped before its first step (`--max-wait-s` with no actor) closed with
"no checkpoint kept (--checkpoint-every None), so the trained weights are gone" although it
ran with checkpoints (the default --checkpoint-every 50) and trained nothing. The closing line
now says that no step trained; without checkpoints it still says they are off."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ludic.pipeline.learner_report import done_line


def _trainer(step: int, checkpoints_dir: Path | None) -> SimpleNamespace:
    checkpoints = None
    if checkpoints_dir is not None:
        checkpoints = SimpleNamespace(path_for=lambda s: checkpoints_dir / f"step_{s:08d}")
    return SimpleNamespace(step=step, checkpoints=checkpoints)


def test_a_learner_that_trained_no_step_says_so(tmp_path: Path) -> None:
    line = done_line(_trainer(0, tmp_path), {})
    assert (
        line
        == "learner done at step 0: no sample read; no step trained, so no checkpoint was written"
    )
    assert "--checkpoint-every None" not in line


def test_without_checkpoints_the_line_names_the_flag(tmp_path: Path) -> None:
    line = done_line(_trainer(3, None), {"samples": 96})
    assert line.endswith(
        "no checkpoint kept (--checkpoint-every None), so the trained weights are gone"
    )


def test_a_saved_checkpoint_is_named(tmp_path: Path) -> None:
    (tmp_path / "step_00000004").mkdir()
    line = done_line(_trainer(4, tmp_path), {"samples": 128})
    assert line.endswith(f"model: {tmp_path / 'step_00000004' / 'model'}")
