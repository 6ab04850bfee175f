"""`ludic train --resume` with a `--steps` the checkpoint already reached, on a decaying LR
schedule: the decay's default length is `--steps`, so the lower value also differs from the
checkpoint's schedule, and that refusal said to pass `--schedule-steps N`, which then only led
to "nothing is left to train". The refusal names the steps at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train_lr_schedule import SPEC, lrs, run

from ludic.models import tiny_model_dir


@pytest.mark.slow
def test_a_resume_with_fewer_steps_says_nothing_is_left(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    out = tmp_path / "run"
    run(out, model, "--steps", "3")  # (its warmup of 1 needs --steps 2 or more)
    for steps in ("2", "3"):
        with pytest.raises(ValueError) as refused:
            run(out, model, "--steps", steps, "--resume")
        said = str(refused.value)
        assert f"checkpoint is at step 3 and --steps is {steps}" in said, said
        assert "nothing is left to train" in said and "--schedule-steps" not in said, said
    assert len(lrs(out)) == 3


@pytest.mark.slow
def test_a_resume_onto_a_constant_schedule_names_only_the_schedule(tmp_path: Path) -> None:
    """A cosine run resumed with --lr-schedule constant: the refusal named the decay's length
    and floor as "None" (what a constant schedule ignores), and said a longer decay climbs back
    up; it names the schedule, and the checkpoint's values to pass."""
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    out = tmp_path / "run"
    run(out, model, "--steps", "2")
    with pytest.raises(ValueError) as refused:
        # (--min-lr-ratio 0: the run's 0.1 with a constant schedule is refused on its own)
        run(
            out,
            model,
            "--steps",
            "3",
            "--resume",
            "--lr-schedule",
            "constant",
            "--min-lr-ratio",
            "0",
        )
    said = str(refused.value)
    assert "the LR settings differ from the checkpoint's: --lr-schedule is constant, the " in said
    assert "None" not in said and "climbs back up" not in said, said
    assert "Pass --lr-schedule cosine --schedule-steps 2 --min-lr-ratio 0.1 to continue" in said
