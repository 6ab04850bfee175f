"""`check_resume_settings`, the check `ludic train --resume` runs before the model loads:
another `--max-tokens` (the fix the context-overflow warning advises) resumes with a notice
naming both values, as does another `--max-steps`; the flags that change the trained objective
(the prompt and parser flags included) are still refused, and so is
`--max-tokens` under dr_grpo, whose loss divides by it, and a `ludic sft` checkpoint."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import tyro

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_checks import RUN_SETTINGS_KEY, check_resume_settings, run_settings

BASE = ["--env", "some_env:Env", "--max-tokens", "64", "--group-size", "4"]


def config(*args: str) -> TrainConfig:
    return tyro.cli(TrainConfig, args=list(args))


def checkpoint(tmp_path: Path, *args: str) -> Path:
    """A checkpoint whose state.json records the run settings of `ludic train *args`."""
    path = tmp_path / "run" / "checkpoints" / "step_00000002"
    path.mkdir(parents=True)
    extra = {RUN_SETTINGS_KEY: run_settings(config(*args), {})}
    (path / "state.json").write_text(json.dumps({"step": 2, "extra": extra}))
    return path


def resume(tmp_path: Path, saved: Path, *args: str) -> list[str]:
    notices: list[str] = []
    cfg = config(*args, "--out-dir", str(tmp_path / "run"), "--resume", str(saved))
    check_resume_settings(cfg, {}, notices.append)
    return notices


def test_another_max_tokens_resumes_with_a_notice_naming_both_values(tmp_path: Path) -> None:
    saved = checkpoint(tmp_path, *BASE)
    (note,) = resume(tmp_path, saved, *BASE, "--max-tokens", "32")
    assert "--max-tokens is 32, the checkpoint's 64: continuing with 32" in note
    assert resume(tmp_path, saved, *BASE) == []  # the same flags: nothing to say


@pytest.mark.parametrize(
    ("flag", "value", "saved"),
    [
        ("--algorithm", "rloo", "grpo"),
        ("--group-size", "8", "4"),
        ("--problems-per-step", "3", "4"),  # the batch each step trains (and draws next)
        ("--temperature", "0.7", "1.0"),
        ("--top-p", "0.9", "1.0"),
        ("--env", "other_env:Env", "some_env:Env"),
        ("--context", "full", "auto"),  # what the model sees in its prompt
        ("--parser", "identity", "auto"),  # which replies are actions, and the parse penalties
        ("--system-prompt", "Be brief.", "None"),
        ("--seed", "1", "0"),  # every env and sampling seed of the batches after it
    ],
)
def test_flags_that_change_the_objective_are_still_refused(
    tmp_path: Path, flag: str, value: str, saved: str
) -> None:
    checkpoint_dir = checkpoint(tmp_path, *BASE)
    with pytest.raises(ValueError, match="with other settings") as refused:
        resume(tmp_path, checkpoint_dir, *BASE, "--max-tokens", "32", flag, value)
    message = str(refused.value)
    assert f"{flag} is {shlex.quote(value)}" in message  # typed back: --system-prompt 'Be brief.'
    assert f"flags ({flag} {saved}) to continue it" in message
    assert "--max-tokens" not in message  # allowed, so not named as the problem


def test_another_max_steps_resumes_with_a_notice_naming_both_values(tmp_path: Path) -> None:
    """Like --max-tokens, --max-steps only moves where episodes are cut off; it was not
    recorded, so a resume with another one went on without a word."""
    saved = checkpoint(tmp_path, *BASE, "--max-steps", "6")
    (note,) = resume(tmp_path, saved, *BASE, "--max-steps", "3")
    assert "--max-steps is 3, the checkpoint's 6: continuing with 3" in note


def test_another_reject_incomplete_is_refused(tmp_path: Path) -> None:
    """--reject-incomplete turns a cut-off reply into a parse failure with a penalty: another
    reward, so another run; it was not recorded, so a resume switched it silently."""
    saved = checkpoint(tmp_path, *BASE, "--reject-incomplete")
    with pytest.raises(ValueError, match="with other settings") as refused:
        resume(tmp_path, saved, *BASE)
    assert "--reject-incomplete is False, the checkpoint's True" in str(refused.value)
    assert "flags (--reject-incomplete) to continue it" in str(refused.value)  # as typed
    assert resume(tmp_path, saved, *BASE, "--reject-incomplete") == []


def test_a_boolean_gigpo_knob_is_named_as_typed_in_the_fix(tmp_path: Path) -> None:
    """The fix named `--gigpo.normalize-std False`, which the command line does not take."""
    gigpo = [*BASE, "--algorithm", "gigpo"]
    saved = checkpoint(tmp_path, *gigpo, "--gigpo.no-normalize-std")
    with pytest.raises(ValueError, match="with other settings") as refused:
        resume(tmp_path, saved, *gigpo)
    assert "flags (--gigpo.no-normalize-std) to continue it" in str(refused.value)
    assert resume(tmp_path, saved, *gigpo, "--gigpo.no-normalize-std") == []


def test_another_max_tokens_is_refused_under_dr_grpo(tmp_path: Path) -> None:
    saved = checkpoint(tmp_path, *BASE, "--algorithm", "dr_grpo")
    with pytest.raises(ValueError, match="with other settings") as refused:
        resume(tmp_path, saved, *BASE, "--algorithm", "dr_grpo", "--max-tokens", "32")
    message = str(refused.value)
    assert "--max-tokens is 32, the checkpoint's 64 (dr_grpo's loss normaliser)" in message
    assert "(--max-tokens 64) to continue it" in message


def test_a_ludic_sft_checkpoint_is_refused_naming_the_command_and_the_fix(tmp_path: Path) -> None:
    from ludic.recipes.configs import SFTConfig
    from ludic.recipes.sft_resume import SFT_SETTINGS_KEY, sft_settings

    path = tmp_path / "run" / "checkpoints" / "step_00000002"
    path.mkdir(parents=True)
    extra = {SFT_SETTINGS_KEY: sft_settings(tyro.cli(SFTConfig, args=["--data", "d.jsonl"]))}
    (path / "state.json").write_text(json.dumps({"step": 2, "extra": extra}))
    with pytest.raises(ValueError, match="is a `ludic sft` checkpoint") as refused:
        resume(tmp_path, path, *BASE)
    assert f"start a new run with --model {path / 'model'} and another --out-dir" in str(
        refused.value
    )


def test_a_checkpoint_recording_no_settings_resumes_unchecked_with_a_notice(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run" / "checkpoints" / "step_00000002"
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"step": 2, "extra": {}}))
    (note,) = resume(tmp_path, path, *BASE)
    assert "saved by an older ludic" in note
