"""`ludic learner --lr 0` (or a negative or nan `--lr`) reached Redis before anything refused
it: with Redis down the error was a connection error, and with Redis up the trainer refused it
only after the model had loaded, naming its own field (`lr must be > 0`). It is now refused
among the learner's flag checks, naming the flag, before Redis is touched (as `ludic train`
does)."""

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
