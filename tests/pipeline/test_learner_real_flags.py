"""`ludic learner --max-wait-s -1` loaded the model and stopped at once ("no samples arrived for
-1.0s"); `--verify-atol -1` and `--bucket-mb 0` were taken until the first push (a verification
that fails every time; the publisher's own words after the model loaded), and `--stale-decay 5`
was refused only after torch loaded, as `stale_decay must be in [0, 1]`. Each is now refused
among the learner's flag checks, naming the flag, before Redis is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.cli import main as ludic_main
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.flag_checks import check_learner_counts

NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens: a check that ran late would fail there
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("flag", "value", "line"),
    [
        ("--max-wait-s", "-1", "--max-wait-s is -1.0: pass seconds > 0"),
        ("--max-wait-s", "0", "--max-wait-s is 0.0: pass seconds > 0"),
        ("--max-wait-s", "nan", "--max-wait-s is nan: pass seconds > 0"),
        ("--stale-decay", "5", "--stale-decay is 5.0: pass a factor in [0, 1]"),
        ("--stale-decay", "-0.5", "--stale-decay is -0.5: pass a factor in [0, 1]"),
        ("--stale-decay", "nan", "--stale-decay is nan: pass a factor in [0, 1]"),
        ("--bucket-mb", "0", "--bucket-mb is 0.0: pass a finite size > 0 in MiB"),
        ("--bucket-mb", "inf", "--bucket-mb is inf: pass a finite size > 0 in MiB"),
        ("--verify-atol", "-1", "--verify-atol is -1.0: pass a finite logprob gap >= 0"),
        ("--verify-atol", "nan", "--verify-atol is nan: pass a finite logprob gap >= 0"),
        ("--server-wait-s", "0.5", "--server-wait-s is 0.5: pass seconds >= 1 (how long the le"),
        ("--server-wait-s", "nan", "--server-wait-s is nan: pass seconds >= 1"),
    ],
)
def test_a_real_flag_out_of_range_is_refused_before_redis(
    flag: str, value: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["learner", "--redis-url", NO_REDIS, "--out-dir", str(out), flag, value]
    with pytest.raises(SystemExit) as exit_:
        ludic_main(args, report_refusals=True)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"ludic learner: error: {line}" in err
    assert "unreachable" not in err  # refused before Redis was tried
    assert "Traceback" not in err
    assert not out.exists()


def test_values_in_range_pass() -> None:
    for config in (
        LearnerConfig(max_wait_s=None),
        LearnerConfig(max_wait_s=0.5),
        LearnerConfig(stale_decay=0.0),
        LearnerConfig(stale_decay=1.0),
        LearnerConfig(bucket_mb=0.5),
        LearnerConfig(verify_atol=0.0),  # exact: a batch-invariant server can meet it
    ):
        check_learner_counts(config)  # not refused
