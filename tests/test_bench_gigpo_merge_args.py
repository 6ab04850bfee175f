"""`python bench/gigpo_vs_grpo.py merge A.json B.json` refuses no files, `--help`-style flags and
a missing file with a usage line (exit 2) instead of printing an empty report or a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gigpo_vs_grpo.py"


@pytest.mark.parametrize("args", [[], ["--help"], ["missing.json"]])
def test_merge_refuses_bad_arguments_with_usage(args: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "merge", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, (done.stdout[-500:], done.stderr[-2000:])
    assert "usage: python bench/gigpo_vs_grpo.py merge" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr[-2000:]
