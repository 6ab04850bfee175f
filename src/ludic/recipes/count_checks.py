"""The refusals of a count flag below 1 and of an `--lr` that is no peak, in one wording for
`ludic train`, `ludic actor` and `ludic learner`, and of a `--micro-batch-tokens` below 1 in
the words of the token budget it is (not a count of things to train on), and of an
`--episode-timeout-s` not above 0 (`ludic train`, `eval` and `actor`). It imports nothing
(no torch), so the pipeline commands refuse their flags before Redis or a model is touched; it
does not know which flags a command has."""

from __future__ import annotations

import math


def check_count_flags(*counts: tuple[str, int | None, str]) -> None:
    """Refuse the first `(flag, value, what it counts)` whose value is below 1 (None: the
    flag is off), naming the flag and the fix."""
    for flag, value, fix in counts:
        if value is not None and value < 1:
            raise ValueError(f"{flag} is {value}, so nothing would train: pass {flag} >= 1 ({fix})")


def check_micro_batch_tokens(value: int | None) -> None:
    """Refuse a `--micro-batch-tokens` below 1 (None: the whole batch in one pass). It is the
    token budget of one forward/backward, not a count of samples: below 1 no micro-batch could
    hold a sample."""
    if value is None or value >= 1:
        return
    from ludic.recipes.configs import DEFAULT_MICRO_BATCH_TOKENS  # only when refusing

    raise ValueError(
        f"--micro-batch-tokens is {value}: a micro-batch of {value} tokens holds no sample; give "
        f"a token budget per forward/backward >= 1, leave it out for "
        f"{DEFAULT_MICRO_BATCH_TOKENS}, or pass --micro-batch-tokens None for the whole batch "
        "in one pass"
    )


def check_lr(lr: float, example: str) -> None:
    """Refuse an `--lr` that is not a finite number > 0 (nan and inf too), naming the flag and
    an `example` peak that works for the command."""
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {lr} (the peak, e.g. {example})")


def check_episode_timeout(seconds: float | None) -> None:
    """Refuse an `--episode-timeout-s` that is not above 0 (nan too); None is no limit."""
    if seconds is not None and not seconds > 0:
        raise ValueError(
            f"--episode-timeout-s must be > 0 seconds (or None: no limit), got {seconds}"
        )
