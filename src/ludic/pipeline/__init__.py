"""Decoupled rollouts and training over Redis Streams: actors push samples tagged with their
policy version, learner ranks each read their own share (`PipelineBatchSource`) and acknowledge
a sample once a checkpoint holds the update trained on it.

A learner loop of your own (not `ludic learner`) that publishes weights to the actors' servers
wraps its publisher in `RecordingPublisher` and calls `fork_versions` before its first step, so a
learner started after a killed one never gives two weights one policy version.

Importing this package is light; the Redis, torch and training parts load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ludic.pipeline.config import ActorConfig, LearnerConfig

if TYPE_CHECKING:
    from ludic.pipeline.actor import ActorBatchStats, PipelineActor
    from ludic.pipeline.codec import DecodedSample, PayloadError, decode_sample, encode_sample
    from ludic.pipeline.commands import run_actor, run_learner
    from ludic.pipeline.credit_check import CreditCheck, CreditMismatchError, credit_record
    from ludic.pipeline.learner_run import fork_versions
    from ludic.pipeline.lease import ConsumerInUseError, ConsumerLease, ConsumerLeaseLostError
    from ludic.pipeline.source import PipelineBatchSource
    from ludic.pipeline.stream import RedisUnavailableError, SampleStream, StreamEntry
    from ludic.pipeline.versions import RecordingPublisher

_LAZY = {
    "ActorBatchStats": "ludic.pipeline.actor",
    "PipelineActor": "ludic.pipeline.actor",
    "DecodedSample": "ludic.pipeline.codec",
    "PayloadError": "ludic.pipeline.codec",
    "decode_sample": "ludic.pipeline.codec",
    "encode_sample": "ludic.pipeline.codec",
    "run_actor": "ludic.pipeline.commands",
    "run_learner": "ludic.pipeline.commands",
    "ConsumerInUseError": "ludic.pipeline.lease",
    "ConsumerLease": "ludic.pipeline.lease",
    "ConsumerLeaseLostError": "ludic.pipeline.lease",
    "CreditCheck": "ludic.pipeline.credit_check",
    "CreditMismatchError": "ludic.pipeline.credit_check",
    "credit_record": "ludic.pipeline.credit_check",
    "PipelineBatchSource": "ludic.pipeline.source",
    "RedisUnavailableError": "ludic.pipeline.stream",
    "SampleStream": "ludic.pipeline.stream",
    "StreamEntry": "ludic.pipeline.stream",
    "RecordingPublisher": "ludic.pipeline.versions",
    "fork_versions": "ludic.pipeline.learner_run",
}

__all__ = [
    "ActorBatchStats",
    "ActorConfig",
    "ConsumerInUseError",
    "ConsumerLease",
    "ConsumerLeaseLostError",
    "CreditCheck",
    "CreditMismatchError",
    "DecodedSample",
    "LearnerConfig",
    "PayloadError",
    "PipelineActor",
    "PipelineBatchSource",
    "RecordingPublisher",
    "RedisUnavailableError",
    "SampleStream",
    "StreamEntry",
    "credit_record",
    "decode_sample",
    "encode_sample",
    "fork_versions",
    "run_actor",
    "run_learner",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic.pipeline' has no attribute {name!r}")
