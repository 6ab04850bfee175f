"""The Trainer's checkpoints: writing its whole state, and restoring it into a Trainer.

`write_checkpoint` (`Trainer.save_checkpoint`) gathers the full model and optimizer states and
every rank's RNG and data position, and rank 0 writes them; `restore_checkpoint` (inside
`Trainer.resume`) chooses a checkpoint, refuses changed LR settings or a model of another shape,
and loads everything back on any number of ranks; publishing the restored weights and restarting
the skip count stay the Trainer's. What it does not do: decide when to save
(`CheckpointManager.due`), or the file layout and the refusal of corrupt checkpoints
(`ludic.training.checkpoint`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ludic.training.batching.types import StatefulBatchSource
from ludic.training.checkpoint import CheckpointManager, has_checkpoints
from ludic.training.checkpoint_contents import (
    LoadedCheckpoint,
    capture_rank_state,
    rank_state_for,
    read_checkpoint,
    restore_rng_state,
)
from ludic.training.checkpoint_faults import check_checkpoint_fits, check_optimizer_state_fits
from ludic.training.checkpoint_signals import signals_deferred
from ludic.training.lr_resume import (
    RECORD_KEY,
    LRScheduleMismatchError,
    apply_lr_settings,
    lr_changes,
    lr_settings,
    optimizer_kernels,
    restore_optimizer_kernels,
)
from ludic.training.parallel.runtime import TrainingRuntime, run_on_main, run_together
from ludic.types import JSON

if TYPE_CHECKING:
    import torch

    from ludic.training.trainer import Trainer

__all__ = ["restore_checkpoint", "write_checkpoint"]

logger = logging.getLogger(__name__)

ALGORITHM_KEY = "algorithm"
"""The checkpoint's record of the algorithm (`RLAlgorithm.name`) that trained it."""


def write_checkpoint(trainer: Trainer) -> Path:
    """Save `trainer`'s model, optimizer, schedule, RNG, step, version and the source's data
    position (full states gathered from every rank, written by rank 0); every rank calls it.
    A first SIGINT/SIGTERM during it waits on every rank until the save is complete, then
    every rank stops with it, also one the signal did not reach (`checkpoint_signals`)."""
    manager, runtime = _manager(trainer), trainer.runtime
    agree = None if runtime.world_size == 1 else runtime.all_reduce_max
    with signals_deferred(f"checkpoint {manager.path_for(trainer.step)}", agree=agree):
        return _write(trainer, manager, runtime)


def _write(trainer: Trainer, manager: CheckpointManager, runtime: TrainingRuntime) -> Path:
    model_state = runtime.full_model_state(trainer.model)
    optimizer_state = runtime.full_optimizer_state(trainer.model, trainer.optimizer)
    rank_states = runtime.all_gather_object(capture_rank_state(_data_state(trainer)))
    return run_on_main(
        runtime,
        lambda: manager.save(
            step=trainer.step,
            model=trainer.model,
            model_state=model_state,
            optimizer_state=optimizer_state,
            scheduler=trainer.scheduler,
            policy_version=trainer.policy_version,
            data_state=rank_states[0].data_state,
            rank_states=rank_states,
            tokenizer=trainer.tokenizer,
            extra={
                **trainer.checkpoint_extra,
                RECORD_KEY: lr_settings(trainer.config),
                ALGORITHM_KEY: trainer.algorithm.name,
            },
        ),
        f"saving the checkpoint of step {trainer.step}",
    )


