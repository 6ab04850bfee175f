"""The real Trainer over a default PipelineBatchSource (real redis-server, tiny local model):
samples are acked once a checkpoint holds them, and a crash plus resume trains the rest once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, expire_leases, redis_server, sample

from ludic.models import TinyModelSpec, load_model, tiny_model_dir
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import CheckpointConfig, Trainer, TrainerConfig
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


def _trainer(server: RedisServer, tmp_path: Path) -> Trainer:
    stream = SampleStream(server.url, stream="s", group="g", ledger="s:ledger")
    source = PipelineBatchSource(stream, batch_size=2, block_ms=50, max_wait_s=0.5)
    model, _ = load_model(tiny_model_dir(spec=SPEC), dtype="float32")
    checkpoint = CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=2)
    return Trainer(model, make_grpo(), source, TrainerConfig(lr=1e-3, checkpoint=checkpoint))


def _ledger(server: RedisServer) -> list[str]:
    return [i for _, f in server.client().xrange("s:ledger") for i in json.loads(f[b"ids"])]


async def test_trainer_acks_what_its_checkpoints_hold_and_resumes_the_rest(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    stream = SampleStream(redis_server.url, stream="s", group="g")
    await stream.ensure_group()
    for i in range(10):
        await stream.add(encode_sample(sample(weight=1.0 - i / 5), sample_id=f"id{i}"))
    first = _trainer(redis_server, tmp_path)
    await first.train(3, progress=False)  # checkpoint at step 2; step 3 reads id4, id5
    assert _ledger(redis_server) == ["id0", "id1", "id2", "id3"]  # only what step 2 holds
    # the process dies here: id4, id5 were trained, but no checkpoint holds them
    assert isinstance(first.batch_source, PipelineBatchSource)
    expire_leases(first.batch_source)
    resumed = _trainer(redis_server, tmp_path)
    assert resumed.resume() == 2
    history = await resumed.train(100, progress=False)  # until no sample arrives
    assert len(history) == 3  # id4..id9 in batches of 2
    source = resumed.batch_source
    assert isinstance(source, PipelineBatchSource)
    assert source.totals["redelivered"] == 2 and source.totals["samples"] == 6
    resumed.save_checkpoint()
    await source.ack_checkpointed()
    assert sorted(_ledger(redis_server)) == sorted(f"id{i}" for i in range(10))  # each once
    await source.aclose()  # its lease renewal would go on, warning once the server stops
    await stream.aclose()
