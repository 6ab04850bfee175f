"""How `PipelineBatchSource` treats a sample by its age: `Staleness` drops or down-weights one
more than `max_lag` policy versions behind the learner, records the lag of those it serves, warns
once about one newer than the learner, and words what the waiting and closing lines say about
stale drops. A sample of a dead learner's versions (`versions.Forks`) is dropped as such, and
lags count only this learner's own updates. It reads no stream and acks nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from typing import Literal

from ludic.pipeline.source_checks import ahead_warning
from ludic.pipeline.versions import Forks
from ludic.rollouts.samples import SAWItem

logger = logging.getLogger("ludic.pipeline.source")  # the source's lines, under its name
StalePolicy = Literal["drop", "downweight"]


class Staleness:
    """A sample whose oldest token is more than `max_lag` versions behind `current_version()`
    is stale: `stale="drop"` drops it, "downweight" scales its weight by
    `stale_decay ** (lag - max_lag)`. Samples without recorded versions are never stale;
    `max_lag=None` keeps every sample and only records lags."""

    def __init__(
        self,
        *,
        max_lag: int | None,
        stale: StalePolicy,
        stale_decay: float,
        current_version: Callable[[], int],
    ) -> None:
        self.max_lag = max_lag
        self.stale: StalePolicy = stale
        self.stale_decay = stale_decay
        self.current_version = current_version
        self.forks = Forks()  # where a resumed learner renumbered its versions
        self._warned_ahead = False

    def apply(self, item: SAWItem, stats: Counter[str], lags: list[int]) -> SAWItem | None:
        """`item` as trained (down-weighted if stale), or None if dropped; the lag of a served
        sample goes to `lags` (one newer than the learner's goes to `stats` as `ahead`), drops
        and down-weights to `stats`."""
        if not item.policy_versions:
            return item
        for version in item.policy_versions:  # a dead learner's branch: its weights are gone
            fork = self.forks.dead(version)
            if fork is not None:
                self.forks.warn_dead(version, fork)
                stats["dead_branch"] += 1
                return None
        lag = self.forks.position(self.current_version())
        lag -= self.forks.position(min(item.policy_versions))
        if lag < 0:  # trained, never stale, counted as `ahead` outside the lags >= 0
            self._warn_ahead(item, stats)  # (`policy_lag/ahead` and `/max` count them so)
            return item
        if self.max_lag is None or lag <= self.max_lag:
            lags.append(lag)
            return item
        if self.stale == "drop":  # counted apart: the lag metrics describe trained samples
            stats["dropped_stale"] += 1
            return None
        lags.append(lag)  # downweighted samples are trained, at their own lag
        stats["downweighted"] += 1
        factor = self.stale_decay ** (lag - self.max_lag)
        meta = {**item.meta, "stale_weight_factor": factor}
        return dataclasses.replace(item, weight=item.weight * factor, meta=meta)

    def _warn_ahead(self, item: SAWItem, stats: Counter[str]) -> None:
        """A sample newer than the learner: weights this learner does not hold sampled it (it
        publishes a version only once it has it). Warned once."""
        stats["ahead"] += 1
        if self._warned_ahead:
            return
        self._warned_ahead = True
        logger.warning(ahead_warning(min(item.policy_versions), self.current_version()))

    def waiting_note(self, dropped: int) -> str:
        """What a waiting line adds when `dropped` samples of this wait arrived stale."""
        return (
            f"; {dropped} arrived more than max_lag (--max-lag) {self.max_lag} policy versions "
            f"behind the learner's {self.current_version()} and were dropped: do the actors "
            "sample from the servers this learner publishes to (the same --server-url on both)? "
            "Samples that waited in the stream (a backlog from before this learner started, or "
            "from while it was slow) age the same way, which ends once the backlog is drained. "
            "Else raise --max-lag or pass --stale downweight"
        )

    def exhausted_note(self, dropped: int) -> str:
        """What the closing line says of the `dropped` stale samples the last wait read."""
        return (
            f"{dropped} read were more than max_lag (--max-lag) {self.max_lag} policy versions "
            f"behind the learner's {self.current_version()} and dropped (do the actors sample "
            "from the servers this learner publishes to? else raise --max-lag or pass --stale "
            "downweight)"
        )
