"""Rollout execution and sample building: requests, the engine, turn-concatenated samples.

Depends on envs, interaction and inference; never on training (no torch at import time).
"""

from ludic.rollouts.batch import BatchResult, BatchStats, every_episode_failed, generate_batch
from ludic.rollouts.build_samples import (
    SNAPSHOT_REWARD_KEY,
    SampleMode,
    SnapshotPolicy,
    build_samples,
)
from ludic.rollouts.engine import EnvFactory, ProtocolFactory, RolloutEngine
from ludic.rollouts.requests import (
    ComponentSpec,
    GRPORequestStrategy,
    IdentityStrategy,
    RequestStrategy,
    RolloutRequest,
    SeedSequencer,
    derive_seed,
    distinct_request_ids,
)
from ludic.rollouts.retokenize import ChatTemplateRetokenizer, ChatTemplateTokenizer, Retokenizer
from ludic.rollouts.rollout_log import (
    append_rollouts_jsonl,
    iter_rollouts_jsonl,
    read_rollouts_jsonl,
    write_rollouts_jsonl,
)
from ludic.rollouts.samples import CreditAssigner, SampleFilter, SAWItem, TurnKey
from ludic.rollouts.stitching import TokenSegment, stitch_traces

__all__ = [
    "SNAPSHOT_REWARD_KEY",
    "BatchResult",
    "BatchStats",
    "ChatTemplateRetokenizer",
    "ChatTemplateTokenizer",
    "ComponentSpec",
    "CreditAssigner",
    "EnvFactory",
    "GRPORequestStrategy",
    "IdentityStrategy",
    "ProtocolFactory",
    "RequestStrategy",
    "Retokenizer",
    "RolloutEngine",
    "RolloutRequest",
    "SAWItem",
    "SampleFilter",
    "SampleMode",
    "SeedSequencer",
    "SnapshotPolicy",
    "TokenSegment",
    "TurnKey",
    "append_rollouts_jsonl",
    "build_samples",
    "derive_seed",
    "distinct_request_ids",
    "every_episode_failed",
    "generate_batch",
    "iter_rollouts_jsonl",
    "read_rollouts_jsonl",
    "stitch_traces",
    "write_rollouts_jsonl",
]
