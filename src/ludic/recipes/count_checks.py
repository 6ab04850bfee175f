"""The refusal of a count flag below 1, in one wording for `ludic train`, `ludic actor` and
`ludic learner`. It imports nothing (no torch), so the pipeline commands refuse their counts
before Redis or a model is touched; it does not know which flags a command has."""

from __future__ import annotations


def check_count_flags(*counts: tuple[str, int | None, str]) -> None:
    """Refuse the first `(flag, value, what it counts)` whose value is below 1 (None: the
    flag is off), naming the flag and the fix."""
    for flag, value, fix in counts:
        if value is not None and value < 1:
            raise ValueError(f"{flag} is {value}, so nothing would train: pass {flag} >= 1 ({fix})")
