"""The README's recipe as a user runs it, each stage a new process in one working directory:
expert games (`examples/rejection_sampling.py --expert`) -> `ludic sft` -> `ludic train --model`
the SFT checkpoint -> Ctrl-C (SIGINT) mid-run -> `ludic train --resume` -> `ludic eval` of the
final checkpoint -> `ludic view` of the training and evaluation episodes.

The interrupted-and-resumed run must equal the same run left uninterrupted (`--concurrency 1`
makes a run and its resume bit-reproducible): the same steps once each in metrics.jsonl, the same
rewards, the same sampled tokens per batch in rollouts.jsonl and samples.jsonl, so no step line
is duplicated or missing, and the batch the Ctrl-C cut off is dropped, not kept beside its
redraw."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
INTERRUPTED = re.compile(r"ludic train: interrupted \(Ctrl-C\); last checkpoint: (\S+)")
RL_FLAGS = (
    *("--env", "tictactoe", "--problems-per-step", "2", "--group-size", "2"),
    *("--max-steps", "3", "--max-tokens", "8", "--lr", "1e-3", "--temperature", "1.0"),
    *("--checkpoint-every", "1", "--concurrency", "1", "--no-progress"),
)


def _ludic(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [*head, *args]


def _run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(done.stdout.split())  # rich wraps long lines


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _token_ids(node: Any) -> Any:
    """Every token id list in a record (prompt and completion ids of each model call, a
    sample's input ids), in order; ids and timings, which differ between runs, are left out."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith(("token_ids", "input_ids")):
                yield value
            else:
                yield from _token_ids(value)
    elif isinstance(node, list):
        for value in node:
            yield from _token_ids(value)


def _tokens_by_batch(path: Path) -> dict[int, list[str]]:
    """Per batch index, each record's token ids (as JSON), in file order."""
    batches: dict[int, list[str]] = {}
    for record in _records(path):
        body = json.dumps(list(_token_ids(record)))
        batches.setdefault(record["meta"]["batch_index"], []).append(body)
    return batches


def _interrupt_after_two_steps(cwd: Path, model: str) -> str:
    out = cwd / "interrupted"
    child = subprocess.Popen(
        # --steps 40: stopped long before its end, however fast the machine
        _ludic("train", *RL_FLAGS, "--steps", "40", "--model", model, "--out-dir", "interrupted"),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "step_00000002" / "MANIFEST.json").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "no second checkpoint within 300 s"
            time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, stdout + stderr
    (last,) = INTERRUPTED.findall(" ".join((stdout + stderr).split()))
    return last


@pytest.mark.slow
def test_sft_then_rl_interrupted_resumed_evaluated_and_viewed(tmp_path: Path) -> None:
    _run(
        [
            sys.executable,
            str(REPO / "examples" / "rejection_sampling.py"),
            *("--expert", "--problems", "8", "--out", "data/expert.jsonl"),
        ],
        tmp_path,
    )
    sft = _run(
        _ludic(
            *("sft", "--data", "data/expert.jsonl", "--steps", "2", "--batch-size", "8"),
            *("--out-dir", "sft", "--no-progress"),
        ),
        tmp_path,
    )
    model = "sft/checkpoints/step_00000002/model"
    assert model in sft and (tmp_path / model / "config.json").is_file()

    straight_run = _ludic("train", *RL_FLAGS, "--steps", "4", "--model", model)
    _run([*straight_run, "--out-dir", "straight"], tmp_path)
    last = _interrupt_after_two_steps(tmp_path, model)
    stopped_at = int(last.rsplit("_", 1)[1])
    assert last == f"interrupted/checkpoints/step_{stopped_at:08d}" and 2 <= stopped_at < 4
    resumed = _run(
        [*straight_run, "--out-dir", "interrupted", "--resume"],
        tmp_path,
    )
    assert f"resumed at step {stopped_at} (policy version {stopped_at})" in resumed
    assert f"steps {stopped_at + 1}-4 of this launch (resumed at step {stopped_at})" in resumed

    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    metrics = _records(interrupted / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    expected = _records(straight / "metrics.jsonl")
    for key in ("batch/mean_reward", "num_samples", "policy_version", "loss"):
        assert [m[key] for m in metrics] == [m[key] for m in expected], key
    for name in ("rollouts.jsonl", "samples.jsonl"):
        got = _tokens_by_batch(interrupted / name)
        assert sorted(got) == [0, 1, 2, 3], (name, sorted(got))
        assert got == _tokens_by_batch(straight / name), name
    ids = [r["id"] for r in _records(interrupted / "rollouts.jsonl")]
    assert len(ids) == 4 * 2 * 2 and not [i for i, n in Counter(ids).items() if n > 1]

    checkpoint = "interrupted/checkpoints/step_00000004"
    _run(
        _ludic(
            *("eval", "--env", "tictactoe", "--model", checkpoint, "--num-problems", "2"),
            *("--samples-per-problem", "2", "--max-steps", "3", "--max-tokens", "8"),
            *("--out-dir", "eval", "--no-progress"),
        ),
        tmp_path,
    )
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["episodes"] == 4
    for rollouts, extra in (
        ("interrupted/rollouts.jsonl", ["--samples", "interrupted/samples.jsonl"]),
        ("eval/rollouts.jsonl", []),
    ):
        page = tmp_path / "view.html"
        _run(
            _ludic("view", rollouts, *extra, "--tokenizer", checkpoint, "--out", "view.html"),
            tmp_path,
        )
        html = page.read_text()
        assert all(r["id"] in html for r in _records(tmp_path / rollouts)), rollouts
