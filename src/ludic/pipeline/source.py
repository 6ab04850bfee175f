"""`PipelineBatchSource`: the learner's side of the Redis pipeline, a Trainer `BatchSource`.

Each batch is read through the stream's consumer group. Entries are committed (acked,
deleted, ledgered) only after the optimizer step that used them: with `auto_commit` at the
start of the next `next_batch` call, or explicitly with `commit()` (after a checkpoint, so a
restart from that checkpoint redoes exactly the uncommitted samples). The ids still
uncommitted are part of `state_dict()`, so resuming from a checkpoint acks the ones it already
contains. On its first batch a (re)started learner replays its own pending entries, then claims
entries idle consumers left behind, before reading new ones. Stale samples (more than `max_lag`
versions behind `current_version()`) are dropped or down-weighted and counted, undecodable
entries are dead-lettered, repeated sample ids (at-least-once XADD retries) are skipped. It does
not generate rollouts or train.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Literal

from ludic.pipeline.codec import PayloadError, decode_sample
from ludic.pipeline.stream import SampleStream, StreamEntry
from ludic.rollouts.samples import SAWItem
from ludic.training.batching.types import BatchSourceExhausted, SAWBatch
from ludic.types import JSON

logger = logging.getLogger(__name__)
StalePolicy = Literal["drop", "downweight"]


class PipelineBatchSource:
    """Batches of `batch_size` samples from `stream`, read as consumer `consumer`.

    - `max_lag`, `current_version`: a sample whose oldest token is more than `max_lag`
      versions behind `current_version()` (the trainer's policy version) is stale. `stale`:
      "drop" it, or "downweight" its weight by `stale_decay ** (lag - max_lag)`. Samples
      without recorded versions are never stale. With "downweight", leave the Trainer's own
      `TrainerConfig.max_lag` at None (it would drop them).
    - `block_ms`: one wait on Redis; `max_wait_s`: after this long without a full batch,
      return what arrived, or raise BatchSourceExhausted if nothing did (None: wait forever).
    - `claim_min_idle_ms`: entries another consumer left uncommitted this long are taken over
      at startup. Run one learner consumer per group (data-parallel learners share a reader).
    """

    def __init__(
        self,
        stream: SampleStream,
        *,
        batch_size: int,
        consumer: str = "learner",
        max_lag: int | None = None,
        stale: StalePolicy = "drop",
        stale_decay: float = 0.5,
        current_version: Callable[[], int] | None = None,
        auto_commit: bool = True,
        block_ms: int = 1000,
        max_wait_s: float | None = None,
        claim_min_idle_ms: int = 60_000,
        dedupe_window: int = 100_000,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if stale not in ("drop", "downweight"):
            raise ValueError(f"stale must be 'drop' or 'downweight', got {stale!r}")
        if max_lag is not None and (max_lag < 0 or current_version is None):
            raise ValueError("max_lag needs to be >= 0 and a current_version callable")
        if not 0.0 <= stale_decay <= 1.0:
            raise ValueError(f"stale_decay must be in [0, 1], got {stale_decay}")
        self.stream = stream
        self.batch_size = batch_size
        self.consumer = consumer
        self.max_lag = max_lag
        self.stale: StalePolicy = stale
        self.stale_decay = stale_decay
        self.current_version = current_version or (lambda: 0)
        self.auto_commit = auto_commit
        self.block_ms = block_ms
        self.max_wait_s = max_wait_s
        self.claim_min_idle_ms = claim_min_idle_ms
        self.dedupe_window = dedupe_window
        self.batches_served = 0
        self.totals: Counter[str] = Counter()
        self._uncommitted: list[tuple[str, str]] = []  # (entry id, sample id), in read order
        self._ack_on_start: list[tuple[str, str]] = []
        self._replay: deque[StreamEntry] = deque()
        self._recovered = False
        self._seen: OrderedDict[str, None] = OrderedDict()

    # -- BatchSource ----------------------------------------------------------------------

    async def next_batch(self) -> SAWBatch:
        if self.auto_commit:
            await self.commit()
        if not self._recovered:
            await self._recover()
        stats: Counter[str] = Counter()
        items: list[SAWItem] = []
        lags: list[int] = []
        started = time.monotonic()
        while len(items) < self.batch_size:
            entries = await self._next_entries(self.batch_size - len(items))
            for entry in entries:
                item = await self._accept(entry, stats, lags)
                if item is not None:
                    items.append(item)
            if not entries and self._timed_out(started):
                if items:
                    break
                raise BatchSourceExhausted(f"no samples arrived for {self.max_wait_s}s")
        self.batches_served += 1
        self.totals.update(stats)
        out = {f"pipeline/{k}": float(v) for k, v in stats.items()}
        out["pipeline/wait_seconds"] = time.monotonic() - started
        if lags:
            out["pipeline/lag_mean"] = sum(lags) / len(lags)
            out["pipeline/lag_max"] = float(max(lags))
        return SAWBatch(items=items, stats=out)

    async def commit(self) -> int:
        """Ack every entry read so far (their step is done); returns how many were pending."""
        entries, self._uncommitted = self._uncommitted, []
        try:
            return await self.stream.commit(entries, step=self.batches_served)
        except BaseException:
            self._uncommitted = entries + self._uncommitted
            raise

    def state_dict(self) -> JSON:
        return {"uncommitted": [list(pair) for pair in self._uncommitted]}

    def load_state_dict(self, state: JSON) -> None:
        """Resume from a checkpoint: its uncommitted entries are in its weights, so ack them
        before replaying what is still pending."""
        self._ack_on_start = [(str(e), str(s)) for e, s in state.get("uncommitted", [])]
        self._recovered = False

    async def aclose(self) -> None:
        await self.stream.aclose()

    # -- internals ----------------------------------------------------------------------------

    async def _recover(self) -> None:
        await self.stream.ensure_group()
        if self._ack_on_start:
            done = await self.stream.commit(self._ack_on_start, step=self.batches_served)
            logger.info("acked %d entries already trained on before the checkpoint", done)
            self._ack_on_start = []
        after = "0"
        while entries := await self.stream.read_pending(self.consumer, after=after, count=512):
            self._replay.extend(entries)
            after = entries[-1].entry_id
        self._replay.extend(
            await self.stream.claim_idle(
                self.consumer, min_idle_ms=self.claim_min_idle_ms, count=512
            )
        )
        if self._replay:
            logger.info("replaying %d entries left uncommitted by a crash", len(self._replay))
        self.totals["redelivered"] += len(self._replay)
        self._recovered = True

    async def _next_entries(self, count: int) -> list[StreamEntry]:
        if self._replay:
            return [self._replay.popleft() for _ in range(min(count, len(self._replay)))]
        failures = self.stream.reconnect_attempts
        entries = await self.stream.read(self.consumer, count=count, block_ms=self.block_ms)
        if self.stream.reconnect_attempts != failures:
            await self._take_back_lost_deliveries(entries)
        return entries

    async def _take_back_lost_deliveries(self, just_read: list[StreamEntry]) -> None:
        """A read retried after a connection failure may have been served by redis with the
        reply lost: its entries now sit in this consumer's pending list and `>` never returns
        them again. Queue every pending entry this source does not already hold."""
        held = {entry_id for entry_id, _ in self._uncommitted}
        held.update(e.entry_id for e in just_read)
        held.update(e.entry_id for e in self._replay)
        after, lost = "0", []
        while pending := await self.stream.read_pending(self.consumer, after=after, count=512):
            lost += [e for e in pending if e.entry_id not in held]
            after = pending[-1].entry_id
        if lost:
            logger.warning("taking back %d entries whose delivery reply was lost", len(lost))
            self._replay.extend(lost)
            self.totals["redelivered"] += len(lost)

    async def _accept(
        self, entry: StreamEntry, stats: Counter[str], lags: list[int]
    ) -> SAWItem | None:
        if entry.fields is None:
            self._uncommitted.append((entry.entry_id, f"trimmed:{entry.entry_id}"))
            stats["trimmed"] += 1
            return None
        try:
            decoded = decode_sample(entry.fields)
        except PayloadError as e:
            logger.error("dead-lettering undecodable entry %s: %s", entry.entry_id, e)
            self._uncommitted.append((entry.entry_id, f"invalid:{entry.entry_id}"))
            await self.stream.dead_letter(entry, str(e))
            stats["invalid"] += 1
            return None
        if decoded.sample_id in self._seen:
            self._uncommitted.append((entry.entry_id, f"duplicate:{decoded.sample_id}"))
            stats["duplicates"] += 1
            return None
        self._uncommitted.append((entry.entry_id, decoded.sample_id))
        self._remember(decoded.sample_id)
        stats["samples"] += 1
        return self._apply_staleness(decoded.item, stats, lags)

    def _apply_staleness(
        self, item: SAWItem, stats: Counter[str], lags: list[int]
    ) -> SAWItem | None:
        if not item.policy_versions:
            return item
        lag = self.current_version() - min(item.policy_versions)
        lags.append(lag)
        if self.max_lag is None or lag <= self.max_lag:
            return item
        if self.stale == "drop":
            stats["dropped_stale"] += 1
            return None
        stats["downweighted"] += 1
        factor = self.stale_decay ** (lag - self.max_lag)
        meta = {**item.meta, "stale_weight_factor": factor}
        return dataclasses.replace(item, weight=item.weight * factor, meta=meta)

    def _remember(self, sample_id: str) -> None:
        self._seen[sample_id] = None
        if len(self._seen) > self.dedupe_window:
            self._seen.popitem(last=False)

    def _timed_out(self, started: float) -> bool:
        return self.max_wait_s is not None and time.monotonic() - started >= self.max_wait_s
