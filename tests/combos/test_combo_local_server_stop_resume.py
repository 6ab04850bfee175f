"""`ludic train --local-server` stopped mid-run (SIGTERM, as a scheduler stops a job) and run
again with `--resume`, each a new process: the stopped run leaves the batch it was training (and
the one drawn ahead) in rollouts.jsonl, untrained; the resume drops them before it writes, so the
logs hold every batch once, in order, each trained by exactly one step; the first batch after
the resume is drawn from the restored weights (the fresh server was pushed them first) and no
sample is more than one version old (README, "Generation in another process, from the command
line")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ludic.models import tiny_model_dir

HERE = Path(__file__).parent
STOPPED = re.compile(r"ludic train: interrupted \(SIGTERM\); last checkpoint: \S+step_(\d+)")
GROUP, PROBLEMS = 3, 2


def _game_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}


def _command(model: Path, steps: int, *extra: str) -> list[str]:
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [
        *(*head, "train", "--env", "combo_say_o:SayOEnv", "--local-server"),
        *("--model", str(model), "--problems-per-step", str(PROBLEMS)),
        *("--group-size", str(GROUP), "--max-steps", "1", "--max-tokens", "8", "--lr", "3e-2"),
        *("--checkpoint-every", "1", "--steps", str(steps), "--out-dir", "run", "--no-progress"),
        *extra,
    ]


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _stop_after_two_steps(cwd: Path, model: Path) -> int:
    child = subprocess.Popen(
        _command(model, 200),
        cwd=cwd,
        env=_game_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        mark = cwd / "run" / "checkpoints" / "step_00000002" / "MANIFEST.json"
        deadline = time.monotonic() + 300
        while not mark.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "no second checkpoint within 300 s"
            time.sleep(0.1)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 143, out + err
    (step,) = STOPPED.findall(" ".join((out + err).split()))
    return int(step)


@pytest.mark.slow
def test_a_stopped_local_server_run_resumes_with_each_batch_trained_once(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    stopped_at = _stop_after_two_steps(tmp_path, model)
    assert stopped_at >= 2
    run = tmp_path / "run"
    left = Counter(r["meta"]["batch_index"] for r in _records(run / "rollouts.jsonl"))
    assert max(left) >= stopped_at  # the untrained batch the README says a resume drops
    total = stopped_at + 3
    done = subprocess.run(
        _command(model, total, "--resume"),
        cwd=tmp_path,
        env=_game_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert f"resumed at step {stopped_at} (policy version {stopped_at})" in said
    assert f"served policy version {total}, the trainer's" in said

    metrics = _records(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, total + 1))
    rollouts = Counter(r["meta"]["batch_index"] for r in _records(run / "rollouts.jsonl"))
    assert rollouts == {batch: PROBLEMS * GROUP for batch in range(total)}, rollouts
    samples = _records(run / "samples.jsonl")
    per_batch = Counter(s["meta"]["batch_index"] for s in samples)
    assert sorted(per_batch) == list(range(total))
    assert [per_batch[b] for b in range(total)] == [int(m["num_samples_in"]) for m in metrics]
    for sample in samples:  # trained by step batch + 1, at policy version batch
        lag = sample["meta"]["batch_index"] - min(sample["meta"]["policy_versions"])
        assert 0 <= lag <= 1, sample["meta"]
    first_resumed = [s for s in samples if s["meta"]["batch_index"] == stopped_at]
    assert {min(s["meta"]["policy_versions"]) for s in first_resumed} == {stopped_at}
