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
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from combo_processes import interrupt_once, ludic, records, run, sft_on_expert_games

INTERRUPTED = re.compile(r"ludic train: interrupted \(Ctrl-C\); last checkpoint: (\S+)")
RL_FLAGS = (
    *("--env", "tictactoe", "--problems-per-step", "2", "--group-size", "2"),
    *("--max-steps", "3", "--max-tokens", "8", "--lr", "1e-3", "--temperature", "1.0"),
    *("--checkpoint-every", "1", "--concurrency", "1", "--no-progress"),
)


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
    for record in records(path):
        body = json.dumps(list(_token_ids(record)))
        batches.setdefault(record["meta"]["batch_index"], []).append(body)
    return batches


def _interrupt_after_two_steps(cwd: Path, model: str) -> str:
    # --steps 40: stopped long before its end, however fast the machine
    command = ludic(
        "train", *RL_FLAGS, "--steps", "40", "--model", model, "--out-dir", "interrupted"
    )
    mark = cwd / "interrupted" / "checkpoints" / "step_00000002" / "MANIFEST.json"
    said = interrupt_once(command, cwd, mark, signal.SIGINT, code=130)
    (last,) = INTERRUPTED.findall(said)
    return last


@pytest.mark.slow
def test_sft_then_rl_interrupted_resumed_evaluated_and_viewed(tmp_path: Path) -> None:
    sft = sft_on_expert_games(tmp_path)
    model = "sft/checkpoints/step_00000002/model"
    assert model in sft and (tmp_path / model / "config.json").is_file()

    straight_run = ludic("train", *RL_FLAGS, "--steps", "4", "--model", model)
    run([*straight_run, "--out-dir", "straight"], tmp_path)
    last = _interrupt_after_two_steps(tmp_path, model)
    stopped_at = int(last.rsplit("_", 1)[1])
    assert last == f"interrupted/checkpoints/step_{stopped_at:08d}" and 2 <= stopped_at < 4
    resumed = run(
        [*straight_run, "--out-dir", "interrupted", "--resume"],
        tmp_path,
    )
    assert f"resumed at step {stopped_at} (policy version {stopped_at})" in resumed
    assert f"steps {stopped_at + 1}-4 of this launch (resumed at step {stopped_at})" in resumed

    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    metrics = records(interrupted / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    expected = records(straight / "metrics.jsonl")
    for key in ("batch/mean_reward", "num_samples", "policy_version", "loss"):
        assert [m[key] for m in metrics] == [m[key] for m in expected], key
    for name in ("rollouts.jsonl", "samples.jsonl"):
        got = _tokens_by_batch(interrupted / name)
        assert sorted(got) == [0, 1, 2, 3], (name, sorted(got))
        assert got == _tokens_by_batch(straight / name), name
    ids = [r["id"] for r in records(interrupted / "rollouts.jsonl")]
    assert len(ids) == 4 * 2 * 2 and not [i for i, n in Counter(ids).items() if n > 1]

    checkpoint = "interrupted/checkpoints/step_00000004"
    run(
        ludic(
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
        run(
            ludic("view", rollouts, *extra, "--tokenizer", checkpoint, "--out", "view.html"),
            tmp_path,
        )
        html = page.read_text()
        assert all(r["id"] in html for r in records(tmp_path / rollouts)), rollouts
