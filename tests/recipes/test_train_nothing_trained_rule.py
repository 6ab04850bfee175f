"""`ludic train` refuses a run as NothingTrainedError when every step was skipped because every
episode failed; its closing reward line leaves out such steps by the rule `ludic plot` gaps by
(`ludic.rollouts.every_episode_failed`). Both now read that one rule, the refusal adding that
the step was skipped (its message says the model is unchanged).

The two can differ only where a step's every episode failed and yet it trained: never in one
process (no episode, no sample, so the Trainer skips the step as empty; checked here on a real
Trainer), but a Trainer under torchrun logs one rank's batch counts while another rank may have
trained. Such a step is no reward (a gap, 'unknown') and is no reason to say nothing trained."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rich.console import Console
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.recipes.algorithms import make_algorithm
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_report import NothingTrainedError, TrainResult, report_run
from ludic.rollouts import every_episode_failed
from ludic.training import SAWBatch, Trainer, TrainerConfig
from ludic.training.stall import was_skipped

ALL_FAILED = {"batch/mean_reward": 0.0, "batch/num_rollouts": 4.0, "batch/num_failed": 4.0}
SKIPPED = {**ALL_FAILED, "skipped_empty": 1.0}


def ran(reward: float) -> dict[str, float]:
    return {"batch/mean_reward": reward, "batch/num_rollouts": 4.0, "batch/num_failed": 1.0}


def report(tmp_path: Path, history: list[dict[str, float]]) -> tuple[str, TrainResult]:
    rows = [{"step": i + 1, **m} for i, m in enumerate(history)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    console = Console(record=True, width=300)
    checkpoint = tmp_path / "checkpoints" / f"step_{len(history)}"
    result = report_run(TrainConfig(out_dir=tmp_path), history, checkpoint, console)
    return console.export_text(), result


class _AllFailed:
    """The batch `generate_batch` makes when every episode failed: its counts, no sample."""

    async def next_batch(self) -> SAWBatch:
        stats = {"num_rollouts": 4.0, "num_failed": 4.0, "num_samples": 0.0, "mean_reward": 0.0}
        return SAWBatch(items=[], stats=stats)


async def test_in_one_process_a_step_whose_every_episode_failed_is_skipped() -> None:
    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    trainer = Trainer(
        LlamaForCausalLM(config), make_algorithm("grpo"), _AllFailed(), TrainerConfig()
    )
    metrics = await trainer.train_step()
    assert every_episode_failed(metrics) and was_skipped(metrics)


def test_steps_skipped_because_every_episode_failed_train_nothing(tmp_path: Path) -> None:
    with pytest.raises(NothingTrainedError, match=r"every episode of all 2 step\(s\) failed"):
        report(tmp_path, [SKIPPED, SKIPPED])


def test_a_failed_step_that_trained_is_no_reward_and_no_refusal(tmp_path: Path) -> None:
    # Step 2: rank 0's episodes all failed (its 0.0 is logged), another rank's trained.
    text, result = report(tmp_path, [SKIPPED, ALL_FAILED])
    assert text.startswith("done: mean episode reward unknown: no step had a successful episode.")
    assert "1 of 2 steps trained nothing" in text
    assert math.isnan(result.first_reward) and math.isnan(result.last_reward)


def test_a_failed_step_beside_rewarded_ones_is_left_out(tmp_path: Path) -> None:
    text, result = report(tmp_path, [ran(-1.0), ALL_FAILED, SKIPPED])
    assert text.startswith("done: mean episode reward -1.000 (step 1) -> -1.000 (step 1)")
    assert "(2 steps of this launch had none)" in text
    assert (result.first_reward, result.last_reward) == (-1.0, -1.0)
