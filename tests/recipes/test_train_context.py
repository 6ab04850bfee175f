"""`ludic train`'s context: tictactoe defaults to the latest observation (its full dialog
overran the tiny model's 2,048-token context in every episode), and when most episodes of a
batch overflow the context the run says so once, naming the cause and the flags that fix it.
The run that shows the fix also shows the default token budget reaching the Trainer (the
defaults themselves: test_train_defaults.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from train_envs import LongTalkEnv

from ludic.envs import TicTacToeEnv
from ludic.recipes.configs import DEFAULT_MICRO_BATCH_TOKENS, TrainConfig, one_seat_env
from ludic.recipes.context_overflow import (
    ContextOverflowWatch,
    ended_by_context_overflow,
    quiet_repeated_overflow_lines,
)
from ludic.recipes.train import (
    NothingTrainedError,
    TrainResult,
    context_of,
    train_command,
)
from ludic.training import SAWBatch
from ludic.types import Rollout

OVERFLOW = (
    "the prompt has 2128 tokens but the model's context is 2048 tokens; shorten the "
    "conversation (or its system prompt and tool list), or use a model with a longer context"
)
VLLM_OVERFLOW = "This model's maximum context length is 2048 tokens. However, you requested 2100"


def rollout(**meta: object) -> Rollout:
    return Rollout(id="r", steps=[], meta=dict(meta))


def test_context_overflow_is_told_from_other_endings() -> None:
    assert ended_by_context_overflow(rollout(error=OVERFLOW, error_type="ValueError"))
    assert ended_by_context_overflow(rollout(error=VLLM_OVERFLOW, error_type="HTTPError"))
    assert ended_by_context_overflow(rollout(truncation_reason="max_seq_len"))
    assert not ended_by_context_overflow(rollout(error="env exploded", error_type="RuntimeError"))
    assert not ended_by_context_overflow(rollout(truncation_reason="max_steps"))
    assert not ended_by_context_overflow(rollout())


class Batches:
    def __init__(self, *batches: list[Rollout]) -> None:
        self.batches = list(batches)

    def next_batch(self) -> SAWBatch:
        return SAWBatch(items=[], rollouts=self.batches.pop(0))


async def test_the_watch_warns_once_when_most_episodes_overflow() -> None:
    over, fine = rollout(error=OVERFLOW), rollout()
    warnings: list[str] = []
    watch = ContextOverflowWatch(
        Batches([over, fine, fine], [over, over, fine], [over, over, over]),
        warn=warnings.append,
        advice="Pass --context latest.",
    )
    await watch.next_batch()  # one of three: not most
    assert warnings == []
    await watch.next_batch()
    await watch.next_batch()
    assert len(warnings) == 1
    assert warnings[0].startswith("2 of 3 episodes in this batch ended because the dialog")
    assert OVERFLOW in warnings[0] and warnings[0].endswith("Pass --context latest.")
    assert (watch.overflowed, watch.episodes) == (6, 9)


def test_only_the_first_overflow_line_of_the_engine_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine_log = logging.getLogger("ludic.rollouts.engine")
    with caplog.at_level(logging.WARNING, logger="ludic.rollouts.engine"):
        with quiet_repeated_overflow_lines():
            for i in range(3):
                engine_log.warning("episode %s failed (%s): %s", f"e{i}", "run", OVERFLOW)
            engine_log.warning("episode %s failed (%s): %s", "e9", "run", "env exploded")
        engine_log.warning("episode %s failed (%s): %s", "e10", "run", OVERFLOW)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"episode e0 failed (run): {OVERFLOW}",
        "episode e9 failed (run): env exploded",
        f"episode e10 failed (run): {OVERFLOW}",  # the filter is gone after the block
    ]


def test_tictactoe_defaults_to_the_latest_observation() -> None:
    suggested = one_seat_env(TicTacToeEnv, {}, "tictactoe", command="train")
    assert context_of(TrainConfig(), suggested) == "latest"
    assert context_of(TrainConfig(context="full"), suggested) == "full"
    plain = one_seat_env(LongTalkEnv, {}, "train_envs:LongTalkEnv", command="train")
    assert plain is None and context_of(TrainConfig(), plain) == "full"
    assert context_of(TrainConfig(context="latest"), plain) == "latest"


def test_a_bad_suggested_context_is_named() -> None:
    class Odd(LongTalkEnv):
        suggested_context = "everything"

    with pytest.raises(ValueError, match=r"suggested_context = 'everything'.*--context full"):
        one_seat_env(Odd, {}, "odd", command="train")


def _train(cfg: TrainConfig) -> tuple[TrainResult, str]:
    """`ludic train` in this process: its result and the text it printed."""
    console = Console(record=True, width=400)
    result = train_command(cfg, console=console)
    return result, console.export_text()


@pytest.mark.slow
def test_a_run_whose_dialog_overflows_says_so_once_and_latest_fixes_it(tmp_path: Path) -> None:
    """The latest-observation run also shows the default token budget (--micro-batch-tokens
    8192) reaching the Trainer: its batch of long prompts takes several passes."""
    cfg = TrainConfig(
        env="train_envs:DistinctLongEnv",
        steps=2,
        problems_per_step=2,
        group_size=2,
        max_tokens=4,
        out_dir=tmp_path / "full",
        progress=False,
    )
    console = Console(record=True, width=400)
    with pytest.raises(NothingTrainedError, match=r"every episode of all 2 step\(s\) failed"):
        train_command(cfg, console=console)  # every episode overflowed: nothing trained
    text = " ".join(console.export_text().split())  # not where the console wrapped it
    assert "context: full (--context auto: the env suggests none)" in text
    assert text.count("context overflow") == 1, text
    assert "4 of 4 episodes in this batch ended because the dialog outgrew" in text
    assert "Pass --context latest" in text and "--max-tokens 4" in text

    latest = replace(
        cfg,
        context="latest",
        steps=1,
        problems_per_step=4,
        max_steps=2,
        out_dir=tmp_path / "latest",
    )
    assert latest.micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS
    _, text = _train(latest)
    assert "context overflow" not in text and "trained nothing" not in text, text
    rows = [json.loads(line) for line in (tmp_path / "latest" / "metrics.jsonl").open()]
    passes = [row["num_micro_batches"] for row in rows if "num_micro_batches" in row]
    # 4 problems x 2 turns of ~1,240 tokens, every prompt distinct (a group's episodes share
    # their prompts, which the Trainer counts once): about 10,000 tokens, more than one pass
    assert passes and passes[0] > 1, rows


@pytest.mark.slow
def test_tictactoe_with_the_default_flags_no_longer_overflows(tmp_path: Path) -> None:
    """The untrained tiny model's replies are long and unparseable, so every episode runs all
    its --max-steps turns; with the whole dialog each overran the context. With the default
    (latest observation) no prompt holds the earlier turns."""
    cfg = TrainConfig(steps=1, problems_per_step=1, group_size=2, out_dir=tmp_path, progress=False)
    _, text = _train(cfg)
    assert "context: latest (--context auto: the env's suggested_context)" in text
    assert "context overflow" not in text and "trained nothing" not in text, text
    for line in (tmp_path / "rollouts.jsonl").read_text().splitlines():
        episode = json.loads(line)
        assert "error" not in episode["meta"], episode["meta"]
        prompts = [len(ids) for ids in _prompt_ids(episode)]
        assert len(prompts) == cfg.max_steps  # every turn played, none cut short
        # The reply's feedback and the board, never the dialog so far (~10x that by turn 10).
        assert max(prompts) < 1024, prompts


def _prompt_ids(node: object) -> list[list[int]]:
    if isinstance(node, dict):
        found = [node["prompt_token_ids"]] if "prompt_token_ids" in node else []
        return found + [ids for value in node.values() for ids in _prompt_ids(value)]
    if isinstance(node, list):
        return [ids for value in node for ids in _prompt_ids(value)]
    return []
