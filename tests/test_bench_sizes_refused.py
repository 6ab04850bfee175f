"""bench/inference.py, train_step.py and weight_sync.py refuse a run count below 1 with an
argparse error naming the flag, instead of a ZeroDivisionError (inference --repeats 0), an
IndexError (train_step --steps 0) or a StatisticsError (train_step --arms base --rounds 0,
weight_sync --repeats 0, the last after starting six servers and a full warm-up round), and
weight_sync.py a --bucket-mb <= 0, a negative --piece-mb or an unknown --models name, which
raised only once the publisher or the model was built (ValueError, KeyError)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(
    ("script", "flags", "named"),
    [
        ("inference.py", ["--repeats", "0"], "--repeats"),
        ("train_step.py", ["--steps", "0"], "--steps"),
        ("train_step.py", ["--arms", "base", "--rounds", "0"], "--rounds"),
        ("train_step.py", ["--arms", "base", "--warmup", "0"], "--warmup"),
        ("weight_sync.py", ["--repeats", "0"], "--repeats"),
        ("weight_sync.py", ["--bucket-mb", "0"], "--bucket-mb"),
        ("weight_sync.py", ["--piece-mb", "-1"], "--piece-mb"),
        ("weight_sync.py", ["--bucket-mb", "nan"], "--bucket-mb"),
        ("weight_sync.py", ["--models", "tiny,1b"], "--models"),
    ],
)
def test_run_counts_below_one_are_refused(script: str, flags: list[str], named: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert named in done.stderr, done.stderr[-2000:]
    assert "must be" in done.stderr or "choose from" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
