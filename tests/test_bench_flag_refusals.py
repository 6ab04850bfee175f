"""Flags a bench would ignore or misread are refused before anything runs, naming the flag:
rl_step.py's counts (--rounds 0 ran every arm's warm-up, then failed taking a median of no
rounds; --trl-threads 0 ran TRL on torch's default thread count, labelled trl_0t; a thread
count or arm named twice replaced the first arm, left running), train_step.py's flags of the
other mode (--model 50m without --arms timed the tiny model; --steps with --arms was ignored)
inference.py's, decode_step.py's and weight_sync.py's --threads 0 (torch's default, unnamed,
or a traceback from torch), and gigpo_vs_grpo.py's settings (--steps 0 trained nothing and reported it as a result; an
unknown algorithm raised a traceback after the model was built; one named twice ran twice)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(
    ("script", "flags", "named"),
    [
        ("rl_step.py", ["--rounds", "0"], "--rounds"),
        ("rl_step.py", ["--warmup", "-1"], "--warmup"),
        ("rl_step.py", ["--threads", "0"], "--threads"),
        ("rl_step.py", ["--server-threads", "0"], "--server-threads"),
        ("rl_step.py", ["--trl-threads", "0"], "--trl-threads"),
        ("rl_step.py", ["--trl-threads", "1,x"], "--trl-threads"),
        ("rl_step.py", ["--trl-threads", "1,1"], "--trl-threads"),
        ("train_step.py", ["--model", "50m"], "--model"),
        ("train_step.py", ["--rounds", "3"], "--rounds"),
        ("train_step.py", ["--arms", "base", "--steps", "5"], "--steps"),
        ("train_step.py", ["--arms", "base", "--shared-prefix", "off"], "--shared-prefix"),
        ("inference.py", ["--threads", "0"], "--threads"),
        ("decode_step.py", ["--threads", "0"], "--threads"),
        ("decode_step.py", ["--generations", "0"], "--generations"),
        ("weight_sync.py", ["--threads", "0"], "--threads"),
        ("gigpo_vs_grpo.py", ["--steps", "0"], "--steps"),
        ("gigpo_vs_grpo.py", ["--seeds", "0"], "--seeds"),
        ("gigpo_vs_grpo.py", ["--algorithms", "grpoo"], "--algorithms"),
        ("gigpo_vs_grpo.py", ["--algorithms", "grpo", "grpo"], "--algorithms"),
    ],
)
def test_a_flag_the_run_would_ignore_or_misread_is_refused(
    script: str, flags: list[str], named: str
) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert named in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_rl_step_refuses_an_arm_named_twice() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "rl_step.py"), "--ludic", "sync,thread,sync"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "['sync'] given twice" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
