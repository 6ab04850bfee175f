"""README walk (walkC), "Generation in another process, from the command line": its two
commands, the first stopped with Ctrl-C (as the paragraph before them describes) and the second
given `--resume`, ended in `--resume: no complete checkpoint under runs/overlap/checkpoints`,
but only after the model loaded and `--local-server` had started its server: the first run
saved no checkpoint (`--checkpoint-every` is None by default). A bare `--resume` on an out-dir
without any checkpoint is now refused before anything loads, saying why there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.recipes.configs import RESUME_LATEST
from ludic.recipes.training import check_run_dir


def test_a_bare_resume_without_checkpoints_is_refused_naming_why(tmp_path: Path) -> None:
    out = tmp_path / "overlap"
    (out / "rollouts.jsonl").parent.mkdir()
    (out / "rollouts.jsonl").write_text("")  # what a run stopped before its first save leaves
    with pytest.raises(FileNotFoundError) as refused:
        check_run_dir(out, RESUME_LATEST)
    text = str(refused.value)
    assert text.startswith(f"--resume: no complete checkpoint under {out / 'checkpoints'}"), text
    assert "only every --checkpoint-every steps, none by default" in text, text
    assert text.endswith("run without --resume to start a new run"), text
    (out / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="it is empty"):
        check_run_dir(out, RESUME_LATEST)


def test_a_checkpoint_folder_is_left_to_the_trainers_resume(tmp_path: Path) -> None:
    step = tmp_path / "run" / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)  # incomplete: the trainer's resume judges it, in its own words
    check_run_dir(tmp_path / "run", RESUME_LATEST)


def test_ludic_train_refuses_it_before_the_model_loads(tmp_path: Path) -> None:
    from ludic.cli import main

    out = tmp_path / "fresh"
    with pytest.raises(FileNotFoundError, match="none by default"):
        main(["train", "--env", "tictactoe", "--resume", "--steps", "2", "--out-dir", str(out)])
    assert not out.exists()  # nothing written: the trainer (which opens metrics.jsonl) never ran
