"""`ludic view --samples FILE` names what FILE is when it is not a training samples JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.rollouts import write_rollouts_jsonl
from ludic.types import Rollout
from ludic.viz import write_viewer


@pytest.fixture
def rollouts(tmp_path: Path) -> Path:
    path = tmp_path / "rollouts.jsonl"
    write_rollouts_jsonl([Rollout(id="r0")], path)
    return path


def test_a_missing_samples_file_names_what_to_give(tmp_path: Path, rollouts: Path) -> None:
    with pytest.raises(ValueError, match=r"no samples file at .*samples\.jsonl `ludic train`"):
        write_viewer(rollouts, tmp_path / "v.html", samples=tmp_path / "nothere.jsonl")


def test_a_rollouts_file_given_as_samples_is_named(tmp_path: Path, rollouts: Path) -> None:
    with pytest.raises(ValueError, match=r"rollouts\.jsonl:1: a rollout .*not a training sample"):
        write_viewer(rollouts, tmp_path / "v.html", samples=rollouts)


def test_an_eval_steps_file_given_as_samples_is_named(tmp_path: Path, rollouts: Path) -> None:
    steps = tmp_path / "steps.jsonl"
    steps.write_text(json.dumps({"rollout_id": "r0", "turn_index": 0, "reward": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"steps\.jsonl:1: an eval summary record"):
        write_viewer(rollouts, tmp_path / "v.html", samples=steps)


def test_a_samples_line_still_being_written_says_so(tmp_path: Path, rollouts: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"input_ids": [1, 2')
    with pytest.raises(ValueError, match=r"samples\.jsonl:1: .*still writing"):
        write_viewer(rollouts, tmp_path / "v.html", samples=samples)
