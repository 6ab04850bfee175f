"""bench/rollout_overhead.py and bench/off_loop_overhead.py refuse an --episodes that is not a
positive multiple of their group size (8) or a --steps / --repeats below 1, with an argparse
error naming the flag, instead of a ZeroDivisionError after the warm-up (--episodes 4: no groups)
or a report whose `episodes` is not what ran (--episodes 12 ran 8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", ["rollout_overhead.py", "off_loop_overhead.py"])
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--episodes", "4"], "--episodes"),
        (["--episodes", "12"], "--episodes"),
        (["--steps", "0"], "--steps"),
        (["--repeats", "0"], "--repeats"),
    ],
)
def test_bad_sizes_are_refused_naming_the_flag(script: str, flags: list[str], named: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert named in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
