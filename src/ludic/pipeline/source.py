"""`PipelineBatchSource`: the learner's side of the Redis pipeline, a Trainer `BatchSource`.

Each of N data-parallel learner ranks reads through the stream's consumer group under its own
consumer name (`<consumer>-r<rank>`), so the group hands every entry to exactly one rank. With
`ack="checkpoint"` (the default) an entry is acked (XACK + XDEL, ledgered) only once a
checkpoint holding the update trained on it is durable: `state_dict()` (which the Trainer calls
while checkpointing) lists the entries trained since the last ack, and the next `next_batch()`
(the checkpoint is written by then) acks them. A restart from that checkpoint acks the listed
entries again (a no-op if done), then replays its own consumer's pending entries: exactly the
ones read after the checkpoint. Rank 0 then claims the entries of consumers that are not ranks of
this run (an earlier run's extra ranks at once, unknown names once idle `claim_min_idle_ms`);
it never touches a live sibling's (what is taken back: `ludic.pipeline.recovery`). `ack="step"`
acks after every step (without checkpoints). Stale samples (more than `max_lag` versions
behind `current_version()`) are dropped or down-weighted and counted, the samples of versions a
resume discarded dropped and counted (`ludic.pipeline.versions`), undecodable entries and
samples of another run than the learner's (`ludic.pipeline.run_check`) are dead-lettered,
repeated sample ids (XADD retries) are skipped. It does not generate rollouts or train.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Literal

from ludic.pipeline import recovery
from ludic.pipeline.codec import PayloadError, decode_sample
from ludic.pipeline.lease import ConsumerLease
from ludic.pipeline.run_check import RunCheck, foreign_note
from ludic.pipeline.source_checks import check_source_settings
from ludic.pipeline.source_stale import Staleness, StalePolicy
from ludic.pipeline.stream import SampleStream, StreamEntry
from ludic.pipeline.versions import dead_branch_note
from ludic.rollouts.samples import SAWItem
from ludic.training.batching.types import BatchSourceExhausted, SAWBatch
from ludic.types import JSON

logger = logging.getLogger(__name__)
AckPolicy = Literal["checkpoint", "step"]
Pair = tuple[str, str]  # (entry id, sample id)
_STATE_FORMAT = 2


class PipelineBatchSource:
    """Batches of `batch_size` samples from `stream` for one learner rank.

    - `consumer`: the learner job's name in the group; this rank reads as
      `<consumer>-r<rank>`. Keep it across restarts. `rank`, `world_size`: this rank among the
      data-parallel learners (default: torchrun's RANK and WORLD_SIZE, else 0 of 1).
    - `ack`: "checkpoint" acks entries once a checkpoint holding them is saved (exactly once
      with checkpoints; without any checkpoint nothing is acked, and a warning says so after
      `warn_unacked` entries); "step" acks after each step (a restart from an older
      checkpoint then misses what was acked since).
    - `max_lag`, `current_version`: a sample whose oldest token is more than `max_lag`
      versions behind `current_version()` (the trainer's policy version) is stale. `stale`:
      "drop" it, or "downweight" its weight by `stale_decay ** (lag - max_lag)`. Samples
      without recorded versions are never stale. With "downweight", leave the Trainer's own
      `TrainerConfig.max_lag` at None (it would drop them). A batch's `pipeline/lag_mean`
      and `pipeline/lag_max` describe the samples it serves (dropped ones are only counted,
      in `pipeline/dropped_stale`, and ones newer than the learner in `pipeline/ahead`), so
      with "drop" `lag_max` never exceeds `max_lag` and is never negative.
    - `block_ms`: one wait on Redis; `max_wait_s`: after this long without a full batch,
      return what arrived; if nothing did, raise BatchSourceExhausted with one rank, or
      return an empty batch and set `timed_out` (and `timed_out_dropped`, the stale samples
      that wait dropped) with several (a rank that raised would leave the others waiting in a
      collective; the learner all-reduces both and stops with `exhausted_line`). None: wait
      forever.
    - `wait_notice_s`: while a batch is not full, a warning every this many seconds says how
      many samples it has and why it may lack the rest (none arrive, or they arrive stale).
    - `claim_min_idle_ms`: entries of an unknown consumer idle this long are taken over by
      rank 0 at startup, unless a live learner holds that consumer's lease.
    - `lease_ttl_s`: each rank holds a lease on its consumer name (`ConsumerLease`, taken by
      `hold_lease()` or the first `next_batch()`), so a second learner under the same name is
      refused instead of training the same samples; a killed learner's lease is free after
      this long. None: no lease (the caller guarantees one reader per name). Rank 0's lease
      also publishes the run it trains, for actors of another run to refuse.
    - `check_sample`: called on each decoded sample before it is accepted (the learner's
      `CreditCheck`); an exception it raises stops the read, leaving the entry unacked. If it
      has `state_dict()` / `load_state_dict(state)`, its state travels in checkpoints (under
      "check"), so a resumed learner keeps checking against what it trained on before.

    The run of the first sample that carries a run id is this learner's (`run_check`, kept in
    checkpoints under "run"; `run_id` names it from the start, over a checkpoint's); a sample of another run is dead-lettered, counted as
    `pipeline/foreign_run`, and the first of each such run logged with both runs and the fix.
    """

    def __init__(
        self,
        stream: SampleStream,
        *,
        batch_size: int,
        consumer: str = "learner",
        rank: int | None = None,
        world_size: int | None = None,
        ack: AckPolicy = "checkpoint",
        max_lag: int | None = None,
        stale: StalePolicy = "drop",
        stale_decay: float = 0.5,
        current_version: Callable[[], int] | None = None,
        block_ms: int = 1000,
        max_wait_s: float | None = None,
        claim_min_idle_ms: int = 60_000,
        dedupe_window: int = 100_000,
        warn_unacked: int = 10_000,
        wait_notice_s: float = 60.0,
        check_sample: Callable[[SAWItem], None] | None = None,
        lease_ttl_s: float | None = 15.0,
        run_id: str | None = None,
    ) -> None:
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
        check_source_settings(batch_size, stale, stale_decay, max_lag, current_version, ack)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got {rank} of {world_size}")
        if not consumer:
            raise ValueError("consumer must be a non-empty name")
        self.stream = stream
        self.batch_size = batch_size
        self.consumer = consumer
        self.rank, self.world_size = rank, world_size
        self.consumer_name = recovery.rank_name(consumer, rank)
        self.ack: AckPolicy = ack
        self.staleness = Staleness(
            max_lag=max_lag,
            stale=stale,
            stale_decay=stale_decay,
            current_version=current_version or (lambda: 0),
        )
        self.block_ms = block_ms
        self.max_wait_s = max_wait_s
        self.claim_min_idle_ms = claim_min_idle_ms
        self.dedupe_window = dedupe_window
        self.warn_unacked = warn_unacked
        self.wait_notice_s = wait_notice_s
        self.check_sample = check_sample
        self.run_id = run_id
        # under torchrun every rank says what it alone did, so its lines name it
        self.who = f"learner rank {rank}" if world_size > 1 else "this learner"
        self.run_check = RunCheck(stream=stream.stream, run=run_id, who=self.who)
        if run_id is not None and rank == 0:
            logger.info(
                "this learner trains run %s (--run-id); samples of other runs on stream %r are "
                "dead-lettered",
                run_id,
                stream.stream,
            )
        self.lease_ttl_s = lease_ttl_s
        self._lease: ConsumerLease | None = None
        self._published_run: str | None = None
        # called once, at the first sample of a run this source reads, with its pinned run
        # (None: unstamped): a fresh learner that did not know its run decides its version
        # numbering then, before that sample's lag (`ludic.pipeline.learner_run.fork_versions`)
        self.on_first_sample: Callable[[str | None], None] | None = None
        self.batches_served = 0
        self.timed_out = False
        self.timed_out_dropped = 0  # stale samples the timed-out wait read and dropped
        self.totals: Counter[str] = Counter()
        self._trained: list[Pair] = []  # served in batches, not yet in a checkpoint's state
        self._captured: list[Pair] = []  # in the state of the last checkpoint, not yet acked
        self._captured_at: int | None = None  # batches served when that state was taken
        self._resume: JSON | None = None
        self._replay: deque[StreamEntry] = deque()
        self._recovered = False
        self._warned_unacked = False
        self._warned_repeat = False
        self._seen: OrderedDict[str, None] = OrderedDict()

    # -- BatchSource ----------------------------------------------------------------------

    async def next_batch(self) -> SAWBatch:
        self._check_lease()
        if not self._recovered:
            await self._recover()
        elif self.ack == "step":
            await self.commit()
        else:
            await self.ack_checkpointed()
        self._warn_if_unacked()
        stats: Counter[str] = Counter()
        items: list[SAWItem] = []
        lags: list[int] = []
        started = noticed = time.monotonic()
        self.timed_out, self.timed_out_dropped = False, 0
        while len(items) < self.batch_size:
            entries = await self._next_entries(self.batch_size - len(items))
            for entry in entries:
                item = await self._accept(entry, stats, lags)
                if item is not None:
                    items.append(item)
            # only while it waits: a batch that filled on a slow read says nothing
            full = len(items) >= self.batch_size
            if not full and time.monotonic() - noticed >= self.wait_notice_s:
                noticed = time.monotonic()
                logger.warning(self._waiting_line(len(items), started, stats))
            if not entries and self._timed_out(started):
                if items:
                    break
                if self.world_size == 1:  # counted first: the closing line names the drops
                    self.totals.update(stats)
                    line = self.exhausted_line(stats["dropped_stale"])
                    notes = dead_branch_note(stats["dead_branch"])
                    raise BatchSourceExhausted(line + notes + foreign_note(stats["foreign_run"]))
                self.timed_out, self.timed_out_dropped = True, stats["dropped_stale"]
                stats["timed_out"] += 1
                break
        self.batches_served += 1
        self.totals.update(stats)
        await self._publish_run()
        out = {f"pipeline/{k}": float(v) for k, v in stats.items()}
        out["pipeline/wait_seconds"] = time.monotonic() - started
        out["pipeline/unacked"] = float(len(self._trained) + len(self._captured))
        if lags:
            out["pipeline/lag_mean"] = sum(lags) / len(lags)
            out["pipeline/lag_max"] = float(max(lags))
        return SAWBatch(items=items, stats=out)

    async def commit(self) -> int:
        """Ack every entry served so far (their steps are done, checkpointed or not); returns
        how many were pending. For `ack="step"` or a loop that manages acks itself."""
        pairs = self._captured + self._trained
        done = await self._ack(pairs, step=self.batches_served)
        self._captured, self._trained, self._captured_at = [], [], None
        return done

    async def ack_checkpointed(self) -> int:
        """Ack the entries listed by the last `state_dict()`: call it once the checkpoint that
        holds that state is durable (`next_batch` does, with `ack="checkpoint"`)."""
        if self._captured_at is None:
            return 0
        done = await self._ack(self._captured, step=self._captured_at)
        self._captured, self._captured_at = [], None
        return done

    def state_dict(self) -> JSON:
        """This rank's data position for a checkpoint: the entries trained since the last ack
        (the checkpoint holds their updates), acked by the next `next_batch()` (a failed save
        raises out of the Trainer on every rank, so no next batch is drawn). Before the first
        batch after `load_state_dict` it is the restored position unchanged (its entries may
        still be pending, and its ranks may differ from this run's), and nothing is acked."""
        if self._resume is not None:
            return {**self._resume, "forks": self.staleness.forks.state_dict()}
        self._captured += self._trained
        self._trained = []
        self._captured_at = self.batches_served
        return {
            "format": _STATE_FORMAT,
            "consumer": self.consumer,
            "rank": self.rank,
            "world_size": self.world_size,
            "batches_served": self.batches_served,
            "trained": [list(pair) for pair in self._captured],
            "check": getattr(self.check_sample, "state_dict", lambda: None)(),
            "run": self.run_check.state_dict(),
            "forks": self.staleness.forks.state_dict(),
        }

    def load_state_dict(self, state: JSON) -> None:
        """Resume from a checkpoint: the entries it lists are acked first, then this rank
        replays what its consumer read after the checkpoint. Whatever this source held is
        dropped (training continues from the checkpoint's weights)."""
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(
                f"this checkpoint's data position is not a pipeline source's (format "
                f"{state.get('format')!r}, expected {_STATE_FORMAT}): resume it with the batch "
                "source that wrote it"
            )
        if state["consumer"] != self.consumer:
            raise ValueError(
                f"the checkpoint was trained by consumer {state['consumer']!r} of the group, "
                f"this learner is {self.consumer!r}: resume with --consumer {state['consumer']}"
            )
        load_check = getattr(self.check_sample, "load_state_dict", None)
        if load_check is not None and state.get("check") is not None:
            load_check(state["check"])
        self.run_check = RunCheck(stream=self.stream.stream, run=self.run_id, who=self.who)
        self.run_check.load_state_dict(state.get("run"))  # None: saved before run ids
        self.staleness.forks.load_state_dict(state.get("forks"))  # None: saved before forks
        self._resume = state
        self.batches_served = int(state["batches_served"])
        self._trained, self._captured, self._captured_at = [], [], None
        self._replay.clear()
        self._seen.clear()
        self._recovered = False

    async def hold_lease(self) -> None:
        """Take this rank's lease on its consumer name (waiting up to one ttl for a killed
        holder's to expire); raises ConsumerInUseError if a live learner holds it."""
        if self.lease_ttl_s is None or self._lease is not None:
            return
        lease = ConsumerLease(
            self.stream.url,
            stream=self.stream.stream,
            group=self.stream.group,
            consumer=self.consumer_name,
            ttl_s=self.lease_ttl_s,
        )
        try:
            await asyncio.to_thread(lease.acquire)
        except BaseException:
            lease.release()
            raise
        self._lease = lease
        await self._publish_run()

    async def aclose(self) -> None:
        """Release the lease and close the stream."""
        lease, self._lease = self._lease, None
        try:
            if lease is not None:
                await asyncio.to_thread(lease.release)
        finally:
            await self.stream.aclose()

    # -- acks and recovery (what is taken back: ludic.pipeline.recovery) ----------------

    async def _ack(self, pairs: list[Pair], *, step: int) -> int:
        """Ack `pairs` and record that this consumer acked everything it trained up to `step`."""
        if self._lease is not None:  # another learner may be training these: never ack for it
            await asyncio.to_thread(self._lease.confirm)
        done = await self.stream.commit(pairs, step=step, consumer=self.consumer_name)
        self._warned_unacked = False
        return done

    def _warn_if_unacked(self) -> None:
        if self.ack != "checkpoint" or self._warned_unacked:
            return
        if len(self._trained) >= self.warn_unacked:
            logger.warning(
                "%d samples trained since the last checkpoint are not acknowledged: with "
                "ack='checkpoint' entries are acked once a checkpoint holds them. Checkpoint "
                "(TrainerConfig.checkpoint, --checkpoint-every) or use ack='step'",
                len(self._trained),
            )
            self._warned_unacked = True

    def _check_lease(self) -> None:
        if self._lease is not None:
            self._lease.check()

    async def _recover(self) -> None:
        await self.stream.ensure_group()
        await self.hold_lease()
        resume = self._resume
        if resume is not None:
            await recovery.check_world(
                self.stream,
                resume,
                consumer=self.consumer,
                rank=self.rank,
                world_size=self.world_size,
            )
            pairs = [(str(e), str(s)) for e, s in resume["trained"]]
            self._check_lease()
            done = await self.stream.commit(
                pairs, step=self.batches_served, consumer=self.consumer_name
            )
            logger.info("%s acked %d entries the checkpoint already holds", self.who, done)
            self._resume = None  # only now does a checkpoint no longer need to list them
        self._replay.extend(await recovery.read_pending(self.stream, self.consumer_name))
        if self.rank == 0:
            self._replay.extend(
                await recovery.claim_orphans(
                    self.stream,
                    consumer=self.consumer,
                    world_size=self.world_size,
                    claimant=self.consumer_name,
                    min_idle_ms=self.claim_min_idle_ms,
                )
            )
        if self._replay:
            logger.info(
                "%s replays %d entries read but not checkpointed", self.who, len(self._replay)
            )
        self.totals["redelivered"] += len(self._replay)
        self._recovered = True
        await self._publish_run()

    async def _publish_run(self) -> None:
        """Rank 0 publishes the run this learner trains, once known and whenever it changes,
        through its lease (`ConsumerLease.publish_run`): an actor of another run then refuses
        to start while this learner lives, also once the stream is drained."""
        run = self.run_check.run
        if self.rank != 0 or self._lease is None or run is None or run == self._published_run:
            return
        await asyncio.to_thread(self._lease.publish_run, run)
        self._published_run = run

    async def _next_entries(self, count: int) -> list[StreamEntry]:
        if self._replay:
            return [self._replay.popleft() for _ in range(min(count, len(self._replay)))]
        failures = self.stream.reconnect_attempts
        entries = await self.stream.read(self.consumer_name, count=count, block_ms=self.block_ms)
        if self.stream.reconnect_attempts != failures:  # a lost reply may have left entries
            held = {entry_id for entry_id, _ in self._trained + self._captured}
            held.update(e.entry_id for e in entries)
            held.update(e.entry_id for e in self._replay)
            lost = await recovery.lost_deliveries(self.stream, self.consumer_name, held)
            self._replay.extend(lost)
            self.totals["redelivered"] += len(lost)
        return entries

    async def _accept(
        self, entry: StreamEntry, stats: Counter[str], lags: list[int]
    ) -> SAWItem | None:
        if entry.fields is None:
            logger.warning(
                "entry %s was trimmed from the stream before it was trained: a sample is lost "
                "(raise the actors' --max-stream-len, or checkpoint more often)",
                entry.entry_id,
            )
            self._trained.append((entry.entry_id, f"trimmed:{entry.entry_id}"))
            stats["trimmed"] += 1
            return None
        try:
            decoded = decode_sample(entry.fields)
        except PayloadError as e:
            self._trained.append((entry.entry_id, f"invalid:{entry.entry_id}"))
            copied = await self.stream.dead_letter(entry, str(e))
            again = "" if copied else " (read again before an ack: copied there once already)"
            logger.error("dead-lettering undecodable entry %s%s: %s", entry.entry_id, again, e)
            stats["invalid"] += 1
            return None
        foreign = self.run_check.foreign(decoded.item, entry.entry_id)
        if foreign is not None:  # before the credit check: another run may credit otherwise
            described = self.run_check.describe_foreign(decoded.item, entry.entry_id)
            if described is not None:
                logger.error(described)
            self._trained.append((entry.entry_id, f"foreign:{entry.entry_id}"))
            await self.stream.dead_letter(entry, f"a sample of another run: {foreign}")
            stats["foreign_run"] += 1
            return None
        if self.on_first_sample is not None:
            decide, self.on_first_sample = self.on_first_sample, None
            decide(self.run_check.run)
        if self.check_sample is not None:  # raising leaves the entry pending, for a fixed learner
            self.check_sample(decoded.item)
        if decoded.sample_id in self._seen:
            self._trained.append((entry.entry_id, f"duplicate:{decoded.sample_id}"))
            stats["duplicates"] += 1
            if not self._warned_repeat:  # once: an actor restarted after a Redis data loss
                self._warned_repeat = True  # repeats every id it had pushed before
                logger.warning(recovery.repeated_id(self.who, entry.entry_id, decoded.sample_id))
            return None
        self._trained.append((entry.entry_id, decoded.sample_id))
        self._remember(decoded.sample_id)
        stats["samples"] += 1
        return self.staleness.apply(decoded.item, stats, lags)

    def _remember(self, sample_id: str) -> None:
        self._seen[sample_id] = None
        if len(self._seen) > self.dedupe_window:
            self._seen.popitem(last=False)

    def _waiting_line(self, have: int, started: float, stats: Counter[str]) -> str:
        """Why this batch is not full yet, as far as this rank can tell."""
        line = (
            f"learner rank {self.rank} has {have} of {self.batch_size} samples for its next step "
            f"after {time.monotonic() - started:.0f}s on stream {self.stream.stream!r} (group "
            f"{self.stream.group!r})"
        )
        line += foreign_note(stats["foreign_run"]) + dead_branch_note(stats["dead_branch"])
        if stats["dropped_stale"]:
            return line + self.staleness.waiting_note(stats["dropped_stale"])
        if have or stats["samples"] > stats["dead_branch"]:
            return line + "; the actors push samples slower than this learner trains on them"
        if stats["dead_branch"]:
            return line
        of_its_run = " of its run" if stats["foreign_run"] else ""
        return line + (
            f"; no sample{of_its_run} arrived: is an actor pushing to this stream (`ludic actor "
            "--redis-url ... --stream ...`, the same as the learner's), or is its first batch still "
            "generating (an actor pushes a batch's samples once all its episodes end)?"
        )

    def exhausted_line(self, dropped: int, world_size: int = 1) -> str:
        """Why the learner stops: nothing arrived for `max_wait_s`, or only samples it dropped
        as stale (`dropped`, summed over the `world_size` ranks that all timed out). Other
        samples read meanwhile (duplicates, invalid ones) were no more trainable."""
        ranks = f" on any of the {world_size} ranks" if world_size > 1 else ""
        if not dropped:
            return f"no samples arrived for {self.max_wait_s}s{ranks}"
        return (
            f"no trainable sample arrived for {self.max_wait_s}s{ranks}: "
            + self.staleness.exhausted_note(dropped)
        )

    def _timed_out(self, started: float) -> bool:
        return self.max_wait_s is not None and time.monotonic() - started >= self.max_wait_s
