"""`ludic train --rollout-correction.*`: the flags wrap the preset's loss in
`RolloutCorrection` (truncated IS, rejection), bad values and a level without its correction
are refused before the model loads, a run records them so a --resume cannot change them
silently, and a short run trains with them."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from rich.console import Console

from ludic.recipes.configs import TrainConfig
from ludic.recipes.rollout_correction_flags import CorrectionLevel, RolloutCorrectionOptions
from ludic.recipes.train import make_algorithm, train_command
from ludic.recipes.train_checks import (
    RUN_SETTINGS_KEY,
    check_greedy,
    check_resume_settings,
    run_settings,
)
from ludic.training.losses import RejectOutside, RolloutCorrection, TruncatedIS
from ludic.training.losses.rollout_correction import LEVELS

Options = RolloutCorrectionOptions


def test_the_flags_wrap_the_presets_loss() -> None:
    options = Options(tis_cap=2.0, reject_low=0.1, reject_level="sequence")
    plain = make_algorithm("gspo", TrainConfig(algorithm="gspo"))
    corrected = make_algorithm("gspo", TrainConfig(algorithm="gspo", rollout_correction=options))
    loss = corrected.loss
    assert isinstance(loss, RolloutCorrection) and loss.loss == plain.loss
    assert loss.corrections == (
        TruncatedIS(level="token", cap=2.0),
        RejectOutside(level="sequence", low=0.1, high=math.inf),
    )
    assert corrected.name == plain.name  # the checkpoint's algorithm record is unchanged


def test_off_leaves_the_preset_as_it_was() -> None:
    assert make_algorithm("grpo", TrainConfig()) == make_algorithm("grpo", TrainConfig())
    assert not isinstance(make_algorithm("grpo", TrainConfig()).loss, RolloutCorrection)


def test_the_levels_are_the_losses() -> None:
    assert get_args(CorrectionLevel) == LEVELS


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (Options(tis_cap=0.5), r"tis-cap must be a finite number >= 1.*got 0.5"),
        (Options(tis_cap=math.nan), r"tis-cap must be a finite number >= 1.*got nan"),
        (Options(reject_low=1.5), r"reject-low must be in \[0, 1\].*got 1.5"),
        (Options(reject_high=0.5), r"reject-high must be >= 1.*got 0.5"),
        (Options(reject_high=math.nan), r"reject-high must be >= 1.*got nan"),
        (Options(tis_level="sequence"), r"tis-level sequence applies only with .*tis-cap"),
        (Options(tis_cap=2.0, reject_level="geometric"), r"reject-level geometric applies only"),
    ],
)
def test_bad_values_are_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: Options, message: str
) -> None:
    import ludic.recipes.train as train_module

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr(train_module, "load_policy", no_load)
    cfg = TrainConfig(out_dir=tmp_path, rollout_correction=options)
    with pytest.raises(ValueError, match=r"--rollout-correction\." + message):
        train_command(cfg, console=Console(file=io.StringIO()))


def test_recorded_when_on_only() -> None:
    settings = run_settings(TrainConfig(rollout_correction=Options(tis_cap=3.0)), {})
    assert settings["--rollout-correction.tis-cap"] == 3.0
    assert settings["--rollout-correction.reject-low"] is None
    assert not any(f.startswith("--rollout-correction.") for f in run_settings(TrainConfig(), {}))


def _resume(tmp_path: Path, saved: Options, given: Options) -> list[str]:
    """check_resume_settings of a launch with `given` against a checkpoint saved with `saved`."""
    out = tmp_path / f"run-{abs(hash((saved, given)))}"
    step = out / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    settings = run_settings(TrainConfig(rollout_correction=saved), {})
    (step / "state.json").write_text(json.dumps({"step": 2, "extra": {RUN_SETTINGS_KEY: settings}}))
    notices: list[str] = []
    cfg = TrainConfig(out_dir=out, resume=str(step), rollout_correction=given)
    check_resume_settings(cfg, {}, notices.append)
    return notices


@pytest.mark.parametrize(
    ("saved", "given", "message"),
    [
        (
            Options(),
            Options(tis_cap=2.0),
            "--rollout-correction.tis-cap is 2.0, the checkpoint's None",
        ),
        (
            Options(tis_cap=2.0),
            Options(),
            "--rollout-correction.tis-cap is None, the checkpoint's 2.0",
        ),
        (
            Options(reject_high=4.0),
            Options(reject_high=4.0, reject_level="sequence"),
            "--rollout-correction.reject-level is sequence, the checkpoint's token",
        ),
    ],
)
def test_a_resume_that_changes_it_is_refused(
    tmp_path: Path, saved: Options, given: Options, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        _resume(tmp_path, saved, given)
    assert "Pass the checkpoint's flags" in str(refused.value)


def test_a_resume_that_keeps_it_goes_on(tmp_path: Path) -> None:
    on = Options(tis_cap=2.0, tis_level="geometric")
    assert _resume(tmp_path, on, on) == []
    assert _resume(tmp_path, Options(), Options()) == []


def test_a_short_run_trains_with_it(tmp_path: Path) -> None:
    cfg = TrainConfig(
        steps=1,
        problems_per_step=1,
        group_size=2,
        max_tokens=4,
        max_steps=2,
        out_dir=tmp_path,
        progress=False,
        rollout_correction=Options(tis_cap=2.0, reject_low=0.5),
    )
    result = train_command(cfg, console=Console(file=io.StringIO()))
    row: dict[str, Any] = json.loads(result.metrics_jsonl.read_text().splitlines()[-1])
    assert row["loss/rollout_is/weight_mean"] > 0
    assert "loss/rollout_is/tis_token_frac" in row and "loss/rollout_is/reject_token_frac" in row
    state = json.loads((result.checkpoint / "state.json").read_text())
    assert state["extra"][RUN_SETTINGS_KEY]["--rollout-correction.tis-cap"] == 2.0


def test_the_cli_refuses_a_bad_cap_and_lists_the_flags(tmp_path: Path) -> None:
    def ludic(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "ludic.cli", "train", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    assert "--rollout-correction.tis-cap" in ludic("--help").stdout
    refused = ludic("--rollout-correction.tis-cap", "0.5", "--out-dir", str(tmp_path / "run"))
    assert refused.returncode != 0
    assert "--rollout-correction.tis-cap must be a finite number >= 1" in refused.stderr


def test_greedy_sampling_is_refused_with_it(tmp_path: Path) -> None:
    """A correction is a ratio against sampled completions, as a clipped loss is: reinforce
    alone takes --temperature 0, with a correction it is refused."""
    options = Options(tis_cap=2.0)
    cfg = TrainConfig(out_dir=tmp_path, algorithm="reinforce", temperature=0.0)
    check_greedy(cfg, make_algorithm("reinforce", cfg))
    corrected = TrainConfig(
        out_dir=tmp_path, algorithm="reinforce", temperature=0.0, rollout_correction=options
    )
    with pytest.raises(ValueError, match="--temperature 0"):
        check_greedy(corrected, make_algorithm("reinforce", corrected))
