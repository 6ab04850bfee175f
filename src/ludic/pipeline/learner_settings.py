"""The flags that define a `ludic learner` run, recorded in each of its checkpoints, and the
refusal of a resume whose flags differ, naming each changed flag before Redis or the model is
touched (as `ludic train --resume` does: `ludic.recipes.train_checks`).

Recorded: `--model` (its resolved path and its config.json's sha256: a model folder moved or
copied elsewhere, same config, resumes with a note), `--algorithm` (and `--max-tokens` under
dr_grpo, its loss normaliser), `--lr`, `--max-lag`, `--stale` (and `--stale-decay` when
downweighting), and `--stream`, `--group`, `--consumer` (the checkpoint's data position is that
consumer's place in that stream). `--lr` may change with `--override-lr-schedule` (as under
`ludic train`: the trainer applies it from the checkpoint's step on, and the next checkpoints
record it). `--seed` is recorded and a change only warned about: a resumed learner restores the
checkpoint's RNG state, so it has no effect. Everything else may change on resume: the step
count, batch and memory sizes (`--batch-size`, `--micro-batch-tokens`), intervals
(`--checkpoint-every`, `--publish-every`), `--max-wait-s`, the Redis URL and lease ttl, the
servers and how weights reach them, `--device`, `--ledger`. The samples' own credit settings
are checked as they arrive (`ludic.pipeline.credit_check`), not here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
from pathlib import Path
from typing import Any

from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.credit_check import MAX_TOKENS_PRESETS

logger = logging.getLogger(__name__)
LEARNER_SETTINGS_KEY = "learner_settings"
"""Key of `learner_settings` in a checkpoint's state.json `extra`."""
CHECKPOINTS_DIR = "checkpoints"
"""The learner's checkpoints live in `<out_dir>/checkpoints`."""


MODEL_CONFIG = "model config.json sha256"
"""Recorded beside `--model`: a moved model folder with the same config is the same model."""
WARNED_ONLY = frozenset({"--seed"})  # no effect on a resumed learner: named, not refused
OVERRIDE_LR = "--override-lr-schedule"
"""The flag that lets `--lr` change on resume (`ludic train`'s name for it)."""


def learner_settings(cfg: LearnerConfig) -> dict[str, Any]:
    """The flags that define the learner's run, by flag name, as JSON values (and the model's
    config digest under `MODEL_CONFIG`)."""
    settings: dict[str, Any] = {
        "--model": None if cfg.model is None else str(Path(cfg.model).resolve()),
        MODEL_CONFIG: None if cfg.model is None else _config_digest(Path(cfg.model)),
        "--algorithm": cfg.algorithm,
        "--lr": cfg.lr,
        "--max-lag": cfg.max_lag,
        "--stale": cfg.stale,
        "--seed": cfg.seed,
        "--stream": cfg.stream,
        "--group": cfg.group,
        "--consumer": cfg.consumer,
    }
    if cfg.algorithm in MAX_TOKENS_PRESETS:
        settings["--max-tokens"] = cfg.max_tokens
    if cfg.stale == "downweight":
        settings["--stale-decay"] = cfg.stale_decay
    return dict(json.loads(json.dumps(settings)))  # as state.json gives them back


