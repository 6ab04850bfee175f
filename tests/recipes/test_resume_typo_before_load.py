"""A mistyped `--resume PATH` (no such file or directory) is refused before the model loads,
by `ludic train` and `ludic sft` alike, naming OUT_DIR's newest checkpoint and `--resume
latest`; before, the typo surfaced only once the model had loaded (minutes for a large one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.cli import main as ludic_main
from ludic.recipes.training import CHECKPOINTS_DIR, check_run_dir


def test_a_missing_resume_path_is_refused_naming_the_fix(tmp_path: Path) -> None:
    typo = tmp_path / "run" / CHECKPOINTS_DIR / "step_00000009"
    with pytest.raises(FileNotFoundError) as refused:
        check_run_dir(tmp_path / "run", str(typo))
    message = str(refused.value)
    assert f"--resume: {typo}: no such checkpoint or checkpoint directory" in message
    assert "run without --resume" in message  # OUT_DIR holds no checkpoint to point at


def test_an_existing_resume_path_and_latest_pass(tmp_path: Path) -> None:
    existing = tmp_path / "elsewhere"
    existing.mkdir()
    check_run_dir(tmp_path / "run", str(existing))  # the trainer judges what it holds
    (tmp_path / "run" / CHECKPOINTS_DIR / "step_00000001").mkdir(parents=True)
    check_run_dir(tmp_path / "run", "latest")  # a folder there: the trainer judges it too


@pytest.mark.parametrize("command", ["train", "sft"])
def test_each_command_refuses_the_typo_before_anything_loads(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before --resume was checked")

    monkeypatch.setattr("ludic.models.load_model", no_load)
    typo = tmp_path / "run" / CHECKPOINTS_DIR / "step_00000009"
    args = [command, "--out-dir", str(tmp_path / "run"), "--resume", str(typo)]
    if command == "sft":
        (tmp_path / "rollouts.jsonl").write_text("{}\n")
        args += ["--data", str(tmp_path / "rollouts.jsonl")]
    else:
        args.append("--no-progress")
    with pytest.raises(FileNotFoundError, match="no such checkpoint or checkpoint directory"):
        ludic_main(args)
    assert not (tmp_path / "run").exists()
