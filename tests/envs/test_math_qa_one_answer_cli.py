"""`--env math_qa` through `ludic eval` and `ludic train` on the tiny local model, which writes
no `\\boxed{}` answer in 4 tokens: each episode is one call and one recorded parse failure with
the parser's penalty, whatever --max-steps allows, and both commands report it alike (eval's
`parse_errors/mean`, train's `parse_error_rate`: 1 per episode, 1 per sample). Format retries
are opt-in through --env-kwargs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ludic.eval.command import EvalConfig, run_eval_command
from ludic.parsers import DEFAULT_PENALTY
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command

ENV_KWARGS = {"limit": 3}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def model_calls(rollout: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rollout["steps"] if s.get("kind", "agent") == "agent"]


def env_steps(rollout: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rollout["steps"] if s.get("kind") == "env"]


def assert_one_parse_failure_each(rollouts: list[dict[str, Any]]) -> None:
    for rollout in rollouts:
        assert len(model_calls(rollout)) == 1  # no format retry
        (step,) = env_steps(rollout)
        assert step["action"] is None and step["info"]["parse_error"] and step["terminated"]
        assert rollout["meta"]["termination_reason"] == "parse_error"


@pytest.mark.slow
def test_ludic_eval_on_math_qa_records_one_parse_failure_per_question(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = ["--env", "math_qa", "--env-kwargs", json.dumps(ENV_KWARGS), "--num-problems", "3"]
    args += ["--max-steps", "10", "--max-tokens", "4", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "eval", *args, "--out-dir", str(tmp_path)],
        env={**env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rollouts = read_jsonl(tmp_path / "rollouts.jsonl")
    assert len(rollouts) == 3
    assert_one_parse_failure_each(rollouts)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["parse_errors/mean"] == 1.0 and metrics["turns/mean"] == 1.0
    assert metrics["reward/mean"] == pytest.approx(DEFAULT_PENALTY)
    assert metrics["success_rate"] == 0.0 and metrics["truncated_rate"] == 0.0


@pytest.mark.slow
def test_ludic_train_on_math_qa_reports_the_parse_failure_as_eval_does(tmp_path: Path) -> None:
    cfg = TrainConfig(
        env="math_qa",
        env_kwargs=json.dumps(ENV_KWARGS),
        steps=1,
        problems_per_step=2,
        group_size=2,
        max_tokens=4,
        max_steps=10,
        out_dir=tmp_path,
        progress=False,
    )
    train_command(cfg)
    rollouts = read_jsonl(tmp_path / "rollouts.jsonl")
    assert len(rollouts) == 4
    assert_one_parse_failure_each(rollouts)
    (metrics,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert metrics["parse_error_rate"] == 1.0 and metrics["batch/num_samples"] == 4
    assert metrics["batch/mean_reward"] == pytest.approx(DEFAULT_PENALTY)


def test_format_retries_through_ludic_eval_are_opt_in(tmp_path: Path) -> None:
    from ludic.models import tiny_model_dir

    cfg = EvalConfig(
        env="math_qa",
        env_kwargs=json.dumps({**ENV_KWARGS, "parse_failure_ends_episode": False}),
        model=str(tiny_model_dir()),
        num_problems=2,
        max_steps=3,
        max_tokens=4,
        temperature=0.0,
        out_dir=tmp_path,
        progress=False,
    )
    result = run_eval_command(cfg)
    assert result.metrics["parse_errors/mean"] == 3.0 and result.metrics["turns/mean"] == 3.0
    assert result.metrics["truncated_rate"] == 1.0  # out of --max-steps, still no answer
    assert result.metrics["reward/mean"] == pytest.approx(3 * DEFAULT_PENALTY)
