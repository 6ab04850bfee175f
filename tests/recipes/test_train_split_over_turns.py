"""`ludic train --split-over-turns`: the preset's GRPO credit gets it, a preset it does not
apply to is refused before the model loads, the help lists it, and a run records it so a
--resume cannot change it silently."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import make_algorithm, train_command
from ludic.recipes.train_checks import RUN_SETTINGS_KEY, check_resume_settings, run_settings
from ludic.training.credit import GroupNormalizedReturn


def test_the_flag_reaches_the_credit_and_the_recorded_settings() -> None:
    cfg = TrainConfig(split_over_turns=True)
    credit = make_algorithm("grpo", cfg).credit_assigner
    assert isinstance(credit, GroupNormalizedReturn) and credit.split_over_turns
    assert run_settings(cfg, {})["--split-over-turns"] is True
    assert "--split-over-turns" not in run_settings(TrainConfig(), {})  # off: as before it


def _resume(tmp_path: Path, saved_split: bool, given_split: bool) -> list[str]:
    """check_resume_settings of a launch against a checkpoint, each with or without it."""
    out = tmp_path / f"run-{saved_split}-{given_split}"
    step = out / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    settings = run_settings(TrainConfig(split_over_turns=saved_split), {})
    (step / "state.json").write_text(json.dumps({"step": 2, "extra": {RUN_SETTINGS_KEY: settings}}))
    notices: list[str] = []
    cfg = TrainConfig(out_dir=out, resume=str(step), split_over_turns=given_split)
    check_resume_settings(cfg, {}, notices.append)
    return notices


@pytest.mark.parametrize(("saved", "given"), [(True, False), (False, True)])
def test_a_resume_that_changes_it_is_refused(tmp_path: Path, saved: bool, given: bool) -> None:
    with pytest.raises(ValueError, match="--split-over-turns is"):
        _resume(tmp_path, saved, given)


def test_a_resume_that_keeps_it_goes_on(tmp_path: Path) -> None:
    assert _resume(tmp_path, True, True) == []
    assert _resume(tmp_path, False, False) == []


def test_another_preset_is_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ludic.recipes.train as train_module

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr(train_module, "load_policy", no_load)
    cfg = TrainConfig(out_dir=tmp_path, algorithm="rloo", split_over_turns=True)
    with pytest.raises(ValueError, match=r"--split-over-turns applies to .*grpo.* not 'rloo'"):
        train_command(cfg, console=Console(file=io.StringIO()))


def test_help_lists_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "--split-over-turns" in result.stdout
