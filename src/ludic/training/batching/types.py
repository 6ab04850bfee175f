"""What the Trainer pulls from: `SAWBatch` and the `BatchSource` protocol.

A batch source hides where samples come from (rollouts generated now, a JSONL file, a Redis
queue). Sources are async because generating rollouts is; a source that can resume also
exposes `state_dict` / `load_state_dict` with JSON state. Nothing here trains.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ludic.rollouts.samples import SAWItem
from ludic.types import JSON, Rollout


@dataclass(frozen=True, kw_only=True, slots=True)
class SAWBatch:
    """Samples for one optimizer step, the rollouts they came from (when known) and
    batch-level stats as floats (logged under `batch/`)."""

    items: list[SAWItem]
    rollouts: list[Rollout] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


class BatchSourceExhausted(Exception):
    """A finite source has no more batches (the Trainer stops cleanly on it)."""


@runtime_checkable
class BatchSource(Protocol):
    """Produces the next batch of training samples (a plain `def next_batch` also works)."""

    async def next_batch(self) -> SAWBatch: ...


@runtime_checkable
class StatefulBatchSource(Protocol):
    """A source whose data position can be checkpointed and restored (JSON state)."""

    def state_dict(self) -> JSON: ...

    def load_state_dict(self, state: JSON) -> None: ...


def wrapped_sources(source: object) -> Iterator[object]:
    """`source`, then each source it wraps: a wrapper keeps what it wraps as `.source` (as
    `PrefetchBatchSource` and `ludic.recipes`' `SampleLog` and `ContextOverflowWatch` do)."""
    seen: set[int] = set()
    while source is not None and id(source) not in seen:
        yield source
        seen.add(id(source))
        source = getattr(source, "source", None)
