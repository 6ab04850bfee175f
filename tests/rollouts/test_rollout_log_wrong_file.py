"""A JSONL that is not rollouts (a run's samples.jsonl or metrics.jsonl, an eval's
episodes.jsonl, anything else) is refused with the file and line, saying a rollouts JSONL is
expected, what the file is and what to do with it: by the reader itself, so `ludic view`,
`ludic sft --data` and the offline batch source all say the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rollout_fakes import call, env_step, uniform_weights

from ludic.eval.records import episode_record, step_records, write_records_jsonl
from ludic.rollouts import build_samples, read_rollouts_jsonl, write_rollouts_jsonl
from ludic.training.loggers import JsonlLogger
from ludic.types import Rollout


def run_dir(tmp_path: Path) -> Path:
    """A run folder as `ludic train` leaves it: rollouts, samples, metrics, an eval's records,
    each written by the writer the run uses."""
    rollouts = [
        Rollout(steps=[call([1, 2], [3, 4]), env_step(reward=1.0, terminated=True)])
        for _ in range(2)
    ]
    write_rollouts_jsonl(rollouts, tmp_path / "rollouts.jsonl")
    samples = build_samples(rollouts, uniform_weights(rollouts))
    lines = "".join(json.dumps(s.to_dict()) + "\n" for s in samples)
    (tmp_path / "samples.jsonl").write_text(lines, encoding="utf-8")
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"loss": 0.5, "batch/mean_reward": 1.0}, step=1)
    logger.close()
    write_rollouts_jsonl(rollouts, tmp_path / "eval" / "rollouts.jsonl")
    write_records_jsonl([episode_record(r) for r in rollouts], tmp_path / "eval/episodes.jsonl")
    write_records_jsonl(step_records(rollouts[0]), tmp_path / "eval" / "steps.jsonl")
    return tmp_path


def refusal(path: Path) -> str:
    with pytest.raises(ValueError) as info:
        read_rollouts_jsonl(path)
    return str(info.value)


def test_a_samples_file_says_what_it_is_and_where_it_goes(tmp_path) -> None:
    run = run_dir(tmp_path)
    message = refusal(run / "samples.jsonl")
    assert message.startswith(f"{run / 'samples.jsonl'}:1: a training sample")
    assert "a rollouts JSONL is expected" in message
    assert f"ludic view {run / 'rollouts.jsonl'} --samples {run / 'samples.jsonl'}" in message


def test_a_metrics_file_points_at_ludic_plot(tmp_path) -> None:
    run = run_dir(tmp_path)
    message = refusal(run / "metrics.jsonl")
    assert message.startswith(f"{run / 'metrics.jsonl'}:1: a training metrics record")
    assert "a rollouts JSONL is expected" in message
    assert f"ludic plot {run / 'metrics.jsonl'}" in message


@pytest.mark.parametrize("name", ["episodes.jsonl", "steps.jsonl"])
def test_an_eval_record_file_points_at_the_eval_rollouts(tmp_path, name: str) -> None:
    run = run_dir(tmp_path)
    message = refusal(run / "eval" / name)
    assert message.startswith(f"{run / 'eval' / name}:1: an eval summary record")
    assert f"rollouts are in {run / 'eval' / 'rollouts.jsonl'}" in message


def test_the_line_number_is_the_first_bad_line(tmp_path) -> None:
    run = run_dir(tmp_path)
    path = tmp_path / "mixed.jsonl"
    good = (run / "rollouts.jsonl").read_text(encoding="utf-8").splitlines()[0]
    bad = (run / "samples.jsonl").read_text(encoding="utf-8").splitlines()[0]
    path.write_text(f"{good}\n\n{bad}\n", encoding="utf-8")
    assert refusal(path).startswith(f"{path}:3: a training sample")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"name": "x", "value": 1}', "a record without an 'id' (keys: 'name', 'value')"),
        ("[1, 2]", "not a JSON object (a list)"),
        ('{"id": "r", "steps": [{"kind": "agent"}]}', "a broken rollout record (KeyError"),
    ],
)
def test_other_records_name_what_is_wrong(tmp_path, line: str, expected: str) -> None:
    path = tmp_path / "other.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    message = refusal(path)
    assert message.startswith(f"{path}:1: {expected}")
    assert "a rollouts JSONL is expected here" in message


def ludic(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def error_line(stderr: str, command: str) -> str:
    """The line of `stderr` holding the command's refusal (`ludic <command>: error: ...`)."""
    (line,) = [x for x in stderr.splitlines() if x.startswith(f"ludic {command}: error: ")]
    return line


def test_ludic_view_of_samples_jsonl_says_to_pass_it_as_samples(tmp_path) -> None:
    run = run_dir(tmp_path)
    result = ludic("view", run / "samples.jsonl", cwd=tmp_path)
    assert result.returncode != 0
    last = error_line(result.stderr, "view")
    assert "KeyError" not in last
    assert f"{run / 'samples.jsonl'}:1: a training sample" in last
    assert f"--samples {run / 'samples.jsonl'}" in last
    assert not (run / "samples.html").exists()


def test_ludic_view_of_metrics_jsonl_says_ludic_plot(tmp_path) -> None:
    run = run_dir(tmp_path)
    result = ludic("view", run / "metrics.jsonl", cwd=tmp_path)
    assert result.returncode != 0
    last = error_line(result.stderr, "view")
    assert "KeyError" not in last
    assert f"ludic plot {run / 'metrics.jsonl'}" in last


@pytest.mark.slow
def test_ludic_sft_on_samples_jsonl_names_the_rollouts_file(tmp_path) -> None:
    run = run_dir(tmp_path)
    result = ludic(
        "sft", "--data", run / "samples.jsonl", "--out-dir", tmp_path / "o", cwd=tmp_path
    )
    assert result.returncode != 0
    last = error_line(result.stderr, "sft")
    assert "KeyError" not in last
    assert f"{run / 'samples.jsonl'}:1: a training sample" in last
    assert f"rollouts these samples came from are in {run / 'rollouts.jsonl'}" in last


def test_an_eval_record_file_moved_away_from_its_rollouts_names_no_made_up_file(
    tmp_path,
) -> None:
    run = run_dir(tmp_path)
    moved = tmp_path / "elsewhere" / "steps.jsonl"
    moved.parent.mkdir()
    (run / "eval" / "steps.jsonl").rename(moved)
    message = refusal(moved)
    assert message.startswith(f"{moved}:1: an eval summary record")
    assert message.endswith(
        "That eval's rollouts are in the rollouts.jsonl written with it (none is beside it)"
    )
    assert "ROLLOUTS" not in message


def test_a_samples_file_without_its_rollouts_shows_where_they_go_in_the_command(
    tmp_path,
) -> None:
    run = run_dir(tmp_path)
    (run / "rollouts.jsonl").unlink()
    message = refusal(run / "samples.jsonl")
    assert "are in the rollouts.jsonl written with it (none is beside it)" in message
    assert f"`ludic view <rollouts.jsonl> --samples {run / 'samples.jsonl'}`" in message
