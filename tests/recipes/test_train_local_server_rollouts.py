"""`ludic train --local-server` draws the next batch during each optimizer step, so when the
run ends one batch has been drawn that no step trained; rollouts.jsonl holds the episodes of
the trained batches only, as a run without --local-server does (and as samples.jsonl and
metrics.jsonl say). Run as a user runs it: the `ludic` command in a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ludic.models import tiny_model_dir

HERE = Path(__file__).parent
PROBLEMS, GROUP, STEPS = 2, 3, 2


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_rollouts_jsonl_holds_only_the_batches_that_were_trained(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    run = tmp_path / "run"
    args = [
        *("--env", "resume_envs:SayOTwiceEnv", "--local-server", "--model", str(model)),
        *("--problems-per-step", str(PROBLEMS), "--group-size", str(GROUP)),
        *("--max-steps", "2", "--max-tokens", "8", "--steps", str(STEPS)),
        *("--out-dir", str(run), "--no-progress"),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert [m["step"] for m in records(run / "metrics.jsonl")] == [1, 2]
    rollouts = records(run / "rollouts.jsonl")
    batches = [r["meta"]["batch_index"] for r in rollouts]
    assert sorted(set(batches)) == list(range(STEPS)), batches  # not batch 2, drawn ahead
    assert len(rollouts) == STEPS * PROBLEMS * GROUP
    trained = {s["meta"]["batch_index"] for s in records(run / "samples.jsonl")}
    assert trained == set(batches)
