"""The learner's run once `run_learner` has checked its flags: the stream, a source whose ranks
compare credit records and runs, the model, the `Trainer` (resumed from a checkpoint) and its
step loop, publishing with `BroadcastPolicyPublisher`. It checks no flags (`commands` does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ludic.inference.http.server_wait import wait_for_servers
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.credit_check import CreditCheck
from ludic.pipeline.learner_report import (
    NothingTrainedLearnerError,
    nothing_trained_line,
    report_done,
    report_step,
)
from ludic.pipeline.learner_settings import (
    CHECKPOINTS_DIR,
    LEARNER_SETTINGS_KEY,
    OVERRIDE_LR,
    learner_settings,
)
from ludic.pipeline.lease import refuse_other_learners
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.versions import (
    PublishedRecord,
    RecordingPublisher,
    dead_span,
    published_record,
)
from ludic.recipes.algorithms import make_algorithm as make_preset
from ludic.recipes.inference import server_push_token

logger = logging.getLogger(__name__)


async def learn(cfg: LearnerConfig) -> list[dict[str, float]]:
    """`run_learner` once its flags passed: hold the lease, load the model, train, publish."""
    from ludic.models import load_model, tiny_model_dir
    from ludic.recipes.inference import server_urls

    stream = SampleStream(
        cfg.redis_url,
        stream=cfg.stream,
        group=cfg.group,
        ledger=f"{cfg.stream}:ledger" if cfg.ledger else None,
    )
    try:  # Redis first: a wrong --redis-url fails in seconds, before the model loads
        await stream.ensure_group()
    except BaseException:
        await stream.aclose()
        raise
    trainer: Any = None
    # refuses samples another preset credited, or generated with another dr_grpo budget
    credit_check = CreditCheck(cfg.algorithm, max_tokens=cfg.max_tokens)
    source = _credit_checked_source(
        credit_check,
        stream,
        batch_size=cfg.batch_size,
        consumer=cfg.consumer,
        ack="step" if cfg.checkpoint_every is None else "checkpoint",
        max_lag=cfg.max_lag,
        stale=cfg.stale,
        stale_decay=cfg.stale_decay,
        current_version=lambda: int(trainer.policy_version),
        max_wait_s=cfg.max_wait_s,
        lease_ttl_s=cfg.lease_ttl_s,
        run_id=cfg.run_id,
    )
    credit_check.quiet = source.rank != 0  # under torchrun, rank 0 says it once
    publisher = None
    try:
        # before the model loads: a second learner under this consumer name is refused in
        # seconds (after waiting out a killed holder's lease), not after it read samples
        await source.hold_lease()
        if source.rank == 0 and cfg.lease_ttl_s is not None:  # another job's learner: refused
            await asyncio.to_thread(
                refuse_other_learners,
                cfg.redis_url,
                stream=cfg.stream,
                group=cfg.group,
                consumer=cfg.consumer,
            )
        if cfg.server_url and source.rank == 0:  # one started just before may still be loading
            urls = server_urls(cfg.server_url)
            await wait_for_servers(urls, within_s=cfg.server_wait_s, wait_setting="--server-wait-s")
        model, tokenizer = load_model(cfg.model or tiny_model_dir(), dtype="float32")
        # Only rank 0 pushes; the Trainer gathers the weights on every rank for it.
        publisher = (
            None
            if not cfg.server_url or source.rank != 0
            else _publisher(cfg, model, run=lambda: source.run_check.run)
        )
        trainer = _trainer(cfg, source, model, tokenizer, publisher)
        return await _train(cfg, source, trainer)
    finally:
        if trainer is not None:
            trainer.close()
        if publisher is not None:
            publisher.close()
        await source.aclose()


def _credit_checked_source(credit_check: CreditCheck, stream: SampleStream, **options: Any) -> Any:
    """A `PipelineBatchSource` checking each sample with `credit_check`, whose ranks compare
    their credit records once each batch is read, before the step trains on it: the Trainer
    calls `check_ranks` (a `RankCheckedSource`) on every rank, which runs `say_held`, so rank 0
    says the notices only other ranks' samples showed and every rank refuses alike records
    that differ between ranks (actors whose samples reached only different ranks)."""
    from ludic.pipeline.source import PipelineBatchSource  # torch: loaded when the learner runs

    class CreditCheckedSource(PipelineBatchSource):
        def check_ranks(self, all_gather: Callable[[Any], list[Any]]) -> None:
            runs: list[str | None] = []  # each rank's pinned run, shared in the same gather

            def gather(mine: Any) -> list[Any]:
                shared = all_gather((mine, self.run_check.run))
                runs.extend(run for _, run in shared)
                return [credit for credit, _ in shared]

            credit_check.say_held(gather)
            pinned = {rank: run for rank, run in enumerate(runs) if run is not None}
            if len(set(pinned.values())) > 1:  # every rank sees the same list: all refuse
                named = ", ".join(f"rank {rank} run {run}" for rank, run in pinned.items())
                raise ValueError(
                    f"the learner's ranks read samples of different runs on stream "
                    f"{stream.stream!r} ({named}): each pinned the run of the first sample it "
                    "read, so this step would train two runs at once. Give each run its own "
                    "--stream (restart the other run's actors with another one)"
                )

    return CreditCheckedSource(stream, check_sample=credit_check, **options)


async def _train(cfg: LearnerConfig, source: Any, trainer: Any) -> list[dict[str, float]]:
    """The step loop; step and closing lines count what all ranks trained (the ranks' credit
    records are compared inside each step, before it trains: `_credit_checked_source`).
    Raises NothingTrainedLearnerError on every rank when no step of this launch applied an
    update (the Trainer decides a skip across ranks, so every rank agrees)."""
    from ludic.training import BatchSourceExhausted
    from ludic.training.stall import was_skipped

    runtime = trainer.runtime
    if (runtime.rank, runtime.world_size) != (source.rank, source.world_size):
        raise RuntimeError(
            f"the training runtime is rank {runtime.rank} of {runtime.world_size} but RANK and "
            f"WORLD_SIZE say {source.rank} of {source.world_size}: launch with torchrun"
        )
    history: list[dict[str, float]] = []
    stop: str | None = None  # why the loop ended before --steps
    started_at = trainer.step  # the same on every rank, as the steps that follow
    # the server starts from the learner's weights (resume has published the restored ones;
    # one that decides its versions at its first sample publishes then); every rank calls it
    if trainer.step == 0 and source.on_first_sample is None:
        trainer.publish_weights()
    while trainer.step < cfg.steps:
        try:
            history.append(await trainer.train_step())
        except BatchSourceExhausted as e:  # one rank only: the others would wait in a collective
            stop = str(e)
            logger.info("learner stops: %s", stop)
            break
        stop = report_step(trainer, source, history[-1])
        if stop is not None:  # every rank's batch came back empty
            logger.info("learner stops: %s", stop)
            break
    trained = not all(was_skipped(metrics) for metrics in history)  # the same on every rank
    if trainer.checkpoints is None:
        await source.commit()
    else:  # the last checkpoint must hold every step before its samples are acked
        # not a step this launch only resumed at (kept as saved), nor the unchanged weights of
        # steps that were all skipped (under torchrun, ranks that all timed out skip a step);
        # a checkpoint due on a skipped last step was not written (`Trainer.checkpointed_step`)
        if trained and trainer.step > started_at and trainer.checkpointed_step != trainer.step:
            trainer.save_checkpoint()
        await source.ack_checkpointed()
    totals = report_done(trainer, source, trained=trained)
    if not trained:
        raise NothingTrainedLearnerError(nothing_trained_line(stop, totals, len(history)))
    return history


def _publisher(cfg: LearnerConfig, model: Any, *, run: Callable[[], str | None]) -> Any:
    """The learner's publisher to `--server-url`, recording each version with `run()`, the run
    the learner trains once it knows it."""
    from ludic.distributed import BroadcastPolicyPublisher
    from ludic.recipes.inference import server_urls

    publisher = BroadcastPolicyPublisher(
        server_urls(cfg.server_url),  # several: one broadcast reaches them all
        server_push_token(cfg.token, flag="--token"),  # `run_learner` refused a bad one at once
        backend=cfg.backend,
        bucket_mb=cfg.bucket_mb,
        atol=cfg.verify_atol,
        master_addr=cfg.master_addr,
        server_ranks=cfg.server_ranks,
        probe_model=model,  # the Trainer publishes state dicts: probe with its live model
    )
    return RecordingPublisher(publisher, url=cfg.redis_url, stream=cfg.stream, run=run)


def _trainer(cfg: LearnerConfig, source: Any, model: Any, tokenizer: Any, publisher: Any) -> Any:
    from ludic.training import CheckpointConfig, JsonlLogger, Trainer, TrainerConfig

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = None
    if cfg.checkpoint_every is not None:
        checkpoint = CheckpointConfig(
            dir=str(out / CHECKPOINTS_DIR), every_n_steps=cfg.checkpoint_every, keep_last=2
        )
    config = TrainerConfig(
        lr=cfg.lr,
        seed=cfg.seed,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        micro_batch_tokens=cfg.micro_batch_tokens,
        max_lag=None,  # the source already dropped (or downweighted) stale samples
        publish_every=cfg.publish_every,
        checkpoint=checkpoint,
        device=cfg.device,
    )
    trainer = Trainer(
        model,
        make_preset(cfg.algorithm, max_tokens=cfg.max_tokens),
        source,
        config,
        publisher=publisher,
        logger=JsonlLogger(out / "metrics.jsonl") if source.rank == 0 else None,
        tokenizer=tokenizer,
    )
    trainer.checkpoint_extra[LEARNER_SETTINGS_KEY] = learner_settings(cfg)  # --resume checks it
    if cfg.resume and trainer.checkpoints is not None and trainer.checkpoints.latest():
        step = _resume_learner(trainer, cfg)
        if source.rank == 0:  # the same on every rank: said once
            logger.info("resumed from step %d (policy version %d)", step, trainer.policy_version)
    # a fresh start too: a learner killed before its first checkpoint published versions that
    # this one, back at version 0, would otherwise reach again with other weights
    fork_versions(trainer, source, cfg.redis_url)
    return trainer


def fork_versions(trainer: Any, source: Any, url: str) -> None:
    """Call this in a learner loop of your own on a pipeline stream (`ludic learner` does), once
    the `Trainer` over a `PipelineBatchSource` is built and resumed, before its first step, with
    publishes going through a `RecordingPublisher`: where a dead learner of this run published
    versions past the one this learner starts from (its checkpoint's, or 0), it numbers this
    learner's weights past all of them, so that no version names two weights, and the source
    drops the dead versions' samples (`ludic.pipeline.versions`); `policy_lag/*` and
    `publish_every` then count updates along this learner's branch. A resumed learner publishes
    them so at once (every rank calls this, as the Trainer publishes); a fresh one publishes
    before its first step (`_train`). Another run's record (a reused stream name) is left to be
    replaced when this learner knows its run (`--run-id` or its checkpoint's): its first publish
    (a resumed learner's: the one at resume, already done) replaces it, saying so. A
    fresh learner in one process that does not know its run yet decides at its first sample,
    which pins it, and publishes its start then (`_decides_at_first_sample`)."""
    trainer.version_position = source.staleness.forks.position
    resumed = int(trainer.policy_version)
    record = published_record(url, source.stream.stream)  # every rank reads the same
    if record is None or record.version <= resumed:
        return
    run = source.run_check.run
    if run is None and record.run is not None and _decides_at_first_sample(trainer, source):
        source.on_first_sample = lambda pinned: _fork_at_first_sample(
            trainer, source, record, pinned
        )
        return
    _fork(trainer, source, record, run, resumed)


def _decides_at_first_sample(trainer: Any, source: Any) -> bool:
    """Whether a learner whose run is not known yet waits for the first sample it reads to
    compare its run with the record's: a fresh one in one process, which publishes nothing
    until then (`_fork_at_first_sample`). Under torchrun each rank pins its run at its own
    first sample, possibly at different steps, while the version must move on every rank at
    once: those ranks fork past any record from the start, as a resumed learner does. One
    collective on rank 0's decision does not fit: the only one between a batch's read and its
    training (`check_ranks`) comes after each rank weighed that batch's lags and dead-branch
    drops against version 0, and one inside the read would hold every rank until the slowest
    rank's first sample (up to --max-wait-s, or past the process group's timeout). Forking
    past is the safe side (only the numbers jump); `--run-id` decides at start instead."""
    return trainer.step == 0 and source.world_size == 1


def _fork_at_first_sample(
    trainer: Any, source: Any, record: PublishedRecord, run: str | None
) -> None:
    """A fresh learner's decision once its first sample pinned `run` (None: unstamped, so
    forked past as before), before that sample's lag: its own run's record is forked past,
    another run's is left for this publish to replace. It then publishes its start, which
    `_train` left to this moment, so the servers never went back below the record's version
    while its run was unknown."""
    _fork(trainer, source, record, run, 0)
    trainer.publish_weights()


def _fork(
    trainer: Any, source: Any, record: PublishedRecord, run: str | None, resumed: int
) -> None:
    """Number this learner's versions past `record`, unless it names another run than `run`."""
    if record.run is not None and run is not None and record.run != run:
        return  # replaced by this learner's next publish, which says so (`RecordingPublisher`)
    published = record.version
    trainer.policy_version = published + 1
    source.staleness.forks.add(resumed, published + 1)
    if source.rank == 0:
        logger.warning(
            "a learner before this one published policy versions up to %d, past the %d this "
            "one starts from: this learner numbers its weights %d on (published now) and drops "
            "samples of %s, whose weights died with that learner%s",
            published,
            resumed,
            published + 1,
            dead_span(resumed, published + 1),
            _record_run_note(record, run),
        )
    if trainer.step > 0:  # resumed; a fresh learner publishes before its first step
        trainer.publish_weights()


def _record_run_note(record: PublishedRecord, run: str | None) -> str:
    """What the fork line adds when the record names a run this learner cannot yet compare."""
    if record.run is None or run is not None:
        return ""
    return (
        f" (the record names run {record.run}; this learner's run is not known yet: each rank "
        "takes the run of the first stamped sample it reads. A new run on a reused stream name "
        "given `ludic learner --run-id` numbers its versions from its own start instead)"
    )


def _resume_learner(trainer: Any, cfg: LearnerConfig) -> int:
    """`trainer.resume()` (applying this launch's --lr under --override-lr-schedule), naming
    --lr when it differs from the checkpoint's (one saved before learners recorded their
    flags: `check_learner_resume` refuses the others first)."""
    from ludic.training.lr_resume import LRScheduleMismatchError

    try:
        return int(trainer.resume(override_lr_schedule=cfg.override_lr_schedule))
    except LRScheduleMismatchError as e:
        old = e.changes.get("lr", (None, None))[0]
        raise ValueError(
            f"--lr is {cfg.lr}, the checkpoint's is {old}: restart the learner with --lr {old} "
            f"to continue the run, add {OVERRIDE_LR} to apply this --lr from the checkpoint's "
            "step on, or pass another --out-dir to start a new run"
        ) from e
