"""Batch sources: where the Trainer's samples come from (rollouts now, or stored rollouts)."""

from ludic.training.batching.offline import OfflineBatchSource
from ludic.training.batching.prefetch import PrefetchBatchSource
from ludic.training.batching.requests_from_dataset import (
    RequestsExhausted,
    make_requests_fn_from_queue,
)
from ludic.training.batching.synced import RequestsFn, RolloutBatchSource
from ludic.training.batching.types import (
    BatchSource,
    BatchSourceExhausted,
    SAWBatch,
    StatefulBatchSource,
)

__all__ = [
    "BatchSource",
    "BatchSourceExhausted",
    "OfflineBatchSource",
    "PrefetchBatchSource",
    "RequestsExhausted",
    "RequestsFn",
    "RolloutBatchSource",
    "SAWBatch",
    "StatefulBatchSource",
    "make_requests_fn_from_queue",
]
