"""Up-front refusals of `ludic actor` and `ludic learner` flags that cannot run, before Redis,
a server or a model is touched, in the words of `ludic train` (`ludic.recipes.train_checks`).

Counts must be >= 1: the actor's `--problems-per-batch`, `--group-size`, `--max-steps`,
`--concurrency`, `--batches`, `--max-backlog`, `--max-stream-len`; the learner's `--steps`,
`--batch-size`, `--publish-every`, `--checkpoint-every`, `--server-ranks`,
`--micro-batch-tokens`, `--max-tokens` (None turns the optional ones off), the actor's
`--server-wait-s` must be at least 1 second; the learner's `--lr` must be
a finite number > 0 and its `--max-lag` >= 0; its seconds and fractions must make sense
(`--server-wait-s` >= 1, as the actor's, `--max-wait-s` > 0, `--stale-decay` in [0, 1], `--bucket-mb` > 0, `--verify-atol` >= 0):
out of range they were taken as given (a learner that stopped at once, a push verification
that fails every time) or refused only after the model loaded, in a field's words. The learner under dr_grpo needs `--max-tokens` (its loss divides by the actors'
generation budget; `CreditCheck` then refuses samples generated with another one); under any
other preset a given `--max-tokens` is unused and a warning says so. The actor's preset checks
(`--group-size 1`, `--temperature 0`) stay in `ludic.pipeline.commands.check_actor_preset`.
The count checks import nothing heavy (`ludic.recipes.count_checks`, shared with `ludic train`),
so the learner checks Redis before torch loads (`refusals_need_torch`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from ludic.errors import LudicUsageError
from ludic.pipeline.config import ActorConfig, LearnerConfig
from ludic.pipeline.credit_check import MAX_TOKENS_PRESETS
from ludic.pipeline.learner_settings import CHECKPOINTS_DIR
from ludic.recipes.count_checks import (
    check_count_flags,
    check_episode_timeout,
    check_lr,
    check_micro_batch_tokens,
)

logger = logging.getLogger(__name__)


def check_actor_counts(cfg: ActorConfig) -> None:
    """Refuse any of the actor's counts below 1, naming the flag, an `--episode-timeout-s` not
    above 0, a `--server-wait-s` below 1 and a `--policy-version` that is negative or given
    with `--server-url` (whose server says the version)."""
    if cfg.policy_version is not None:
        if cfg.server_url:
            raise ValueError(
                "--policy-version sets the embedded engine's version; with --server-url the "
                "server's is used: drop it here and start the server with `ludic serve "
                "--policy-version`"
            )
        if cfg.policy_version < 0:
            raise ValueError(f"--policy-version must be >= 0, got {cfg.policy_version}")
    check_episode_timeout(cfg.episode_timeout_s)
    check_server_wait(cfg.server_wait_s, "actor")
    check_key_names(stream=cfg.stream, actor_id=cfg.actor_id)
    check_count_flags(
        ("--problems-per-batch", cfg.problems_per_batch, "problems per batch, e.g. 4"),
        ("--group-size", cfg.group_size, "episodes per problem, e.g. 8"),
        ("--max-steps", cfg.max_steps, "env steps per episode, e.g. 10"),
        ("--concurrency", cfg.concurrency, "episodes in flight at once, e.g. 32"),
        ("--batches", cfg.batches, "batches before stopping, or None to run until stopped"),
        ("--max-backlog", cfg.max_backlog, "undelivered samples before waiting, e.g. 256"),
        ("--max-stream-len", cfg.max_stream_len, "the stream's safety cap, e.g. 100000"),
    )


def check_server_wait(seconds: float, command: str) -> None:
    """Refuse a `--server-wait-s` below 1 second (nan too), naming the flag."""
    if not seconds >= 1:
        raise ValueError(
            f"--server-wait-s is {seconds}: pass seconds >= 1 (how long the {command} waits for "
            "its --server-url servers to listen; 300 by default)"
        )


def check_learner_model_path(cfg: LearnerConfig) -> None:
    """Refuse a `--model` path that does not exist without importing torch (whose import took
    ~30 s of the refusal on a loaded box), in `load_model`'s words. A missing step folder
    (`.../step_N` or its `model/`) is left to `check_learner_model`: a re-save killed between
    its renames leaves it aside, which that check renames back."""
    if cfg.model is None:
        return
    path = Path(cfg.model).expanduser()
    if path.exists() or any(p.name.startswith("step_") for p in (path, path.parent)):
        return
    raise FileNotFoundError(
        f"no model directory at {cfg.model} (--model): check the path (a run saves models "
        "under RUN/checkpoints/step_N/model), or leave --model out to train the tiny model"
    )


def check_learner_model(cfg: LearnerConfig) -> None:
    """Refuse a `--model` that is no model directory (this imports torch)."""
    if cfg.model is not None:
        from ludic.models.loading import check_model_directory

        check_model_directory(cfg.model)


def refusals_need_torch(cfg: LearnerConfig) -> bool:
    """Whether a refusal that must import torch to decide may apply to `cfg`: a `--model` path
    that does not exist (past `check_learner_model_path`: a step folder a killed re-save left
    aside), or checkpoints in `--out-dir` (a resume whose flags differ, a `--no-resume` over
    them). The learner then runs those checks before reaching Redis, so they
    are named even with Redis down; otherwise it reaches Redis first, within seconds."""
    if cfg.model is not None and not Path(cfg.model).expanduser().exists():
        return True
    checkpoints = Path(cfg.out_dir) / CHECKPOINTS_DIR
    return cfg.checkpoint_every is not None and checkpoints.is_dir() and any(checkpoints.iterdir())


def check_key_names(**flags: str) -> None:
    """Refuse a Redis name flag (`--stream`, `--group`, `--consumer`, `--actor-id`) that is
    empty, has surrounding spaces or holds a control character, naming it: `--stream ""` (an
    unset shell variable) or `--stream "ludic:samples "` put the actor and the learner on two
    streams, each waiting for the other in words that hardly show why. Inner spaces are fine."""
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if not value or value != value.strip() or not value.isprintable():
            raise LudicUsageError(
                f"{flag} {value!r} is no usable Redis name (empty, surrounding spaces or a "
                f"control character): pass {_NAME_HINTS[name]}"
            )


_NAME_HINTS = {  # what each name must match: only the stream is shared by both sides
    "stream": "the same name to the actors and the learner, e.g. --stream ludic:samples",
    "group": "the same name at every restart of this learner, e.g. --group ludic-learners",
    "consumer": "the same name at every restart of this learner, e.g. --consumer learner",
    "actor_id": "one name per actor, kept across its restarts, e.g. --actor-id actor-0",
}


def check_learner_counts(cfg: LearnerConfig) -> None:
    """The learner's checks that import nothing heavy: counts below 1 (`--checkpoint-every` in
    its own words: it is an interval, and a run without checkpoints still trains), an `--lr`
    that is not a finite number > 0 (the trainer refused it only after Redis and the model,
    naming its own field: `lr must be > 0`), a `--lease-ttl-s` <= 0, a negative `--max-lag`,
    dr_grpo without `--max-tokens`, an unused `--max-tokens`."""
    check_key_names(stream=cfg.stream, group=cfg.group, consumer=cfg.consumer)
    check_count_flags(
        ("--steps", cfg.steps, "optimizer steps of the whole run, e.g. --steps 100"),
        ("--batch-size", cfg.batch_size, "samples per optimizer step on each rank, e.g. 32"),
        ("--publish-every", cfg.publish_every, "optimizer steps between weight pushes, e.g. 1"),
        ("--server-ranks", cfg.server_ranks, "weight-receiving ranks per server, e.g. 1"),
        ("--max-tokens", cfg.max_tokens, "the actors' --max-tokens, e.g. 128"),
    )
    check_micro_batch_tokens(cfg.micro_batch_tokens)  # a token budget, in its own words
    every = cfg.checkpoint_every
    if every is not None and every < 1:
        raise ValueError(
            f"--checkpoint-every is {every}: a checkpoint every {every} steps is no interval; "
            f"give a count of steps >= 1, leave it out (a checkpoint every "
            f"{LearnerConfig().checkpoint_every} steps) or pass --checkpoint-every None (none)"
        )
    check_lr(cfg.lr, "1e-5")
    _check_learner_reals(cfg)
    if not cfg.lease_ttl_s > 0:  # nan too
        raise ValueError(
            f"--lease-ttl-s is {cfg.lease_ttl_s}: pass seconds > 0 (how long a killed "
            "learner's consumer name stays held; 15 by default)"
        )
    if cfg.max_lag is not None and cfg.max_lag < 0:
        raise ValueError(
            f"--max-lag is {cfg.max_lag}: pass --max-lag >= 0 (0: train only on samples of the "
            "current policy, 4 by default) or --max-lag None (never stale)"
        )
    if cfg.algorithm in MAX_TOKENS_PRESETS and cfg.max_tokens is None:
        raise ValueError(
            f"--algorithm {cfg.algorithm} divides its loss by the actors' generation budget: "
            "pass --max-tokens with the value the actors run with (`ludic actor --max-tokens`, "
            "128 by default); the learner refuses samples generated with another"
        )
    if cfg.algorithm not in MAX_TOKENS_PRESETS and cfg.max_tokens is not None:
        logger.warning(
            "--max-tokens %d is unused: only %s's loss divides by the generation budget, "
            "and this learner trains --algorithm %s",
            cfg.max_tokens,
            "/".join(sorted(MAX_TOKENS_PRESETS)),
            cfg.algorithm,
        )


def _check_learner_reals(cfg: LearnerConfig) -> None:
    """Refuse the learner's seconds, fractions and sizes out of range, naming the flag."""
    check_server_wait(cfg.server_wait_s, "learner")
    if cfg.max_wait_s is not None and not cfg.max_wait_s > 0:  # nan too
        raise ValueError(
            f"--max-wait-s is {cfg.max_wait_s}: pass seconds > 0 (how long the learner waits "
            "without a sample before it stops) or leave it out (None: wait forever)"
        )
    if not 0 <= cfg.stale_decay <= 1:
        raise ValueError(
            f"--stale-decay is {cfg.stale_decay}: pass a factor in [0, 1] (a stale sample's "
            "weight is multiplied by it per version beyond --max-lag; 0.5 by default)"
        )
    if not (math.isfinite(cfg.bucket_mb) and cfg.bucket_mb > 0):
        raise ValueError(
            f"--bucket-mb is {cfg.bucket_mb}: pass a finite size > 0 in MiB (one weight "
            "broadcast; 64 by default)"
        )
    if not (math.isfinite(cfg.verify_atol) and cfg.verify_atol >= 0):
        raise ValueError(
            f"--verify-atol is {cfg.verify_atol}: pass a finite logprob gap >= 0 (the largest "
            "accepted between server and learner after a push; 1e-3 by default)"
        )
