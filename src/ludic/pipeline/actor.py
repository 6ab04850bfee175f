"""`PipelineActor`: generates rollouts with the currently served policy and pushes every
training sample to the Redis stream, tagged with the policy version(s) that produced it.

A batch is one `generate_batch` call (requests -> rollouts -> credit -> samples), so group
baselines (GRPO) are computed here, before the samples leave. The stream never holds more than
`max_backlog` undelivered samples (a batch larger than that is pushed alone into a drained
stream), whatever the number of actors: a batch is pushed in one atomic step only where it fits
(`stream_push`), and before generating one the actor waits until a batch as large as its last
would fit. This bounds both Redis memory and how stale queued samples can get. Batch indices (which pick the env and sampling seeds and
name the sample ids) come from a counter in Redis per actor id, so a restarted actor continues
its seed sequence and actors sharing an id split it. Every sample carries the run id it is given
(`ludic.pipeline.run_check`), so a learner dead-letters another run's samples on its stream, and
it refuses to start on a stream whose newest samples are another run's (`stream_runs`). It does
not train or publish weights; the policy it samples from is whatever its ChatClient serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass

from ludic._aio import maybe_await
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.credit_check import CREDIT_KEY
from ludic.pipeline.run_check import MAX_RUN_ID, RUN_KEY
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.stream_push import push_within
from ludic.pipeline.stream_runs import refuse_another_run, refuse_live_learner_run
from ludic.rollouts import (
    CreditAssigner,
    RequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SampleFilter,
    SampleMode,
    SeedSequencer,
    SnapshotPolicy,
    distinct_request_ids,
    every_episode_failed,
    generate_batch,
)
from ludic.types import JSON

logger = logging.getLogger(__name__)
RequestsFn = Callable[[], Sequence[RolloutRequest] | Awaitable[Sequence[RolloutRequest]]]


@dataclass(frozen=True, kw_only=True, slots=True)
class ActorBatchStats:
    """What one actor batch produced and how long it waited for the learner. `mean_reward`
    averages the successful episodes (`BatchStats`): 0.0 when every episode failed, a reward
    none earned, which `to_dict` (the `--metrics-path` record) writes as null."""

    batch_index: int
    num_rollouts: int
    num_failed: int
    num_samples: int
    mean_reward: float
    policy_version_min: int | None
    policy_version_max: int | None
    backpressure_seconds: float
    generate_seconds: float

    @property
    def every_episode_failed(self) -> bool:
        """The rule `ludic plot` gaps a reward by (`ludic.rollouts.every_episode_failed`)."""
        return every_episode_failed(asdict(self), prefix="")

    def to_dict(self) -> JSON:
        record: JSON = asdict(self)
        if self.every_episode_failed:
            record["mean_reward"] = None
        return record


class PipelineActor:
    """Runs batches of episodes on `engine` and XADDs their samples to `stream`.

    `requests_fn`, `strategy`, `credit_assigner`, `filters`, `seed_sequencer`, `sample_mode`
    and `snapshot_policy` mean what they mean for `RolloutBatchSource`. While the backlog has no
    room (`max_backlog`) the actor logs that it waits, and why, every `wait_notice_s`, and
    `waiting_for_room` is True. Sample ids are
    `<actor_id>:<batch>:<index>`; each batch index is reserved in Redis before the batch is
    generated, so a restart (or another actor with the same id) never reuses a batch's seeds or
    ids; a batch that crashed midway is skipped, not redone. `credit_record` (see
    `ludic.pipeline.credit_check`) is stamped into every sample's meta, so the learner can
    refuse samples credited by another preset than it trains. `run_id` (`run_id_for` of the
    run's settings; the same for every actor of the run and across restarts) is stamped into
    every sample's meta, so a learner dead-letters another run's samples; None stamps none (the
    learner cannot tell this actor's run); `run_id_origin` says where it comes from in the
    line that names it. Before the first batch, a stream whose live learner
    trains another run, or whose newest samples are all another run's, is refused
    (`stream_runs`); `check_stream_run=False` skips the second (`ludic actor --run-id`: a run
    named on purpose, whose learner is told it too), never the first, which is made again
    before each batch is pushed (a learner of another run started after this actor).
    """

    def __init__(
        self,
        *,
        engine: RolloutEngine,
        stream: SampleStream,
        requests_fn: RequestsFn,
        credit_assigner: CreditAssigner,
        strategy: RequestStrategy | None = None,
        filters: Sequence[SampleFilter] = (),
        seed_sequencer: SeedSequencer | None = None,
        sample_mode: SampleMode = "turn",
        snapshot_policy: SnapshotPolicy = "share",
        max_backlog: int = 256,
        actor_id: str = "actor",
        poll_s: float = 0.1,
        wait_notice_s: float = 60.0,
        credit_record: JSON | None = None,
        run_id: str | None = None,
        run_id_origin: str = "the run id it was given",
        check_stream_run: bool = True,
    ) -> None:
        if max_backlog < 1:
            raise ValueError(f"max_backlog must be >= 1, got {max_backlog}")
        self.engine = engine
        self.stream = stream
        self.requests_fn = requests_fn
        self.credit_assigner = credit_assigner
        self.strategy = strategy
        self.filters = tuple(filters)
        self.seed_sequencer = seed_sequencer
        self.sample_mode: SampleMode = sample_mode
        self.snapshot_policy: SnapshotPolicy = snapshot_policy
        self.max_backlog = max_backlog
        if not actor_id or ":" in actor_id:
            raise ValueError(f"actor_id must be a non-empty name without ':', got {actor_id!r}")
        self.actor_id = actor_id
        self.poll_s = poll_s
        self.wait_notice_s = wait_notice_s
        self.credit_record = credit_record
        if run_id is not None and not (isinstance(run_id, str) and 0 < len(run_id) <= MAX_RUN_ID):
            raise ValueError(
                f"run_id must be a string of 1-{MAX_RUN_ID} characters, got {run_id!r}"
            )
        self.run_id = run_id
        self.run_id_origin = run_id_origin
        self._said_run = run_id is None
        self.check_stream_run = check_stream_run
        self._checked_stream = run_id is None
        self.batch_index = -1  # the last batch generated (-1: none yet)
        self.samples_pushed = 0
        self.waiting_for_room = False
        self._last_batch = 1  # samples of the last batch: the room waited for before the next
        self._warned_past_backlog = False

    async def step(self) -> ActorBatchStats:
        """Wait for room in the stream, generate one batch and push its samples. Before the
        first batch, a stream whose live learner trains another run, or whose newest stamped
        sample is of another run, is refused (`stream_runs`): a learner would train one of the
        two runs and dead-letter the other. Before each push the live learner's run is read
        again (one Redis read a batch), so a learner of another run started since stops the
        actor before it pushes samples that learner would dead-letter."""
        if not self._checked_stream and self.run_id is not None:
            await refuse_live_learner_run(self.stream, run_id=self.run_id, actor_id=self.actor_id)
            if self.check_stream_run:
                await refuse_another_run(self.stream, run_id=self.run_id, actor_id=self.actor_id)
            self._checked_stream = True
        waited = await self._wait_for_room(self._last_batch)
        started = time.perf_counter()
        self.batch_index = await self.stream.next_actor_batch(self.actor_id, after=self.batch_index)
        requests = list(await maybe_await(self.requests_fn()))
        if self.seed_sequencer is not None:
            requests = self.seed_sequencer.seed_requests(requests, self.batch_index)
        requests = distinct_request_ids(requests)  # [problem] * 4: four problems, four groups
        result = await generate_batch(
            self.engine,
            requests,
            self.credit_assigner,
            filters=self.filters,
            strategy=self.strategy,
            sample_mode=self.sample_mode,
            snapshot_policy=self.snapshot_policy,
        )
        generated = time.perf_counter() - started
        versions = [v for s in result.samples for v in s.policy_versions]
        if not self._said_run:
            self._said_run = True
            logger.info(
                "actor %r stamps its samples with run id %s (%s; a learner dead-letters samples "
                "of another run)",
                self.actor_id,
                self.run_id,
                self.run_id_origin,
            )
        entries = []
        for i, sample in enumerate(result.samples):
            meta = {**sample.meta, "actor_id": self.actor_id, "actor_batch": self.batch_index}
            if self.credit_record is not None:
                meta[CREDIT_KEY] = self.credit_record
            if self.run_id is not None:
                meta[RUN_KEY] = self.run_id
            tagged = dataclasses.replace(sample, meta=meta)
            sample_id = f"{self.actor_id}:{self.batch_index}:{i}"
            entries.append((sample_id, encode_sample(tagged, sample_id=sample_id)))
        if self.run_id is not None:  # a learner of another run may have started since
            await refuse_live_learner_run(
                self.stream, run_id=self.run_id, actor_id=self.actor_id, batch=self.batch_index
            )
        waited += await self._push(entries)
        self.samples_pushed += len(result.samples)
        self._last_batch = max(1, len(result.samples))
        self._warn_batch_past_backlog(len(result.samples))
        stats = ActorBatchStats(
            batch_index=self.batch_index,
            num_rollouts=result.stats.num_rollouts,
            num_failed=result.stats.num_failed,
            num_samples=len(result.samples),
            mean_reward=result.stats.mean_reward,
            policy_version_min=min(versions) if versions else None,
            policy_version_max=max(versions) if versions else None,
            backpressure_seconds=waited,
            generate_seconds=generated,
        )
        return stats

    async def run(
        self, num_batches: int | None = None, *, stop: asyncio.Event | None = None
    ) -> list[ActorBatchStats]:
        """Run `num_batches` batches (None: until `stop` is set or the task is cancelled)."""
        await self.stream.ensure_group()
        history: list[ActorBatchStats] = []
        while num_batches is None or len(history) < num_batches:
            if stop is not None and stop.is_set():
                break
            stats = await self.step()
            history.append(stats)
            logger.info("actor %r batch %d: %s", self.actor_id, stats.batch_index, stats)
        return history

    def _warn_batch_past_backlog(self, samples: int) -> None:
        """Say once that batches are larger than the backlog: each then waits for a drained
        stream, so actor and learner take turns instead of overlapping (the pipeline's point)."""
        if samples <= self.max_backlog or self._warned_past_backlog:
            return
        self._warned_past_backlog = True
        logger.warning(
            "batch %d of actor %r holds %d samples, more than max_backlog (--max-backlog) %d: a "
            "batch that large is pushed only into a drained stream and the next one starts only "
            "once a learner has read it all, so this actor and the learner take turns instead of "
            "working at once. Make batches smaller (--problems-per-batch, --group-size) or raise "
            "--max-backlog to %d (two such batches; samples age while they wait in it, so keep "
            "it within what the learner's --max-lag allows)",
            self.batch_index,
            self.actor_id,
            samples,
            self.max_backlog,
            2 * samples,
        )

    async def _wait_for_room(self, need: int) -> float:
        """Before a batch: wait while `need` more samples (the last batch's) would not fit in
        the backlog, saying so when the wait starts and every `wait_notice_s` after (a stream
        nobody reads would otherwise stall the actor silently)."""
        started, noticed = time.perf_counter(), -math.inf
        group = self.stream.group
        then = f"the next batch starts once a learner of group {group!r} reads them"
        if need > self.max_backlog:  # it goes only into a drained stream: say why it waits
            then = (
                f"the last batch held {need} samples, more than --max-backlog alone, so the "
                f"next starts once a learner of group {group!r} has read them all (raise "
                f"--max-backlog to about twice the batch, {2 * need}, to generate while the "
                "learner trains)"
            )
        while (backlog := await self.stream.backlog()) > 0 and backlog + need > self.max_backlog:
            noticed = self._notice_wait(started, noticed, backlog, then)
            await asyncio.sleep(self.poll_s)
        self.waiting_for_room = False
        return time.perf_counter() - started

    async def _push(self, entries: list[tuple[str, dict[bytes, bytes]]]) -> float:
        """Push a generated batch once it fits in the backlog (other actors may have filled it
        since `_wait_for_room`); returns how long it waited."""
        started, noticed = time.perf_counter(), -math.inf
        while True:
            pushed, backlog = await push_within(self.stream, entries, max_backlog=self.max_backlog)
            if pushed:
                self.waiting_for_room = False
                return time.perf_counter() - started
            what = (
                f"its batch of {len(entries)} samples is pushed once a learner of group "
                f"{self.stream.group!r} reads them"
            )
            noticed = self._notice_wait(started, noticed, backlog, what)
            await asyncio.sleep(self.poll_s)

    def _notice_wait(self, started: float, noticed: float, backlog: int, then: str) -> float:
        """Log that the actor waits for room (when the wait starts, then every
        `wait_notice_s`); returns when it last said so."""
        self.waiting_for_room = True
        now = time.perf_counter()
        if now - noticed < self.wait_notice_s:
            return noticed
        logger.info(
            "actor %r waits for the learner (%.0fs so far): stream %r holds %d undelivered "
            "samples, max_backlog (--max-backlog) is %d; %s",
            self.actor_id,
            now - started,
            self.stream.stream,
            backlog,
            self.max_backlog,
            then,
        )
        return now
