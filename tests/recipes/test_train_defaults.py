"""`ludic train`, `ludic sft` and `ludic learner` defaults: a token budget per forward/backward
(a tictactoe batch in one pass ran out of memory), and the env probe awaiting an async close."""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path

import pytest
from rich.console import Console
from train_envs import LONG_OBSERVATION, LongTalkEnv

from ludic.pipeline.config import LearnerConfig
from ludic.recipes import quickstart
from ludic.recipes.configs import (
    DEFAULT_MICRO_BATCH_TOKENS,
    QuickstartConfig,
    SFTConfig,
    TrainConfig,
)
from ludic.recipes.train import _inspect_env, train_command
from ludic.recipes.training import make_trainer
from ludic.training.collate import plan_micro_batches
from ludic.types import Info, StepOutcome


def test_the_commands_default_to_a_token_budget() -> None:
    assert DEFAULT_MICRO_BATCH_TOKENS == 8192
    assert TrainConfig().micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS
    assert SFTConfig(data=Path("x.jsonl")).micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS
    assert LearnerConfig().micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS
    # The quickstart keeps its own recipe (one pass per batch): its results do not move.
    assert not hasattr(QuickstartConfig(), "micro_batch_tokens")
    assert inspect.signature(make_trainer).parameters["micro_batch_tokens"].default is None
    assert "micro_batch_tokens" not in inspect.getsource(quickstart)


def test_a_tictactoe_sized_batch_is_split_under_the_default_budget() -> None:
    lengths = [440] * 320  # 32 episodes x 10 turns of ~440 tokens
    plan = plan_micro_batches(lengths, TrainConfig().micro_batch_tokens)
    assert len(plan) == 18  # 18 rows of 440 fit 8,192 tokens
    assert sorted(row for micro in plan for row in micro) == list(range(320))
    assert all(len(micro) * 440 <= DEFAULT_MICRO_BATCH_TOKENS for micro in plan)


@pytest.mark.slow
def test_ludic_train_runs_micro_batches_by_default(tmp_path: Path) -> None:
    """The default reaches the Trainer: a batch of long dialogs takes several passes."""
    cfg = TrainConfig(
        env="test_train_defaults:DistinctLongEnv",
        steps=1,
        problems_per_step=4,
        group_size=2,
        max_tokens=4,
        max_steps=2,
        context="latest",
        out_dir=tmp_path / "run",
        progress=False,
    )
    train_command(cfg, console=Console(record=True, width=300))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    passes = [row["num_micro_batches"] for row in rows if "num_micro_batches" in row]
    # 4 problems x 2 turns of ~1,240 tokens (a group's episodes share their prompts, which the
    # Trainer counts once): about 10,000 tokens, more than one 8,192-token pass
    assert passes and passes[0] > 1, rows


class DistinctLongEnv(LongTalkEnv):
    """LongTalkEnv whose every observation starts differently (no prefix shared across a
    batch's samples, which the Trainer would count once)."""

    def __init__(self) -> None:
        super().__init__()
        self.seed = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn, self.seed = 0, seed or 0
        return f"{self.seed * 7 + 1} apples. {LONG_OBSERVATION}", {}

    def env_step(self, action: str) -> StepOutcome:
        outcome = super().env_step(action)
        obs = f"{self.seed * 7 + self.turn + 2} pears. {LONG_OBSERVATION}"
        return StepOutcome(obs=obs, reward=outcome.reward, terminated=outcome.terminated)


class AsyncCloseEnv(LongTalkEnv):
    closed = False

    async def close(self) -> None:  # type: ignore[override]
        type(self).closed = True


def test_the_env_probe_awaits_an_async_close() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        assert _inspect_env(AsyncCloseEnv, {}, "async_close") is None
    assert AsyncCloseEnv.closed
