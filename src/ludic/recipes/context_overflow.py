"""Say once, loudly, when a run's episodes end because the dialog outgrew the model's context.

`ContextOverflowWatch` wraps a batch source (`ludic train` uses it) and counts the episodes that
failed on a prompt longer than the model's context (the embedded engine's, `ludic serve`'s or
vLLM's error) or were truncated at `max_seq_len`. The first time most of a batch's episodes
ended that way it calls `warn` once with the count, the first error and the caller's advice;
`quiet_repeated_overflow_lines` hides the per-episode log lines of that cause after the first,
which would otherwise repeat every step. It changes no episode or sample, and does not shorten
anything itself (the caller's advice says how).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ludic._aio import maybe_await
from ludic.recipes.wrapped_source import WrappedSource
from ludic.rollouts.overflow import OVERFLOW_ERROR, ended_by_context_overflow
from ludic.training import BatchSource, SAWBatch
from ludic.types import Rollout

__all__ = ["ContextOverflowWatch", "ended_by_context_overflow", "quiet_repeated_overflow_lines"]

_EPISODE_LOGGER = "ludic.rollouts.engine"


class ContextOverflowWatch(WrappedSource):
    """Passes `source`'s batches through; the first batch in which more than half of the
    episodes ended by context overflow calls `warn(message)` once, the message naming how
    many, the first error and `advice`. `overflowed` / `episodes` count the whole run."""

    def __init__(self, source: BatchSource, *, warn: Callable[[str], None], advice: str) -> None:
        self.source = source
        self.warn = warn
        self.advice = advice
        self.warned = False
        self.overflowed = 0
        self.episodes = 0

    async def next_batch(self) -> SAWBatch:
        batch: SAWBatch = await maybe_await(self.source.next_batch())
        hit = [r for r in batch.rollouts if ended_by_context_overflow(r)]
        self.overflowed += len(hit)
        self.episodes += len(batch.rollouts)
        if not self.warned and hit and 2 * len(hit) > len(batch.rollouts):
            self.warned = True
            self.warn(self._message(hit, len(batch.rollouts)))
        return batch

    def _message(self, hit: list[Rollout], total: int) -> str:
        first = hit[0].meta.get("error") or "truncated at the sequence length limit"
        return (
            f"{len(hit)} of {total} episodes in this batch ended because the dialog outgrew "
            f"the model's context (first: {first}). {self.advice}"
        )


class _FirstOverflowOnly(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("episode ") or not OVERFLOW_ERROR.search(message):
            return True
        self.seen += 1
        return self.seen == 1


@contextmanager
def quiet_repeated_overflow_lines() -> Iterator[None]:
    """While open, the rollout engine logs only the first per-episode context-overflow line
    (the watch's warning speaks for the rest); other episode failures are all logged."""
    episode_logger = logging.getLogger(_EPISODE_LOGGER)
    quiet = _FirstOverflowOnly()
    episode_logger.addFilter(quiet)
    try:
        yield
    finally:
        episode_logger.removeFilter(quiet)