def restore_checkpoint(
    trainer: Trainer,
    path: str | Path | None,
    *,
    missing_ok: bool,
    override_lr_schedule: bool,
) -> Path | None:
    """Load the checkpoint `Trainer.resume` describes into `trainer` (weights, optimizer,
    schedule, this rank's RNG and data position, step and policy version); returns the one
    chosen, or None when `missing_ok` and there is none (then nothing changed)."""
    manager, runtime = _manager(trainer), trainer.runtime

    def choose() -> Path | None:
        if missing_ok and not has_checkpoints(manager.root if path is None else path):
            return None
        return manager.resolve(path)

    chosen = run_on_main(runtime, choose, "choosing the checkpoint to resume from")
    if chosen is None:
        if runtime.is_main:
            logger.info(
                "no checkpoint under %s: starting at step %d", path or manager.root, trainer.step
            )
        return None
    checkpoint = run_together(  # rank 0 reads the weights: its error stops every rank
        runtime,
        lambda: read_checkpoint(chosen, with_weights=runtime.is_main),
        f"reading the checkpoint {chosen}",
    )
    _warn_other_algorithm(checkpoint.extra.get(ALGORITHM_KEY), trainer, chosen)
    changes = lr_changes(checkpoint.extra.get(RECORD_KEY), trainer.config)
    if changes and not override_lr_schedule:
        raise LRScheduleMismatchError(str(chosen), changes, step=checkpoint.step)
    model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.scheduler
    run_on_main(  # a model of another shape: named, not torch's state-dict dump
        runtime,
        lambda: check_checkpoint_fits(model, checkpoint.model_state, chosen),
        f"checking that the checkpoint {chosen} fits the model",
    )
    runtime.load_model_state(model, checkpoint.model_state)
    run_on_main(  # another model's optimizer.pt: named here, not at the first Adam update
        runtime,
        lambda: _check_optimizer_state(optimizer, checkpoint, chosen),
        f"checking that the checkpoint {chosen}'s optimizer state fits the optimizer",
    )
    kernels = optimizer_kernels(optimizer)  # this run's (fused=...), not the saved run's
    runtime.load_optimizer_state(model, optimizer, checkpoint.optimizer_state)
    restore_optimizer_kernels(optimizer, kernels)
    if checkpoint.scheduler_state is not None:
        scheduler.load_state_dict(checkpoint.scheduler_state)
    if changes:
        logger.warning("resuming %s with changed LR settings %s", chosen, changes)
        apply_lr_settings(scheduler, optimizer, trainer.config.lr)
    own = rank_state_for(checkpoint, runtime.rank, runtime.world_size)
    if own.rng_json is not None:
        restore_rng_state(own.rng_json, own.rng_tensors)
    source = trainer.batch_source
    if isinstance(source, StatefulBatchSource):  # a refusal on one rank stops every rank
        run_together(
            runtime,
            lambda: _load_data_state(source, own.data_state, checkpoint, runtime),
            f"restoring its data position from {chosen}",
        )
    trainer.step = checkpoint.step
    trainer.policy_version = checkpoint.policy_version
    return chosen


def _warn_other_algorithm(saved: object, trainer: Trainer, checkpoint: Path) -> None:
    """A checkpoint trained by another algorithm (by name) is resumed, but not silently: its
    optimizer state, step count and logs go on under another loss. The `ludic` commands refuse
    it (their run records); a Python resume may mean it, or only have renamed the algorithm."""
    name = trainer.algorithm.name
    if saved is None or saved == name or not trainer.runtime.is_main:
        return
    logger.warning(
        "resuming %s, trained with algorithm %r, under algorithm %r: its optimizer state, step "
        "count and logs go on under another loss. If that is not meant, resume with %r, or "
        "start a new run (another checkpoint dir) from its weights (%s)",
        checkpoint,
        saved,
        name,
        saved,
        checkpoint / "model",
    )


def _check_optimizer_state(
    optimizer: torch.optim.Optimizer, checkpoint: LoadedCheckpoint, chosen: Path
) -> None:
    if checkpoint.optimizer_state is not None:  # rank 0 read it; the others were handed none
        check_optimizer_state_fits(optimizer, checkpoint.optimizer_state, chosen)


def _load_data_state(
    source: StatefulBatchSource, state: JSON, checkpoint: LoadedCheckpoint, runtime: TrainingRuntime
) -> None:
    """`source.load_state_dict(state)`; a rank other than 0 that was handed rank 0's position
    (the checkpoint was written by another number of ranks) and is refused says so."""
    saved = checkpoint.rank_states
    written_by = 1 if saved is None else len(saved)  # a one-process run saves no rank states
    try:
        source.load_state_dict(state)
    except ValueError as e:
        if runtime.rank == 0 or written_by == runtime.world_size:
            raise
        raise ValueError(
            f"rank {runtime.rank} of {runtime.world_size} resumes {checkpoint.path.name}, "
            f"written by {written_by} rank{'' if written_by == 1 else 's'}, from rank 0's data "
            f"position, and its batch source refuses it: {e}. A source whose data or order "
            "depends on its rank (a per-rank file or seed) resumes only on the number of "
            "ranks that saved it"
        ) from e


def _manager(trainer: Trainer) -> CheckpointManager:
    if trainer.checkpoints is None:
        raise ValueError("no checkpoint manager: set TrainerConfig.checkpoint")
    return trainer.checkpoints


def _data_state(trainer: Trainer) -> JSON:
    source = trainer.batch_source
    return source.state_dict() if isinstance(source, StatefulBatchSource) else {}
