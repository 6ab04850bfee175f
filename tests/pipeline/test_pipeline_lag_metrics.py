"""The learner's policy-lag metrics describe the samples it trains: under --max-lag 2 with
"drop", a sample 4 versions behind is counted in `dropped_stale` and left out of
`lag_max` / `lag_mean` (the learner used to log "policy lag max 4" under --max-lag 2), as the
Trainer's `policy_lag/max` that the step line prints. Real redis-server, the real Trainer on a
tiny local model, the learner's own step line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.models import TinyModelSpec, load_model, tiny_model_dir
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.learner_report import report_step
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import Trainer, TrainerConfig
from ludic.training.algorithm import make_grpo

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
__all__ = ["redis_server"]
SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    tokenizer_vocab_size=300,
)


async def test_lag_metrics_leave_out_dropped_samples(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stream = SampleStream(redis_server.url, stream="s", group="g")
    await stream.ensure_group()
    # learner at version 6, --max-lag 2: lags 4 (dropped), 2, 1, 0 (trained)
    for i, version in enumerate((2, 4, 5, 6)):
        await stream.add(encode_sample(sample(versions=(version,)), sample_id=f"id{i}"))
    source = PipelineBatchSource(
        stream, batch_size=3, max_lag=2, current_version=lambda: 6, block_ms=50, max_wait_s=0.5
    )
    model, _ = load_model(tiny_model_dir(spec=SPEC), dtype="float32")
    config = TrainerConfig(lr=1e-3, initial_policy_version=6)  # the step line reads its lags
    trainer = Trainer(model, make_grpo(), source, config)
    metrics = await trainer.train_step()
    assert metrics["num_samples"] == 3 and metrics["batch/pipeline/dropped_stale"] == 1.0
    assert metrics["batch/pipeline/lag_max"] == 2.0  # never above --max-lag with "drop"
    assert metrics["batch/pipeline/lag_mean"] == 1.0
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.learner_report"):
        report_step(trainer, source, metrics)
    assert "3 samples (policy lag max 2)" in caplog.text, caplog.text
    await source.aclose()
