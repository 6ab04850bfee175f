"""`ludic learner --lr 0` (or a negative or nan `--lr`) reached Redis before anything refused
it: with Redis down the error was a connection error, and with Redis up the trainer refused it
only after the model had loaded, naming its own field (`lr must be > 0`). It is now refused
among the learner's flag checks, naming the flag, before Redis is touched (as `ludic train`
does). `--checkpoint-every 0` was refused "so nothing would train", which is wrong for that
flag (a learner without checkpoints trains): it is now refused as the interval it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.cli import main as ludic_main
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.flag_checks import check_learner_counts

NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens: a check that ran late would fail there
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("lr", "line"),
    [
        ("0", "--lr must be a finite number > 0, got 0.0"),
        ("-1e-5", "--lr must be a finite number > 0, got -1e-05"),
        ("nan", "--lr must be a finite number > 0, got nan"),
    ],
)
def test_an_lr_out_of_bounds_is_refused_before_redis(
    lr: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["learner", "--redis-url", NO_REDIS, "--out-dir", str(out), "--lr", lr]
    with pytest.raises(SystemExit) as exit_:
        ludic_main(args, report_refusals=True)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"ludic learner: error: {line} (the peak, e.g. 1e-5)" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_a_positive_lr_passes() -> None:
    check_learner_counts(LearnerConfig(lr=3e-6))  # not refused


@pytest.mark.parametrize("every", ["0", "-3"])
def test_checkpoint_every_below_one_is_refused_as_an_interval(
    every: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--checkpoint-every 0` was refused "so nothing would train", which is wrong for it: a
    learner without checkpoints trains. The refusal says what is wrong: the interval."""
    out = tmp_path / "run"
    args = ["learner", "--redis-url", NO_REDIS, "--out-dir", str(out), "--checkpoint-every", every]
    with pytest.raises(SystemExit) as exit_:
        ludic_main(args, report_refusals=True)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert (
        f"ludic learner: error: --checkpoint-every is {every}: a checkpoint every {every} steps "
        "is no interval; give a count of steps >= 1, leave it out (a checkpoint every 50 steps) "
        "or pass --checkpoint-every None (none)"
    ) in " ".join(err.split())
    assert "nothing would train" not in err
    assert "Traceback" not in err
    assert not out.exists()


def test_checkpoint_every_none_and_one_pass() -> None:
    check_learner_counts(LearnerConfig(checkpoint_every=None))  # no checkpoints: not refused
    check_learner_counts(LearnerConfig(checkpoint_every=1))
