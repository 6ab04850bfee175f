"""The same seed gives the same run, and a resume continues it, checked the way a user runs the
commands: each run a fresh `ludic` process.

- `ludic quickstart --tiny` twice with one seed, once next to a busy process: the same weights
  (SFT and RL checkpoints, hashed), the same per-step metrics and the same evaluation games.
- `ludic train` killed (SIGKILL) in the middle of step 3 and resumed from its step-2
  checkpoint ends with the uninterrupted run's weights, metrics, rollouts and samples, none of
  the killed step's partial rows left twice; resuming the finished run again is refused loudly
  (exit code 1, the fix named), never a silent exit 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ludic.models import TinyModelSpec, tiny_model_dir

HERE = Path(__file__).parent
LUDIC = [sys.executable, "-m", "ludic.cli"]
SPEC = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tokenizer_vocab_size=300,
)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]),
        "COLUMNS": "120",
    }


def _finished(process: subprocess.Popen[str], code: int = 0) -> tuple[str, str]:
    try:
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == code, out[-3000:] + err[-3000:]
    return out, err


def _digests(root: Path) -> dict[str, str]:
    """sha256 of every saved weights file under `root`, by its path there."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*.safetensors"))
    }


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without its clock readings (wall time, seconds per phase)."""
    return [
        {
            k: v
            for k, v in row.items()
            if k != "time" and not k.startswith("time/") and not k.endswith("seconds")
        }
        for row in _rows(path)
    ]


def _completions(node: Any) -> list[list[int]]:
    if isinstance(node, dict):
        found = [node["completion_token_ids"]] if "completion_token_ids" in node else []
        return found + [ids for value in node.values() for ids in _completions(value)]
    if isinstance(node, list):
        return [ids for value in node for ids in _completions(value)]
    return []


def _episodes(path: Path) -> list[tuple[Any, ...]]:
    """Each episode's identity (batch, env seed, group slot, sampling seed) and sampled tokens,
    sorted: episodes finish in any order, and their ids are fresh uuids."""
    keys = ("batch_index", "problem_index", "env_seed", "group_index", "sampling_seed")
    return sorted(
        (tuple(row["meta"].get(k, -1) for k in keys), _completions(row["steps"]))
        for row in _rows(path)
    )


def _samples(out: Path) -> list[tuple[int, list[int], float]]:
    """samples.jsonl's (batch, tokens, weight) rows, sorted (episodes finish in any order)."""
    rows = _rows(out / "samples.jsonl")
    return sorted((r["meta"]["batch_index"], r["input_ids"], r["weight"]) for r in rows)


def _quickstart(out: Path) -> subprocess.Popen[str]:
    command = [*LUDIC, "quickstart", "--tiny", "--seed", "3", "--out-dir", str(out)]
    return subprocess.Popen(
        [*command, "--no-progress"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_quickstart_tiny_twice_with_one_seed_idle_and_loaded_is_the_same_run(
    tmp_path: Path,
) -> None:
    idle, loaded = tmp_path / "idle", tmp_path / "loaded"
    _finished(_quickstart(idle))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _finished(_quickstart(loaded))
    finally:
        busy.kill()
        busy.wait()

    weights = _digests(idle)
    assert any(name.startswith("sft/") for name in weights)
    assert any(name.startswith("rl/") for name in weights)
    assert _digests(loaded) == weights
    for stage in ("sft", "rl"):
        assert _metrics(loaded / stage / "metrics.jsonl") == _metrics(
            idle / stage / "metrics.jsonl"
        )
    assert _episodes(loaded / "rl" / "rollouts.jsonl") == _episodes(idle / "rl" / "rollouts.jsonl")
    for stage in ("before_SFT", "after_SFT", "after_RL"):
        games = _episodes(idle / "eval" / stage / "rollouts.jsonl")
        assert games and games == _episodes(loaded / "eval" / stage / "rollouts.jsonl")
    tables = [json.loads((out / "results.json").read_text())["stages"] for out in (idle, loaded)]
    assert tables[0] == tables[1]


TRAIN_FLAGS = (
    *("--env", "resume_envs:SayOTwiceEnv", "--problems-per-step", "2", "--group-size", "3"),
    *("--max-steps", "2", "--max-tokens", "8", "--lr", "3e-2", "--seed", "7"),
    *("--checkpoint-every", "2", "--concurrency", "1", "--steps", "4", "--no-progress"),
)


def _train(out: Path, model: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*LUDIC, "train", *TRAIN_FLAGS, "--model", str(model), "--out-dir", str(out), *extra],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _batches_logged(out: Path) -> set[int]:
    try:
        lines = (out / "rollouts.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {json.loads(line)["meta"]["batch_index"] for line in lines if line.endswith("}")}


def _kill_in_step_3(process: subprocess.Popen[str], out: Path) -> None:
    """SIGKILL the run once step 2's checkpoint is complete and step 3's episodes are being
    logged, before step 3's metrics row (checked while the process is paused)."""
    deadline = time.monotonic() + 240
    checkpoint = out / "checkpoints" / "step_00000002" / "MANIFEST.json"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the run ended before step 3: {process.communicate()}")
        if checkpoint.is_file() and 2 in _batches_logged(out):
            process.send_signal(signal.SIGSTOP)
            time.sleep(0.2)  # a write in flight lands
            steps = [row["step"] for row in _rows(out / "metrics.jsonl")]
            process.kill()
            process.communicate()
            assert steps == [1, 2], f"not killed inside step 3: metrics rows {steps}"
            return
        time.sleep(0.02)
    process.kill()
    pytest.fail("step 3 did not start in time")


@pytest.mark.slow
def test_a_train_run_killed_in_step_3_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    whole, split = tmp_path / "whole", tmp_path / "split"
    running = _train(whole, model)  # independent of the other: they may run at once
    try:
        _kill_in_step_3(_train(split, model), split)
        assert not (split / "checkpoints" / "step_00000004").exists()
        assert 2 in _batches_logged(split)  # the killed step's episodes, discarded on resume
        resumed, _ = _finished(_train(split, model, "--resume"))
        _finished(running)
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()
    assert "resumed at step 2" in resumed and "steps 3-4 of this launch" in resumed

    final = "checkpoints/step_00000004"
    assert _digests(split / final) == _digests(whole / final)
    assert _digests(whole / final) != _digests(whole / "checkpoints" / "step_00000002")
    assert _metrics(split / "metrics.jsonl") == _metrics(whole / "metrics.jsonl")
    assert [row["step"] for row in _metrics(whole / "metrics.jsonl")] == [1, 2, 3, 4]
    episodes = _episodes(split / "rollouts.jsonl")
    assert episodes == _episodes(whole / "rollouts.jsonl")
    assert Counter(key[0] for key, _ in episodes) == {0: 6, 1: 6, 2: 6, 3: 6}  # none twice
    assert _samples(split) == _samples(whole)

    # The finished run resumed again has nothing to do: refused, not a silent success.
    _, err = _finished(_train(split, model, "--resume"), code=1)
    assert "at step 4 and --steps is 4" in err and "raise --steps" in err
    assert "Traceback" not in err
