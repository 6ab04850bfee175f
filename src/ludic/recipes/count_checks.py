"""The refusal of a count flag below 1, in one wording for `ludic train`, `ludic actor` and
`ludic learner`. It imports nothing (no torch), so the pipeline commands refuse their counts
before Redis or a model is touched; it does not know which flags a command has. A flag whose
value is not a count of things to train on (`--micro-batch-tokens`, a budget) gets its own
words instead of "so nothing would train"."""

from __future__ import annotations

import math


def check_count_flags(*counts: tuple[str, int | None, str]) -> None:
    """Refuse the first `(flag, value, what it counts)` whose value is below 1 (None: the
    flag is off), naming the flag and the fix."""
    for flag, value, fix in counts:
        if value is not None and value < 1:
            if flag == "--micro-batch-tokens":
                raise ValueError(_micro_batch_refusal(value))
            raise ValueError(f"{flag} is {value}, so nothing would train: pass {flag} >= 1 ({fix})")


def check_lr(lr: float, example: str) -> None:
    """Refuse an `--lr` that is not a finite number > 0 (nan and inf too), naming the flag and
    an `example` peak that works for the command."""
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {lr} (the peak, e.g. {example})")


def _micro_batch_refusal(value: int) -> str:
    """`--micro-batch-tokens` is the token budget of one forward/backward, not a count of
    samples: below 1 no micro-batch could hold a sample."""
    from ludic.recipes.configs import DEFAULT_MICRO_BATCH_TOKENS  # only when refusing

    return (
        f"--micro-batch-tokens is {value}: a micro-batch of {value} tokens holds no sample; give "
        f"a token budget per forward/backward >= 1, leave it out for "
        f"{DEFAULT_MICRO_BATCH_TOKENS}, or pass --micro-batch-tokens None for the whole batch "
        "in one pass"
    )
