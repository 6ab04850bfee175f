"""The Trainer: the optimisation loop and nothing else.

One step = pull a batch from the BatchSource, drop stale samples (`max_lag`), cap sequence
lengths, collate, accumulate gradients over token-budget micro-batches (equal to one big batch),
guard against nan/inf, clip, step AdamW and the LR schedule, bump the policy version, then
publish / checkpoint / evaluate when due. A step with nothing to train on is skipped (it
neither publishes nor checkpoints), and `max_skipped_steps` skipped in a row stop the run with
the cause (`TrainingStalledError`).
Which algorithm runs is entirely the `RLAlgorithm`'s loss (and the source's credit assigner):
there is no algorithm branch here.

The step is async because batch sources are (rollout generation is); `run(n)` is the
synchronous entry point. Where it runs is the `TrainingRuntime`'s business: one process, or
FSDP2 under torchrun (chosen automatically), where ranks agree on batch totals, the number of
forward/backward passes and every skip decision, so the loop below is the same for both.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ludic._aio import maybe_await
from ludic.distributed.interfaces import PolicyPublisher
from ludic.inference.weights import NonFiniteWeightsError
from ludic.rollouts.samples import SAWItem
from ludic.training.algorithm_types import RLAlgorithm
from ludic.training.batching.prefetch import prefetch_inside
from ludic.training.batching.types import BatchSource, BatchSourceExhausted, SAWBatch
from ludic.training.checkpoint import CheckpointManager, checkpoint_tokenizer
from ludic.training.collate import (
    CollatedBatch,
    cap_seq_len,
    collate,
    embedding_rows,
    plan_micro_batches,
    shared_prefix_groups,
    trainable_action_tokens,
)
from ludic.training.compiled import compile_trainer_model
from ludic.training.config import TrainerConfig
from ludic.training.filters import drop_stale
from ludic.training.gradients import BatchTotals, accumulate_gradients, local_shared_passes
from ludic.training.loggers import TrainingLogger
from ludic.training.losses import reduce_metrics
from ludic.training.mismatch import policy_lag_metrics
from ludic.training.parallel.auto import auto_runtime
from ludic.training.parallel.runtime import (
    TrainingRuntime,
    check_batch_together,
    next_batch_together,
    raise_if_any_failed,
)
from ludic.training.parallel.state import optimizer_param_names
from ludic.training.rank_counts import counts_over_ranks
from ludic.training.schedule import build_scheduler
from ludic.training.shared_prefix import shared_prefix_min_tokens
from ludic.training.stall import NoSignalWatch, SkipTracker, skip_cause, was_skipped
from ludic.training.stats import Reducer, aggregate_stats, default_sample_reducers
from ludic.training.trainer_checkpoints import restore_checkpoint, write_checkpoint
from ludic.training.trainer_guards import (
    CaughtLoss,
    check_inputs,
    check_num_steps,
    check_prefetch_lag,
    check_publisher_rank,
    diverged,
    evaluate_together,
    from_checkpoint,
    lay_out_parameters,
    log_together,
    publish_finite,
    reference_model,
)

logger = logging.getLogger(__name__)

EvalFn = Callable[["Trainer"], Mapping[str, float] | Awaitable[Mapping[str, float]]]


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Optimises `model` with `algorithm.loss` on batches from `batch_source`.

    `publisher` receives the weights every `config.publish_every` updates (with one, the
    parameters are first laid out back to back so they travel as a few spans:
    `config.contiguous_parameters`); `ref_model` feeds
    losses that need reference logprobs (KL): a frozen copy, or for a LoRA model its own base
    (`model.get_base_model()`), which runs as the model with its adapters disabled, without a
    second copy; `eval_fn(trainer)` returns metrics every
    `config.eval_every` steps (logged as `eval/...`); `reducers` summarise each batch's samples
    (default: `default_sample_reducers()`). `step` counts steps taken (skipped ones included);
    `policy_version` counts applied updates from `config.initial_policy_version`.

    `runtime` (default: `auto_runtime(config.device)`, FSDP2 under torchrun) places and shards
    the model (and a plain `ref_model`, frozen); a given `optimizer` must be built on the model
    it returns. Under FSDP every rank builds the same Trainer on its own share of the data (a
    publisher or logger only where it should act, e.g. rank 0; `ref_model`, `eval_fn` and
    checkpoints on every rank or none); rank 0 writes checkpoints and publishes; `eval_fn` runs
    on every rank (a sharded forward needs them all); per-sample stats (`reward_mean`, ...) are
    per rank; loss, grad_norm, token and sample counts (`num_samples`, `dropped_*`,
    `policy_lag/*`: `ludic.training.rank_counts`) global; the progress bar is rank 0's. An error in what one rank alone does (its batch
    source, `reducers`, loss, publish, checkpoint write, logger or share of `eval_fn`) stops
    every rank at that step: that rank raises its own error, the others `RankFailedError`
    naming it and the cause. Not covered: an error inside the sharded model's forward or
    backward, or the optimizer's step, on one rank (the others wait in FSDP's collectives
    until the process group's timeout).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        algorithm: RLAlgorithm,
        batch_source: BatchSource,
        config: TrainerConfig | None = None,
        *,
        publisher: PolicyPublisher | None = None,
        ref_model: torch.nn.Module | None = None,
        logger: TrainingLogger | None = None,
        checkpoint_manager: CheckpointManager | None = None,
        eval_fn: EvalFn | None = None,
        reducers: Mapping[str, Reducer] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        tokenizer: Any | None = None,
        runtime: TrainingRuntime | None = None,
    ) -> None:
        self.config = config = config or TrainerConfig()
        check_prefetch_lag(batch_source, config)
        seed_everything(config.seed)
        self._owns_runtime = runtime is None
        self.runtime = runtime = runtime or auto_runtime(config.device)
        self.device = runtime.device
        self.model = runtime.prepare_model(model).train()
        if config.compile:
            compile_trainer_model(self.model, world_size=runtime.world_size)
        self.algorithm = algorithm
        self.batch_source = batch_source
        prefetch = prefetch_inside(batch_source)  # also under a wrapper such as log_samples
        if prefetch is not None:  # lend_idle_threads looks between layers
            prefetch.watch_model(self.model)
        self.publisher = publisher
        self._publishes = check_publisher_rank(runtime, publisher)  # rank 0 holds it if any
        self._logs = runtime.any_rank(logger is not None)  # then every rank agrees on each log
        # refused here, not after the first batch (or in a hang between ranks)
        check_inputs(runtime, self.model, algorithm, ref_model, eval_fn, checkpoint_manager, config)
        self.ref_model = reference_model(runtime, self.model, ref_model)
        self.logger = logger
        self.eval_fn = eval_fn
        self.reducers = default_sample_reducers() if reducers is None else dict(reducers)
        self.tokenizer = tokenizer
        self.checkpoint_extra: dict[str, Any] = {}
        """More entries for every checkpoint's state.json `extra` (e.g. `ludic train`'s run flags,
        which its `--resume` checks), JSON-serialisable."""
        self.version_position: Callable[[int], int] | None = None
        """Where policy version numbers skip (a pipeline learner renumbered past a killed one's
        versions): a version counted in updates along this run's branch, which `policy_lag/*`
        subtracts and `publish_every` counts (so a renumbered learner's first interval is a whole
        one); None: versions are consecutive."""
        lay_out_parameters(  # before the optimizer is built
            self.model,
            config.contiguous_parameters,
            publishes=self._publishes,
            log=logging.getLogger(__name__),
        )
        self.optimizer = optimizer or torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
            fused=config.fused_adamw or None,
        )
        optimizer_param_names(self.model, self.optimizer)  # raises unless built on self.model
        self.scheduler = build_scheduler(
            self.optimizer,
            schedule=config.lr_schedule,
            warmup_steps=config.warmup_steps,
            total_steps=config.total_steps,
            min_lr_ratio=config.min_lr_ratio,
        )
        if checkpoint_manager is None and config.checkpoint is not None:
            checkpoint_manager = CheckpointManager(config.checkpoint)
        self.checkpoints = checkpoint_manager
        if self.tokenizer is None and checkpoint_manager is not None:
            self.tokenizer = checkpoint_tokenizer(model, checkpoint_manager.root)
        self.step = 0
        self.policy_version = config.initial_policy_version
        self.checkpointed_step: int | None = None
        """The step of the checkpoint this Trainer last saved or resumed from (None: neither),
        the same on every rank: a run's final save is due when it differs from `step` (a
        checkpoint due on a skipped step is not written)."""
        self._shared_prefix_min_tokens = shared_prefix_min_tokens(
            self.model,
            enabled=config.shared_prefix,
            packed=config.packing,
            batch_invariant=config.batch_invariant,
        )
        self._skips = SkipTracker(config.max_skipped_steps)
        self._no_signal = NoSignalWatch()

    # -- one step ---------------------------------------------------------------------------

    async def train_step(self) -> dict[str, float]:
        """One optimizer step on the next batch; returns its metrics."""
        started = time.perf_counter()
        batch: SAWBatch = await next_batch_together(  # all ranks stop when one runs out or fails
            self.runtime,
            lambda: maybe_await(self.batch_source.next_batch()),
            f"fetching the batch of step {self.step + 1}",
        )
        check_batch_together(  # e.g. ranks that read differently credited samples: before training
            self.runtime, self.batch_source, f"checking the batch of step {self.step + 1}"
        )
        batch_seconds = time.perf_counter() - started
        version = self.policy_version
        try:  # this rank's own work, reported in the step's first all-reduce (`_optimize`)
            items, metrics = self._select_items(batch)
            collated, plan = self._plan(items)
            failed = None
        except Exception as e:
            metrics, collated, plan, failed = {}, None, [], e
        metrics.update(self._optimize(collated, plan, failed))
        self.step += 1
        cause = None
        if was_skipped(metrics):
            cause = skip_cause(batch, metrics, policy_version=version, config=self.config)
            if self.runtime.world_size > 1:
                cause = replace(cause, text=f"on rank {self.runtime.rank}, {cause.text}")
            logger.warning("step %d skipped: %s", self.step, cause.text)
        if self.runtime.world_size > 1:  # the samples of the global loss (after the cause)
            metrics.update(counts_over_ranks(self.runtime, metrics))
        try:
            metrics.update(await self._after_step(applied=cause is None))
        except NonFiniteWeightsError as e:  # the policy diverged: the run stops here
            raise diverged(e, metrics, self) from e
        metrics["policy_version"] = float(self.policy_version)
        metrics["time/batch_seconds"] = batch_seconds
        metrics["step_seconds"] = time.perf_counter() - started
        if self._logs:  # a logger's error on its rank stops every rank
            log_together(self.runtime, self.logger, metrics, self.step)
        if self.checkpoints is not None and cause is None and self.checkpoints.due(self.step):
            # after the step's row: a resume from it never lacks that row. Not a skipped step:
            # its unchanged weights would pass for a trained step (a launch that trained nothing
            # wrote step 1), and a resume would start past the batch it never trained on.
            self.save_checkpoint()
        if (no_signal := self._no_signal.record(self.step, metrics)) and self.runtime.is_main:
            logger.warning(no_signal)
        self._skips.record(self.step, cause)  # raises TrainingStalledError after too many
        return metrics

    def _select_items(self, batch: SAWBatch) -> tuple[list[SAWItem], dict[str, float]]:
        """Stale dropping, length capping and removal of samples with nothing to train on."""
        items = list(batch.items)
        metrics = {f"batch/{k}": float(v) for k, v in batch.stats.items()}
        metrics["num_samples_in"] = float(len(items))
        if self.config.max_lag is not None:
            fresh = drop_stale(self.policy_version, self.config.max_lag)
            kept = [item for item in items if fresh(item)]
            metrics["dropped_stale"] = float(len(items) - len(kept))
            items = kept
        items = cap_seq_len(items, self.config.max_seq_len)
        trainable = [item for item in items if trainable_action_tokens(item) > 0]
        metrics["dropped_no_action_tokens"] = float(len(items) - len(trainable))
        metrics["num_samples"] = float(len(trainable))
        metrics.update(aggregate_stats(self.reducers, trainable))
        metrics.update(
            policy_lag_metrics(self.policy_version, trainable, position=self.version_position)
        )
        return trainable, metrics

    def _plan(self, items: list[SAWItem]) -> tuple[CollatedBatch | None, list[list[int]]]:
        """The collated batch (None when empty) and its micro-batches (row indices)."""
        config = self.config
        if not items:
            return None, []
        vocab_size = embedding_rows(self.model)  # a token id beyond it: another model's sample
        batch = collate(items, pad_token_id=config.pad_token_id, vocab_size=vocab_size)
        min_shared = self._shared_prefix_min_tokens
        groups = None if min_shared is None else shared_prefix_groups(batch, min_tokens=min_shared)
        plan = plan_micro_batches(
            batch.lengths_B.tolist(),
            config.micro_batch_tokens,
            packed=config.packing,
            groups=groups,
        )
        return batch, plan

    def _optimize(
        self, batch: CollatedBatch | None, plan: list[list[int]], failed: Exception | None
    ) -> dict[str, float]:
        """Accumulate, clip and step; `failed`: what this rank's preparation of the batch raised
        (every rank then raises here, after the first all-reduce)."""
        config, runtime = self.config, self.runtime
        min_shared = self._shared_prefix_min_tokens
        local = (0.0, 0.0) if batch is None else (batch.num_action_tokens, batch.num_sequences)
        tokens, sequences, failures = runtime.all_reduce_sum([*local, float(failed is not None)])
        raise_if_any_failed(runtime, failed, failures > 0, f"preparing step {self.step + 1}")
        passes = runtime.all_reduce_max(len(plan))
        if tokens == 0:
            return self._skip("skipped_empty")
        shared_passes = None
        if runtime.world_size > 1 and min_shared is not None:  # same model calls on all ranks
            flags = local_shared_passes(
                self.model, batch, plan, passes=passes, min_tokens=min_shared, packed=config.packing
            )
            shared_passes = [total > 0 for total in runtime.all_reduce_sum(flags)]
        self.optimizer.zero_grad(set_to_none=True)
        started = time.perf_counter()
        caught = None if runtime.world_size == 1 else CaughtLoss(self.algorithm.loss)
        result = accumulate_gradients(
            self.model,
            self.algorithm.loss if caught is None else caught,
            batch,
            plan,
            totals=BatchTotals(action_tokens=tokens, sequences=sequences),
            num_passes=passes,
            pad_token_id=config.pad_token_id,
            ref_model=self.ref_model,
            packed=config.packing,
            device=self.device,
            autocast_dtype=config.torch_dtype,
            chunk_tokens=config.logprob_chunk_tokens,
            batch_invariant=config.batch_invariant,
            shared_prefix_min_tokens=min_shared,
            shared_passes=shared_passes,
        )
        error = None if caught is None else caught.error  # a loss that raised on this rank
        loss, nonfinite, failures = runtime.all_reduce_sum(
            [result.loss, float(not result.finite), float(error is not None)]
        )
        raise_if_any_failed(
            runtime, error, failures > 0, f"computing the loss of step {self.step + 1}"
        )
        metrics = {
            "loss": loss,
            "num_action_tokens": tokens,
            "num_micro_batches": float(passes),
            **{f"loss/{k}": v for k, v in self._loss_metrics(result.metrics).items()},
        }
        grad_norm = (
            math.nan if nonfinite else runtime.clip_grad_norm(self.model, config.max_grad_norm)
        )
        metrics["grad_norm"] = grad_norm
        if not math.isfinite(grad_norm):
            return {**metrics, **self._skip("skipped_nonfinite")}
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1
        metrics["time/train_seconds"] = time.perf_counter() - started
        return metrics

    def _loss_metrics(self, local: dict[str, float]) -> dict[str, float]:
        """Loss metrics are shares of batch-wide totals, so ranks combine like micro-batches."""
        if self.runtime.world_size == 1:
            return local
        return reduce_metrics(self.runtime.all_gather_object(local))

    def _skip(self, reason: str) -> dict[str, float]:
        """Leave the weights untouched: drop any gradient, do not step optimizer or schedule
        (`train_step` logs why)."""
        self.optimizer.zero_grad(set_to_none=True)
        return {reason: 1.0}

    def publish_weights(self) -> float | None:
        """Push the current weights and `policy_version` to the publisher; returns the seconds
        it took (None without a publisher on any rank). Under FSDP the weights are gathered
        on every rank, so every rank must call it; the rank holding the publisher pushes.

        Non-finite weights on any rank raise the same `NonFiniteWeightsError` on every rank
        before the gather (`trainer_guards.publish_finite`)."""
        if not self._publishes:
            return None
        started = time.perf_counter()
        publish_finite(self.runtime, self.model, self.publisher, version=self.policy_version)
        return time.perf_counter() - started

    async def _after_step(self, *, applied: bool) -> dict[str, float]:
        config, metrics = self.config, {}
        position = self.policy_version  # counted along this run's branch where versions skip
        if self.version_position is not None:
            position = self.version_position(position)
        updates = position - config.initial_policy_version
        if applied and updates % config.publish_every == 0:
            seconds = self.publish_weights()
            if seconds is not None:
                metrics["time/publish_seconds"] = seconds
        if self.eval_fn is not None and config.eval_every and self.step % config.eval_every == 0:
            metrics.update(await evaluate_together(self))  # fails on one rank: all raise
        return metrics

    # -- loops --------------------------------------------------------------------------------

    async def train(self, num_steps: int, *, progress: bool = True) -> list[dict[str, float]]:
        """Run `num_steps` steps (fewer if the source runs out); returns each step's metrics.
        `progress` shows a bar on rank 0 only (every rank's would interleave under torchrun)."""
        check_num_steps(num_steps)
        history: list[dict[str, float]] = []
        shown = progress and self.runtime.is_main
        with tqdm(total=num_steps, desc="train", disable=not shown) as bar:
            for _ in range(num_steps):
                # A step may never suspend (a source that is pure computation): without this,
                # the cancellation `asyncio.run` makes of a first Ctrl-C would land after the run.
                await asyncio.sleep(0)
                try:
                    metrics = await self.train_step()
                except BatchSourceExhausted as e:
                    logger.info("batch source exhausted after %d steps: %s", self.step, e)
                    break
                history.append(metrics)
                bar.update(1)
                bar.set_postfix(loss=f"{metrics.get('loss', math.nan):.4g}")
        return history

    def run(self, num_steps: int, *, progress: bool = True) -> list[dict[str, float]]:
        """Synchronous `train` (starts an event loop; use `await train(...)` inside one)."""
        return asyncio.run(self.train(num_steps, progress=progress))

    # -- checkpoints (`ludic.training.trainer_checkpoints`) ------------------------------------

    def save_checkpoint(self) -> Path:
        """Save model, optimizer, schedule, RNG, step, version and the source's data position
        (full states gathered from every rank, written by rank 0)."""
        path = write_checkpoint(self)
        self.checkpointed_step = self.step
        return path

    def resume(
        self,
        path: str | Path | None = None,
        *,
        missing_ok: bool = False,
        override_lr_schedule: bool = False,
    ) -> int:
        """Restore everything `save_checkpoint` wrote, on any number of ranks, then publish the
        restored weights and policy version (so inference serves them before the first
        rollout); returns the restored step. `path` is one `step_*` checkpoint or a directory
        of them (default: the configured one), where the newest complete one is taken.
        Continuing (`run(total - trainer.step)`) then matches an uninterrupted run.

        `missing_ok=True` lets a first launch run the same code: with no checkpoint there at
        all it changes nothing and returns the current step (broken checkpoints still raise).
        LR settings (lr, schedule, warmup, total_steps, floor) that differ from the
        checkpoint's raise `LRScheduleMismatchError` before anything is loaded, unless
        `override_lr_schedule=True` applies the config's from the checkpoint's step on."""
        chosen = restore_checkpoint(
            self, path, missing_ok=missing_ok, override_lr_schedule=override_lr_schedule
        )
        if chosen is None:
            return self.step
        self.checkpointed_step = self.step
        self._skips = SkipTracker(self.config.max_skipped_steps)
        try:
            seconds = self.publish_weights()
        except NonFiniteWeightsError as e:  # the checkpoint itself holds them
            raise from_checkpoint(e, chosen) from e
        if self.runtime.is_main:
            logger.info(
                "resumed %s: step %d, policy version %d%s",
                chosen,
                self.step,
                self.policy_version,
                "" if seconds is None else f", published in {seconds:.2f}s",
            )
        return self.step

    def close(self) -> None:
        """Close the logger, and the runtime when the Trainer created it."""
        try:
            if self.logger is not None:
                self.logger.close()
        finally:  # every rank reaches the runtime's closing barrier
            if self._owns_runtime:
                self.runtime.close()
