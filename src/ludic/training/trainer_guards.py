"""The Trainer's refusals: the checks it makes before it starts, and its non-finite weights.

Early refusals (`check_inputs`, `check_num_steps`, `lay_out_parameters`'s refusal of
`contiguous_parameters=True`) raise naming the problem and the fix, at construction or at
`train(...)`, not after the first batch (or in a hang between ranks). The publish step's guard
(`publish_finite`) checks every rank's own shards for nan/inf, the ranks agreeing, before the
gather, and publishes inside `finite_checked()`; `diverged` and `from_checkpoint` re-raise the
resulting `NonFiniteWeightsError` with where the run stopped and which checkpoint to resume
from. What one rank alone does in a step (the publish, its logger, its share of `eval_fn`) goes
through `run_together` (`publish_finite`, `log_together`, `evaluate_together`): an error there
(a `WeightPushError` on the publishing rank) stops every rank, the others with a
`RankFailedError` naming that rank and the cause, instead of a hang in the next collective.
`CaughtLoss` does the same for a loss that raises on one rank, in the middle of the passes.

What it does not do: decide when to publish, retry, skip a step, or touch the optimizer; the
Trainer (`ludic.training.trainer`) owns the loop and calls these. Plain functions over the
Trainer's parts, holding no state of their own (`CaughtLoss` holds only the error it caught).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ludic._aio import maybe_await
from ludic.distributed.interfaces import PolicyPublisher, diverged_error, finite_checked
from ludic.inference.weights import NonFiniteWeightsError
from ludic.training.algorithm_types import Loss, LossInputs, LossOutput, RLAlgorithm
from ludic.training.batching.prefetch import prefetch_inside
from ludic.training.checkpoint import CheckpointManager
from ludic.training.config import TrainerConfig
from ludic.training.contiguous_params import contiguous_problem, make_contiguous_
from ludic.training.loggers import Metrics, TrainingLogger
from ludic.training.lora import is_own_base
from ludic.training.parallel.runtime import (
    TrainingRuntime,
    check_reference_model,
    check_same_on_every_rank,
    nonfinite_on_any_rank,
    run_together,
    run_together_async,
)

if TYPE_CHECKING:
    from ludic.training.trainer import EvalFn, Trainer

__all__ = [
    "CaughtLoss",
    "check_inputs",
    "check_num_steps",
    "check_prefetch_lag",
    "check_publisher_rank",
    "check_ref_logprobs",
    "diverged",
    "evaluate_together",
    "from_checkpoint",
    "lay_out_parameters",
    "log_together",
    "publish_finite",
    "resume_hint",
]


# -- early refusals -----------------------------------------------------------------------------


def check_prefetch_lag(batch_source: object, config: TrainerConfig) -> None:
    """A `PrefetchBatchSource` (the source or one it wraps) draws each batch while the step
    before it trains, so its samples are one policy version old when they arrive: with
    `max_lag=0` every second step would drop its whole batch as stale, forever (half the
    generation thrown away, no error)."""
    if prefetch_inside(batch_source) is not None and config.max_lag == 0:
        raise ValueError(
            "TrainerConfig(max_lag=0) with a PrefetchBatchSource: the prefetched batch is drawn "
            "while the previous step trains, so it is always one policy version old and would be "
            "dropped as stale every other step. Set max_lag=1 (or more; the ratio losses correct "
            "for the lag), or use the batch source without PrefetchBatchSource for on-policy "
            "training"
        )


def check_inputs(
    runtime: TrainingRuntime,
    model: torch.nn.Module,
    algorithm: RLAlgorithm,
    ref_model: torch.nn.Module | None,
    eval_fn: EvalFn | None,
    checkpoint_manager: CheckpointManager | None,
    config: TrainerConfig,
) -> None:
    """The Trainer's constructor checks, in this order: every rank was handed the same kinds of
    things that make all ranks meet (a reference model, an `eval_fn`, a checkpoint manager or
    `config.checkpoint`: on some only, a hang), a `ref_model` shares no parameters with the (prepared) `model`, and a loss
    that needs reference logprobs has one."""
    check_same_on_every_rank(  # all ranks meet in what these do: on some only, a hang
        runtime,
        ref_model=ref_model is not None,
        eval_fn=eval_fn is not None,
        checkpoint_manager=checkpoint_manager is not None or config.checkpoint is not None,
    )
    if ref_model is not None:
        check_reference_model(model, ref_model)
    check_ref_logprobs(algorithm, ref_model)


def reference_model(
    runtime: TrainingRuntime, model: torch.nn.Module, ref_model: torch.nn.Module | None
) -> torch.nn.Module | None:
    """The model the loss's reference logprobs come from: `model` itself when `ref_model` is
    the LoRA `model`'s own base (`accumulate_gradients` runs it with its adapters disabled: no
    copy, and nothing frozen); else `ref_model` frozen on the device, under FSDP2 sharded like
    the policy unless it already is."""
    if ref_model is None:
        return None
    if is_own_base(model, ref_model):
        return model
    return runtime.prepare_reference_model(ref_model)


def check_publisher_rank(runtime: TrainingRuntime, publisher: PolicyPublisher | None) -> bool:
    """Whether any rank holds a publisher (every rank calls it; one all-gather under FSDP).
    The gathered weights land on the main rank only (`inference_weights`), so a publisher
    given on other ranks but not on rank 0 would never push: refused on every rank. One given on
    rank 0 and others is never called on the others: each of those ranks says so (an embedded
    engine it would feed keeps its first weights, and what it generates falls behind)."""
    if runtime.world_size == 1:
        return publisher is not None
    if publisher is not None and not runtime.is_main:
        logging.getLogger(__name__).warning(
            "the publisher given on rank %d is never called: under FSDP the Trainer gathers the "
            "weights on rank 0, which alone publishes, so whatever this one feeds (e.g. an "
            "embedded engine on this rank) keeps its first weights and the samples it "
            "generates fall further behind every step (dropped past max_lag); give the "
            "publisher on rank 0 only and generate on servers it publishes to",
            runtime.rank,
        )
    held = runtime.all_gather_object(publisher is not None)
    if any(held) and not held[0]:
        ranks = [rank for rank, has in enumerate(held) if has]
        raise ValueError(
            f"a publisher was given on rank(s) {ranks} but not on rank 0: the Trainer gathers "
            "the full weights to rank 0, which pushes them, so it would never publish; give "
            "rank 0 the publisher (the other ranks may have none)"
        )
    return any(held)


def check_ref_logprobs(algorithm: RLAlgorithm, ref_model: torch.nn.Module | None) -> None:
    """Refuse a loss that needs reference-model logprobs without a `ref_model` (here, not
    after the first batch)."""
    if ref_model is None and algorithm.loss.needs_ref_logprobs:
        raise ValueError(
            f"algorithm {algorithm.name!r}: its loss needs reference-model logprobs (a KL "
            "term, e.g. make_grpo(kl_beta=...)) but no ref_model was given: pass "
            "Trainer(..., ref_model=<a frozen copy of the starting model>), or drop the "
            "KL term (kl_beta=0)"
        )


def check_num_steps(num_steps: object) -> None:
    """Refuse a `train(num_steps)` that is not an int >= 0 (a bool included)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 0:
        raise ValueError(
            f"num_steps must be an int >= 0, got {num_steps!r} (to continue a resumed run "
            "to `total` steps: run(total - trainer.step), checking it is not negative)"
        )


