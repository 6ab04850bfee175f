"""`ludic train`, `ludic sft` and `ludic learner` defaults: a token budget per forward/backward
(a tictactoe batch in one pass ran out of memory), and the env probe awaiting an async close.
That the budget reaches the Trainer of a real `ludic train` run (a batch of long prompts takes
several passes) is asserted by the run in test_train_context.py that shows `--context latest`
fixing an overflow: one run serves both."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

from train_envs import LongTalkEnv

from ludic.pipeline.config import LearnerConfig
from ludic.recipes import quickstart
from ludic.recipes.configs import (
    DEFAULT_MICRO_BATCH_TOKENS,
    QuickstartConfig,
    SFTConfig,
    TrainConfig,
    one_seat_env,
)
from ludic.recipes.training import make_trainer
from ludic.training.collate import plan_micro_batches


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


class AsyncCloseEnv(LongTalkEnv):
    closed = False

    async def close(self) -> None:  # type: ignore[override]
        type(self).closed = True


def test_the_env_probe_awaits_an_async_close() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        assert one_seat_env(AsyncCloseEnv, {}, "async_close", command="train") is None
    assert AsyncCloseEnv.closed
