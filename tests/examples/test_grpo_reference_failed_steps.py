"""examples/grpo_reference.py's closing "mean reward: first k steps ..., last k steps ..." line:
a step whose every episode failed has BatchStats.mean_reward 0.0, a reward no episode earned,
so it is left out of both averages (and counted), and a run with no other step says the reward
is unknown. The line used to average those 0.0s in."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from ludic.rollouts import BatchResult, BatchStats

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    name = "grpo_reference_failed_steps"
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / "grpo_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses resolve annotations here
    spec.loader.exec_module(module)
    return module


def batch(*, failed: int, reward: float) -> BatchResult:
    """A batch of 4 episodes, `failed` of them failed, and no sample (so no training step)."""
    stats = BatchStats(
        num_requests=4, num_rollouts=4, num_failed=failed, num_timed_out=0, num_agent_steps=0,
        num_samples=0, num_filtered_out=0, num_snapshots=0, num_truncated_episodes=0,
        mean_reward=reward,
    )  # fmt: skip
    return BatchResult(samples=[], rollouts=[], stats=stats)


class _Engine:
    """Stands in for EmbeddedEngine: nothing is served, nothing is generated."""

    def __init__(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass


def run(
    batches: list[BatchResult],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[list[float], str]:
    """The example's rewards and closing reward line when its steps generate `batches`."""
    example = load(monkeypatch)
    steps = iter(batches)

    async def generate_batch(*args: Any, **kwargs: Any) -> BatchResult:
        return next(steps)

    async def win_rate(*args: Any) -> float:
        return 0.5

    model = torch.nn.Linear(1, 1)
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    monkeypatch.setattr(example, "build_tiny_model", lambda seed: (model, tokenizer))
    monkeypatch.setattr(example, "EmbeddedEngine", _Engine)
    monkeypatch.setattr(example, "generate_batch", generate_batch)
    monkeypatch.setattr(example, "win_rate", win_rate)
    _, _, rewards = example.main(example.Config(steps=len(batches)))
    out = capsys.readouterr().out
    (line,) = [text for text in out.splitlines() if text.startswith("mean reward:")]
    return rewards, line


def test_failed_steps_are_left_out_of_the_averages(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    batches = [batch(failed=4, reward=0.0), batch(failed=1, reward=-1.0)]
    batches += [batch(failed=0, reward=-0.5), batch(failed=4, reward=0.0)]
    rewards, line = run(batches, monkeypatch, capsys)
    assert [math.isnan(r) for r in rewards] == [True, False, False, True]
    assert rewards[1:3] == [-1.0, -0.5]
    # k = max(1, 2 // 4) = 1 over the 2 steps with a successful episode: -1.00 and -0.50
    assert line == (
        "mean reward: first 1 steps -1.00, last 1 steps -0.50 "
        "(2 of 4 steps left out: every episode failed)"
    )


def test_a_failed_step_earning_0_is_not_mistaken_for_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # 3 of 4 episodes failed and the fourth earned 0.0: a real reward, kept
    rewards, line = run([batch(failed=3, reward=0.0)], monkeypatch, capsys)
    assert rewards == [0.0]
    assert line == "mean reward: first 1 steps +0.00, last 1 steps +0.00"


def test_no_step_with_a_successful_episode_says_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rewards, line = run([batch(failed=4, reward=0.0)] * 2, monkeypatch, capsys)
    assert all(math.isnan(r) for r in rewards)
    assert line == "mean reward: unknown (2 of 2 steps left out: every episode failed)"
