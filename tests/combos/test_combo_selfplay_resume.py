"""Multi-agent self-play + checkpoint + resume + evaluation, each launch a new process: a GRPO
self-play run (two seats of one policy, `MultiAgentProtocol`, both seats playing every game),
stopped after 2 steps and resumed to 4, equals the same run left uninterrupted: the same steps
once each, losses and rewards, the same sampled tokens per seat in every batch, bit-identical
final weights, and the same evaluation of the final policy (batch-invariant engine)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from combo_processes import program, records, run
from safetensors.torch import load_file


def _duel_run(cwd: Path, out: str, total: int) -> str:
    return run(program("combo_duel_run.py", out, str(total)), cwd)


def _completions(record: dict[str, Any]) -> list[list[int]]:
    return [s["trace"]["completion_token_ids"] for s in record["steps"] if s["kind"] == "agent"]


def _trained_episodes(run: Path) -> dict[tuple[int, int, str], list[list[int]]]:
    """Each trained rollout's sampled tokens, keyed by (batch, sampling seed, seat); the
    evaluation's rollouts (no batch index) are left out."""
    episodes: dict[tuple[int, int, str], list[list[int]]] = {}
    for record in records(run / "rollouts.jsonl"):
        meta = record["meta"]
        if "batch_index" in meta:
            key = (meta["batch_index"], meta["sampling_seed"], record["agent_id"])
            assert key not in episodes, key  # a rollout logged twice
            episodes[key] = _completions(record)
    return episodes


def _eval_line(output: str) -> str:
    """The program's printed evaluation metrics (one flat JSON object)."""
    (line,) = re.findall(r"eval \{[^{}]*\}", output)
    return line


@pytest.mark.slow
def test_selfplay_resumed_in_a_new_process_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    straight = _duel_run(tmp_path, "straight", 4)
    assert "resumed at step 0" in _duel_run(tmp_path, "split", 2)
    resumed = _duel_run(tmp_path, "split", 4)
    assert "resumed at step 2" in resumed

    metrics = records(tmp_path / "split" / "metrics.jsonl")
    expected = records(tmp_path / "straight" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for key in ("loss", "batch/mean_reward", "num_samples", "policy_version"):
        assert [m[key] for m in metrics] == [m[key] for m in expected], key
    episodes = _trained_episodes(tmp_path / "split")
    assert episodes == _trained_episodes(tmp_path / "straight")
    for batch in range(4):  # both seats played every game of every batch
        seats = [seat for (b, _, seat) in episodes if b == batch]
        assert sorted(seats) == ["first"] * 4 + ["second"] * 4, (batch, seats)

    final = Path("checkpoints") / "step_00000004" / "model" / "model.safetensors"
    weights = load_file(tmp_path / "split" / final)
    reference = load_file(tmp_path / "straight" / final)
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[k], reference[k]) for k in weights)
    assert _eval_line(resumed) == _eval_line(straight)
