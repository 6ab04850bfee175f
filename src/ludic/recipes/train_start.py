"""How a `ludic train` run's first policy reaches inference before the first rollout.

With `--server-url`, `reach_servers` first waits for servers that do not listen yet (started
just before, loading their model), as `ludic actor` and `ludic eval` do. `--resume` restores the checkpoint (`_resume`: its weights pushed as its policy version; a
missing checkpoint, changed LR flags without `--override-lr-schedule` or a run already at
`--steps` is refused, naming the fix), and with `--server-url` a new run pushes its starting
weights as policy version 0 (`_publish_start`), so step 1 is on-policy whatever the server held;
a server of another architecture refuses them (`StartingWeightsRefused`) before any episode.
Either closes the trainer (its logger files, its runtime) before it raises, whatever the error.
It does not build the trainer or inference, nor check the run's other flags (`ludic.recipes.train`
and `ludic.recipes.train_checks` do), nor push the weights of later steps (the trainer does).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rich.console import Console

from ludic.distributed.server_link import (
    PushRefused,
    ServerUnreachable,
    TooFewServers,
    WeightPushError,
)
from ludic.errors import LudicUsageError
from ludic.inference.http.server_wait import wait_for_servers
from ludic.recipes.configs import RESUME_LATEST, TrainConfig
from ludic.recipes.inference import server_urls
from ludic.recipes.resume_refusal import no_checkpoint_message
from ludic.training import Trainer
from ludic.training.lr_resume import LRScheduleMismatchError


def schedule_steps_of(cfg: TrainConfig) -> int:
    """Optimizer steps the LR decay spans: --schedule-steps, or --steps when it is left out."""
    return cfg.steps if cfg.schedule_steps is None else cfg.schedule_steps


async def reach_servers(cfg: TrainConfig, console: Console) -> None:
    """Wait for every `--server-url` to listen (one started just before loads its model first:
    up to 5 minutes, printing the waiting line every 30 s), as `ludic actor` and `ludic eval`
    do, so that the `--served-model` check and the starting-weights push that follow ask a
    server that is up rather than fail. A host name that does not resolve or a TLS mismatch
    fails at once (`wait_for_servers`); a missing token or --batch-invariant was refused
    before the model loaded (`train_command`'s flag checks: `server_push_token`)."""
    say = partial(console.print, markup=False, highlight=False)
    await wait_for_servers(server_urls(cfg.server_url), say=say)


def _resume(trainer: Trainer, cfg: TrainConfig, console: Console) -> None:
    """Restore the checkpoint `cfg.resume` names (publishing its weights into the engine);
    closes the trainer (its logger files, its runtime) and raises when it cannot continue,
    whatever the error (a checkpoint of another model, non-finite weights, a failed push)."""
    path = None if cfg.resume == RESUME_LATEST else Path(cfg.resume or "")
    try:
        trainer.resume(path, override_lr_schedule=cfg.override_lr_schedule)
    except FileNotFoundError as e:
        trainer.close()
        raise FileNotFoundError(
            no_checkpoint_message(str(e), cfg.out_dir, latest=cfg.resume == RESUME_LATEST)
        ) from e
    except LRScheduleMismatchError as e:
        trainer.close()
        if e.step is not None and e.step >= cfg.steps:  # the LR flags are not what to change
            raise ValueError(_nothing_left_message(e.step, cfg)) from e
        raise ValueError(_lr_mismatch_message(e, cfg)) from e
    except BaseException:
        trainer.close()
        raise
    if trainer.step >= cfg.steps:
        trainer.close()
        raise ValueError(_nothing_left_message(trainer.step, cfg))
    if cfg.override_lr_schedule:
        console.print(
            "[bold yellow]warning[/bold yellow]: --override-lr-schedule: this launch's "
            f"--lr {cfg.lr} --lr-schedule {cfg.lr_schedule} --warmup-steps {cfg.warmup_steps} "
            f"--schedule-steps {schedule_steps_of(cfg)} --min-lr-ratio {cfg.min_lr_ratio} "
            f"win over the checkpoint's from step {trainer.step} on"
        )
    console.print(
        f"resumed at step {trainer.step} (policy version {trainer.policy_version}), "
        "its weights now served for the first rollout"
    )


def _nothing_left_message(step: int, cfg: TrainConfig) -> str:
    """A `--steps` the checkpoint already reached. Also said in place of an LR-settings
    refusal: a decay's default length is `--steps`, so a lower one also "changes" it, and
    passing the `--schedule-steps` that refusal names would only lead here."""
    return (
        f"--resume: the checkpoint is at step {step} and --steps is {cfg.steps}, so nothing "
        "is left to train; raise --steps to train further"
    )


class StartingWeightsRefused(WeightPushError, LudicUsageError):
    """`ludic train`'s starting weights did not reach `--server-url` before any episode: a
    server refused them (a 4xx, `PushRefused`: another architecture than `--model`, a wrong
    token; its message says "refused"), or they could not be pushed for another reason the
    push named (the servers did not all join the weight-sync group, another trainer replaced
    this one, a push failed again after rejoining; "could not push"). A WeightPushError, and
    a refusal the CLI prints without a traceback. A server that cannot be reached is not this:
    `ServerUnreachable` as raised, or `TooFewServers` saying the weights could not be pushed."""


def _publish_start(trainer: Trainer, cfg: TrainConfig, console: Console) -> None:
    """Push the starting weights (`--model`) to `--server-url` as policy version 0 before the
    first rollout, as `--resume` pushes its checkpoint's: a server that an earlier run pushed
    to, or that loaded another model, would otherwise sample step 1 off-policy. A server of
    another architecture refuses the push before any episode (`StartingWeightsRefused` naming
    `--model`: "refused" for a server's refusal, "could not push" for any other failure)."""
    start = f"--model {cfg.model}" if cfg.model else "a fresh tiny model"
    try:
        seconds = trainer.publish_weights()
    except WeightPushError as e:
        trainer.close()
        if isinstance(e, ServerUnreachable):
            raise
        if isinstance(e, PushRefused):
            raise StartingWeightsRefused(
                f"--server-url refused this run's starting weights ({start}) before any "
                f"episode: {e}"
            ) from e
        pushed = f"could not push this run's starting weights ({start}) to --server-url"
        if isinstance(e, TooFewServers):  # not reached, or gone mid-push: nothing refused them
            raise TooFewServers(f"{pushed} before any episode: {e}") from e
        raise StartingWeightsRefused(f"{pushed} before any episode: {e}") from e
    except BaseException:
        trainer.close()
        raise
    took = "" if seconds is None else f" in {seconds:.2f}s"
    console.print(
        f"server: this run's starting weights ({start}) pushed as policy version "
        f"{trainer.policy_version}{took}, served for the first rollout"
    )


_FLAGS = {
    "lr": "--lr",
    "lr_schedule": "--lr-schedule",
    "warmup_steps": "--warmup-steps",
    "total_steps": "--schedule-steps",
    "min_lr_ratio": "--min-lr-ratio",
}


def _lr_mismatch_message(error: LRScheduleMismatchError, cfg: TrainConfig) -> str:
    """Name each changed flag, the checkpoint's value and how to go on either way."""
    parts = []
    for field, (old, new) in error.changes.items():
        if old is None or new is None:  # what a constant --lr-schedule ignores: implied by it
            continue
        flag = _FLAGS[field]
        if field == "total_steps" and cfg.schedule_steps is None:
            flag = "--schedule-steps (default: --steps)"
        parts.append(f"{flag} is {new}, the checkpoint's is {old}")
    keep = " ".join(
        f"{_FLAGS[f]} {old}" for f, (old, _) in error.changes.items() if old is not None
    )
    stretch = ""
    if None not in error.changes.get("total_steps", (None, None)):  # two decays' lengths
        stretch = (
            " (a longer decay climbs back up from where the checkpoint's ended; with the "
            "checkpoint's --schedule-steps the LR stays at its floor past it)"
        )
    return (
        f"--resume: the LR settings differ from the checkpoint's: {'; '.join(parts)}. "
        f"Pass {keep} to continue its schedule, or add --override-lr-schedule to apply "
        f"this launch's from the checkpoint's step on{stretch}"
    )
