"""Each bench's --help names the default of every option that has one: `weight_sync.py
--help` showed `--models MODELS` and `--repeats REPEATS` with nothing after them, so a reader
had to open the source to learn that it runs `tiny,100m` five times (and which models exist)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
from _args import show_defaults  # noqa: E402

# argparse benches (gigpo_vs_grpo.py's tyro help names defaults itself; trl_side.py is
# rl_step.py's worker, never run by hand)
ARGPARSE_BENCHES = sorted(
    p.name
    for p in BENCH.glob("*.py")
    if "show_defaults(parser)" in p.read_text() and not p.name.startswith("_")
)


def test_every_argparse_bench_shows_its_defaults() -> None:
    plain = sorted(
        p.name
        for p in BENCH.glob("*.py")
        if "argparse.ArgumentParser(" in p.read_text() and p.name != "trl_side.py"
    )
    assert plain == ARGPARSE_BENCHES


def test_an_option_without_help_text_gets_its_default() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--piece-mb", type=float, default=16.0, help="0: whole buckets")
    parser.add_argument("--servers", default="", help="instead, time N servers")
    parser.add_argument("--profile", action="store_true", help="print a profile")
    text = " ".join(show_defaults(parser).format_help().split())
    assert "--repeats REPEATS (default: 5)" in text
    assert "--piece-mb PIECE_MB 0: whole buckets (default: 16.0)" in text
    assert "instead, time N servers --profile" in text  # nothing to show for "" or a flag
    assert "(default: False)" not in text


@pytest.mark.slow
def test_weight_sync_help_names_its_models_and_repeats() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "weight_sync.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = " ".join(done.stdout.split())
    assert re.search(
        r"--models MODELS comma-separated, of: tiny, 100m \(default: tiny,100m\)", text
    )
    assert "--repeats REPEATS (default: 5)" in text