def changed_settings(saved: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The flags recorded on both sides whose values differ (a flag only one side records,
    `--stale-decay` of a run that dropped stale samples, is not compared). `--model` at another
    path whose config.json is the recorded one's is the same model."""
    changed = [flag for flag in given if flag in saved and saved[flag] != given[flag]]
    digest = saved.get(MODEL_CONFIG)
    if "--model" in changed and digest is not None and digest == given.get(MODEL_CONFIG):
        changed.remove("--model")
    return [flag for flag in changed if flag != MODEL_CONFIG]


def _config_digest(model: Path) -> str | None:
    config = model / "config.json"
    return hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None


def resume_refusal(
    path: Path, saved: dict[str, Any], given: dict[str, Any], *, override_lr_schedule: bool = False
) -> str | None:
    """The error text for resuming the checkpoint at `path` (recorded `saved`) with this
    launch's `given` settings: each changed flag with both values, and the ways on (with a
    changed `--lr`, `--override-lr-schedule` too). None when nothing changed (with
    `override_lr_schedule`, nothing but `--lr`)."""
    allowed = WARNED_ONLY | ({"--lr"} if override_lr_schedule else set())
    changed = [f for f in changed_settings(saved, given) if f not in allowed]
    if not changed:
        return None
    parts = "; ".join(
        f"{f} is {_value(given[f])}, the checkpoint's {_value(saved[f])}" for f in changed
    )
    keep = " ".join(f"{f} {_value(saved[f])}" for f in changed)
    override = ""
    if "--lr" in changed:
        only = "" if changed == ["--lr"] else " (only --lr may change that way)"
        override = (
            f"add {OVERRIDE_LR} to apply this launch's --lr from the checkpoint's step on{only}, "
        )
    return (
        f"resuming {path} (the newest checkpoint in --out-dir), which was trained with other "
        f"settings: {parts}. "
        f"Resuming would train a different run into the same checkpoints and logs. Pass the "
        f"checkpoint's flags ({keep}) to continue it, {override}or another --out-dir to start a "
        f"new run (--model {path / 'model'} starts it from these weights)"
    )


def check_learner_resume(cfg: LearnerConfig) -> None:
    """Refuse a resume (`--resume`, the default, with checkpoints in `--out-dir`) whose
    `learner_settings` differ from those its newest checkpoint records, or whose checkpoint is
    another command's. With `--override-lr-schedule` another `--lr` is accepted, with a warning
    (the trainer then applies it). A checkpoint saved before learners recorded their settings
    resumes with a warning (only `--lr` and `--consumer` are then checked, by the trainer and
    the source)."""
    if not cfg.resume or cfg.checkpoint_every is None:
        return  # nothing resumes: without checkpoints the learner starts from --model
    found = _newest_extra(Path(cfg.out_dir) / CHECKPOINTS_DIR)
    if found is None:
        return
    path, extra = found
    saved = extra.get(LEARNER_SETTINGS_KEY)
    if not isinstance(saved, dict):
        _refuse_other_command(path, extra)
        logger.warning(
            "%s does not record its run's settings (saved by an older ludic): resuming without "
            "checking that --model, --algorithm, --max-lag and the stream flags match",
            path,
        )
        return
    given = learner_settings(cfg)
    refusal = resume_refusal(path, saved, given, override_lr_schedule=cfg.override_lr_schedule)
    if refusal is not None:
        raise ValueError(refusal)
    _refuse_nothing_left(cfg, path)
    if "--lr" in changed_settings(saved, given):  # accepted: only with the override
        logger.warning(
            "%s: --lr %s replaces the checkpoint's %s from %s on; the checkpoints this run "
            "saves record --lr %s, so later resumes take it without %s",
            OVERRIDE_LR,
            given["--lr"],
            saved["--lr"],
            path.name,
            given["--lr"],
            OVERRIDE_LR,
        )
    for flag in WARNED_ONLY & set(changed_settings(saved, given)):
        logger.warning(
            "%s is %s, the checkpoint's %s: no effect, the resumed learner restores %s's RNG state",
            flag,
            given[flag],
            saved[flag],
            path,
        )
    if saved.get("--model") not in (None, given.get("--model")):
        logger.info(
            "--model %s: the checkpoint's was %s (same config.json)",
            given["--model"],
            saved["--model"],
        )


def refuse_fresh_run_over_checkpoints(cfg: LearnerConfig) -> None:
    """A new run (`--no-resume`) in an `--out-dir` holding an earlier run's checkpoints is
    refused, as `ludic train` refuses it: its checkpoints would overwrite the earlier run's of
    the same step and leave newer ones of that run beside them (which the next resume would
    pick), and its metrics.jsonl would replace that run's."""
    if cfg.resume or cfg.checkpoint_every is None:
        return
    from ludic.recipes.training import refuse_earlier_checkpoints

    refuse_earlier_checkpoints(
        Path(cfg.out_dir),
        fix="Drop --no-resume to continue that run, or pass another --out-dir for a new one "
        f"(or delete {cfg.out_dir})",
    )


def _newest_extra(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint under `root` whose state.json reads, with its `extra`
    (a broken one is skipped here: the trainer's resume refuses it with its own message)."""
    from ludic.training.checkpoint import STATE, complete_checkpoints

    for path in reversed(complete_checkpoints(root)):
        try:
            extra = json.loads((path / STATE).read_text()).get("extra", {})
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(extra, dict):
            return path, extra
    return None


def _refuse_nothing_left(cfg: LearnerConfig, path: Path) -> None:
    """A resume whose `--steps` the newest checkpoint already reached is refused, as `ludic
    train --resume` refuses it: the learner would load the model, reach Redis and the server,
    then end at once with exit code 0, having trained nothing."""
    from ludic.training.checkpoint import STATE

    try:
        step = json.loads((path / STATE).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return  # the trainer's resume refuses an unreadable state.json in its own words
    if isinstance(step, int) and not isinstance(step, bool) and cfg.steps <= step:
        raise ValueError(
            f"resuming {path} (the newest checkpoint in --out-dir), which is at step {step}, "
            f"and --steps is {cfg.steps} (it counts the whole run, not this launch), so "
            f"nothing is left to train: pass --steps above {step} to train further, or "
            "another --out-dir for a new run"
        )


def _refuse_other_command(path: Path, extra: dict[str, Any]) -> None:
    from ludic.recipes.training import SETTINGS_KEYS

    for command, key in SETTINGS_KEYS.items():
        if key in extra:
            raise ValueError(
                f"{path} is a `{command}` checkpoint; `ludic learner` resumes a learner's own. "
                f"To train from its weights, pass --model {path / 'model'} and another --out-dir"
            )


def _value(value: Any) -> str:
    return shlex.quote(value) if isinstance(value, str) else str(value)