def lay_out_parameters(
    model: torch.nn.Module, wanted: bool | None, *, publishes: bool, log: logging.Logger
) -> None:
    """`config.contiguous_parameters`: the parameters back to back, one storage per dtype
    (`ludic.training.contiguous_params`), before the optimizer is built. `None` applies it
    where it can when the Trainer publishes; `True` refuses a model it cannot apply to.
    Logs to `log` (the Trainer's logger)."""
    if wanted is False or (wanted is None and not publishes):
        return
    problem = contiguous_problem(model)
    if problem is not None:
        if wanted:
            raise ValueError(
                f"TrainerConfig(contiguous_parameters=True) cannot apply: {problem}; "
                "leave it at None (applies where it can) or set it to False"
            )
        log.info("parameters keep their layout: %s", problem)
        return
    moved = make_contiguous_(model)
    log.debug("parameters laid out back to back (%d bytes moved)", moved)


# -- non-finite weights ---------------------------------------------------------------------------


def publish_finite(
    runtime: TrainingRuntime,
    model: torch.nn.Module,
    publisher: PolicyPublisher | None,
    *,
    version: int,
) -> None:
    """Check, gather and publish `model`'s weights at `version`; every rank must call it.

    First every rank checks its own shards for a nan or an inf and the ranks agree: if any has
    one, every rank raises the same `NonFiniteWeightsError` (naming the tensors) before the
    gather, so none is left waiting in a collective; the publisher then skips its own pass over
    the gathered state (`finite_checked`)."""
    bad = nonfinite_on_any_rank(runtime, model)
    if bad:
        raise diverged_error(bad, version=version)
    weights = runtime.inference_weights(model)  # gathers on every rank

    def push() -> None:  # on the rank holding the publisher (rank 0 under FSDP)
        if publisher is not None and weights is not None:
            with finite_checked():
                publisher.publish(weights, version=version)

    run_together(runtime, push, f"publishing policy version {version}")


