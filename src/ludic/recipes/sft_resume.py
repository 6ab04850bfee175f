"""`ludic sft`'s checkpoint flags and `--resume`: the up-front refusals and the restore.

Before the model loads: counts that cannot train (`--steps`, `--batch-size`,
`--checkpoint-every`, `--keep-checkpoints` below 1), an OUT_DIR holding an earlier run's
checkpoints without `--resume`, `--resume PATH` older than checkpoints already in OUT_DIR, and a
`--resume` whose flags differ from the ones its checkpoint recorded (`sft_settings`, in every
checkpoint's state.json `extra` under `SFT_SETTINGS_KEY`). Then `resume_sft` restores the run
with `Trainer.resume` (weights, optimizer, schedule, RNG and `OfflineBatchSource`'s position,
which refuses other data itself) and refuses a checkpoint with nothing left to train.

The restore itself is the Trainer's, and the dropping of the discarded steps' metrics rows is
`JsonlLogger`'s; this module only decides what `ludic sft` accepts. It does not compare
`--model`, `--epochs`, `--steps`, `--micro-batch-tokens` or `--device` (the checkpoint's
weights are loaded; more epochs or steps extend a run; the rest changes speed or placement).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ludic.recipes.configs import RESUME_LATEST, SFTConfig
from ludic.recipes.count_checks import check_lr, check_micro_batch_tokens
from ludic.recipes.resume_refusal import no_checkpoint_message
from ludic.recipes.training import (
    SETTINGS_KEYS,
    check_run_dir,
    recorded_settings,
    refuse_other_settings,
)
from ludic.training import OfflineBatchSource, Trainer
from ludic.training.lr_resume import LRScheduleMismatchError

SFT_SETTINGS_KEY = SETTINGS_KEYS["ludic sft"]
"""Key of `sft_settings` in a checkpoint's state.json `extra`."""


def check_sft_counts(cfg: SFTConfig) -> None:
    """Refuse a count below 1 and an `--lr` that is not a finite number > 0, naming the flag and
    a value that works, before the model loads (the trainer refused `--lr 0` and
    `--micro-batch-tokens 0` only after it had loaded, naming its own fields)."""
    counts = (
        ("--steps", cfg.steps, "optimizer steps of the whole run, e.g. --steps 100"),
        ("--batch-size", cfg.batch_size, "samples per step, e.g. 32"),
        ("--checkpoint-every", cfg.checkpoint_every, "or leave it out: only a final one"),
        ("--keep-checkpoints", cfg.keep_checkpoints, "or None: keep every one"),
    )
    for flag, value, fix in counts:
        if value is not None and value < 1:
            raise ValueError(f"{flag} is {value}: pass {flag} >= 1 ({fix})")
    check_micro_batch_tokens(cfg.micro_batch_tokens)  # a token budget, in its own words
    check_lr(cfg.lr, "1e-3")


def sft_settings(cfg: SFTConfig) -> dict[str, Any]:
    """The flags that decide what an SFT run trains, by flag name, as JSON values (the data's
    contents are checked by `OfflineBatchSource` itself)."""
    settings: dict[str, Any] = {
        "--algorithm": cfg.algorithm,
        "--batch-size": cfg.batch_size,
        "--seed": cfg.seed,
        "--lr": cfg.lr,
        "--min-reward": cfg.min_reward,
        "--retokenize": cfg.retokenize,
    }
    if cfg.algorithm == "awr":
        for name, value in asdict(cfg).items():
            if name.startswith("awr_"):
                settings[f"--{name.replace('_', '-')}"] = value
    return dict(json.loads(json.dumps(settings)))  # as state.json gives them back


def check_sft_run_dir(cfg: SFTConfig) -> None:
    """Without --resume: refuse an OUT_DIR with an earlier run's checkpoints. With `--resume
    PATH`: refuse one older than complete checkpoints in OUT_DIR (they would outlive this run
    and win a later bare --resume); a bare --resume takes the newest, so it never is. The
    check `ludic train` runs too (`ludic.recipes.training.check_run_dir`)."""
    check_run_dir(cfg.out_dir, cfg.resume)


def check_sft_resume_settings(cfg: SFTConfig, notice: Callable[[str], None]) -> None:
    """Refuse `--resume` when this launch's `sft_settings` differ from the checkpoint's (each
    flag named with both values), or when the checkpoint is a `ludic train` one. A checkpoint
    saved before `ludic sft` recorded them resumes unchecked, with a one-line `notice`."""
    found = recorded_settings(
        cfg.out_dir, cfg.resume, command="ludic sft", flags="flags", notice=notice
    )
    if found is None:
        return
    path, saved = found
    given = sft_settings(cfg)
    # flags one side does not record (--awr-* of another --algorithm) are not compared
    differ = [f for f in given if f in saved and saved[f] != given[f]]
    if not differ:
        return
    parts = [f"{f} is {given[f]}, the checkpoint's {saved[f]}" for f in differ]
    refuse_other_settings(path, parts, " ".join(_flag_text(f, saved[f]) for f in differ))


def _flag_text(flag: str, value: Any) -> str:
    """How to pass `value` for `flag`: a bool as `--flag` / `--no-flag`."""
    if isinstance(value, bool):
        return flag if value else f"--no-{flag.removeprefix('--')}"
    return f"{flag} {value}"


def resume_sft(trainer: Trainer, source: OfflineBatchSource, cfg: SFTConfig) -> None:
    """Restore the checkpoint `cfg.resume` names into `trainer` (and `source`'s position);
    closes the trainer and raises, naming the fix, when it cannot continue."""
    path = None if cfg.resume == RESUME_LATEST else Path(cfg.resume or "")
    try:
        trainer.resume(path)
        _check_left(trainer, source, cfg)
    except FileNotFoundError as e:
        trainer.close()
        raise FileNotFoundError(
            no_checkpoint_message(str(e), cfg.out_dir, latest=cfg.resume == RESUME_LATEST)
        ) from e
    except LRScheduleMismatchError as e:
        trainer.close()
        old = e.changes.get("lr", (None, None))[0]
        raise ValueError(
            f"--resume: --lr is {cfg.lr}, the checkpoint's is {old}: pass --lr {old} to "
            "continue that run, or another --out-dir to start a new one"
        ) from e
    except BaseException:
        trainer.close()
        raise


def _check_left(trainer: Trainer, source: OfflineBatchSource, cfg: SFTConfig) -> None:
    if trainer.step >= cfg.steps:
        raise ValueError(
            f"--resume: the checkpoint is at step {trainer.step} and --steps is {cfg.steps}, so "
            "nothing is left to train; raise --steps to train further"
        )
    if source.exhausted():
        raise ValueError(
            f"--resume: the checkpoint at step {trainer.step} has finished --epochs "
            f"{cfg.epochs}, so nothing is left to train; raise --epochs to train further"
        )
