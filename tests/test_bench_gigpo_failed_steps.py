"""bench/gigpo_vs_grpo.py's per-run train_mean_reward: a step whose every episode failed logs
batch/mean_reward 0.0, a reward no episode earned, so the JSON holds null for it (a gap, as
`ludic plot` draws it) instead of 0.0."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gigpo_vs_grpo.py"
FAILED = {"batch/mean_reward": 0.0, "batch/num_rollouts": 4.0, "batch/num_failed": 4.0}
HISTORY = [
    FAILED,
    {"batch/mean_reward": -1.0, "batch/num_rollouts": 4.0, "batch/num_failed": 2.0},
    {"batch/mean_reward": 0.0, "batch/num_rollouts": 4.0, "batch/num_failed": 0.0},
]


class _Trained:
    """Stands in for the bench's Trainer: `run` returns HISTORY without training."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def run(self, steps: int, *, progress: bool) -> list[dict[str, float]]:
        return [dict(m) for m in HISTORY]


def test_a_failed_step_is_null_not_reward_0(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("bench_gigpo_failed_steps", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gigpo_failed_steps", bench)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "Trainer", _Trained)
    cfg = bench.BenchConfig(steps=3, eval_episodes=1, hidden_size=16, num_layers=1)
    run = bench.run_one(cfg, "grpo", seed=0)
    assert run["train_mean_reward"] == [None, -1.0, 0.0]  # 0.0 at step 3 was earned
    assert json.loads(json.dumps(run))["train_mean_reward"][0] is None  # null in the JSON