def log_together(
    runtime: TrainingRuntime, logger: TrainingLogger | None, metrics: Metrics, step: int
) -> None:
    """`logger.log(metrics, step)` on the ranks that hold a logger; every rank must call it
    when any rank holds one. A logger that raises (a full disk, a lost tracking server) makes
    every rank raise (`run_together`: one all-reduce per step under FSDP, none in one process)."""

    def log() -> None:
        if logger is not None:
            logger.log(metrics, step)

    run_together(runtime, log, f"logging step {step}")


async def evaluate_together(trainer: Trainer) -> dict[str, float]:
    """`trainer.eval_fn(trainer)`'s metrics as `eval/<name>` floats; every rank calls it. When
    it raised on any rank (e.g. only rank 0 evaluates, against an inference server that is
    down), every rank raises (`run_together_async`), none waits alone in the next step. Not
    covered: an `eval_fn` that fails on one rank while the others are inside a forward of the
    sharded model: their all-gathers wait for it until the group's timeout."""
    eval_fn = trainer.eval_fn
    assert eval_fn is not None

    async def run() -> dict[str, float]:
        results = await maybe_await(eval_fn(trainer))
        return {f"eval/{k}": float(v) for k, v in results.items()}

    return await run_together_async(trainer.runtime, run, f"evaluating at step {trainer.step}")


class CaughtLoss:
    """`loss` (a `Loss`) for one rank of several: an exception it raises is kept in `error`
    (the first; later micro-batches are not computed) and the micro-batch gets a nan loss
    instead, which `accumulate_gradients` in lockstep back-propagates as zero before running
    the remaining passes. So this rank still makes every FSDP collective of the step, and the
    Trainer raises `error` (the others `RankFailedError`) at the step's loss all-reduce,
    which carries the failure (`raise_if_any_failed`)."""

    def __init__(self, loss: Loss) -> None:
        self.loss = loss
        self.error: Exception | None = None

    @property
    def needs_ref_logprobs(self) -> bool:
        return self.loss.needs_ref_logprobs

    @property
    def needs_entropy(self) -> bool:
        return self.loss.needs_entropy

    def __call__(self, inputs: LossInputs) -> LossOutput:
        if self.error is None:
            try:
                return self.loss(inputs)
            except Exception as e:
                self.error = e
        return LossOutput(loss=torch.tensor(math.nan))


def diverged(
    error: NonFiniteWeightsError, metrics: Mapping[str, float], trainer: Trainer
) -> NonFiniteWeightsError:
    """The publisher's refusal of non-finite weights, with where `trainer`'s run stopped (this
    step's loss and grad_norm) and the checkpoint to resume from. Raised, never retried: every
    later step would start from the same weights."""
    shown = "".join(f", {k}={metrics[k]:.4g}" for k in ("loss", "grad_norm", "lr") if k in metrics)
    hint = resume_hint(trainer.checkpoints, trainer.config.publish_every)
    return NonFiniteWeightsError(
        error.names,
        f"{error}. The run stopped at step {trainer.step} (policy version "
        f"{trainer.policy_version}{shown}); {hint}",
    )


def resume_hint(checkpoints: CheckpointManager | None, publish_every: int) -> str:
    """Which checkpoint to resume a diverged run from (or that there is none)."""
    if checkpoints is None:
        return "this run saves no checkpoints (TrainerConfig.checkpoint): start it again"
    latest = checkpoints.latest()
    if latest is None:
        return "no checkpoint was saved yet: start the run again"
    hint = f"the last checkpoint is {latest} (Trainer.resume, ludic train --resume)"
    if publish_every > 1:
        hint += (
            f"; with publish_every={publish_every} it may have been saved "
            "after the weights diverged: then resume from an older one"
        )
    return hint


def from_checkpoint(error: NonFiniteWeightsError, chosen: Path) -> NonFiniteWeightsError:
    """`error` raised when publishing weights just resumed from `chosen`: the checkpoint itself
    holds them."""
    return NonFiniteWeightsError(
        error.names, f"{error}. They come from the checkpoint {chosen}: resume from an older one"
    )
