"""`ludic sft --algorithm awr`: a baseline-specific `--awr-*` flag given with a baseline that
never reads it (`--awr-value-folds` without value / q_value, `--awr-state-prior` without
state / state_action) is refused naming the flag, not silently ignored."""

from __future__ import annotations

import pytest
import tyro

from ludic.recipes.configs import SFTConfig
from ludic.recipes.sft import offline_algorithm
from ludic.training import AWRCredit


def _cfg(*flags: str) -> SFTConfig:
    return tyro.cli(SFTConfig, args=["--data", "x.jsonl", "--algorithm", "awr", *flags])


@pytest.mark.parametrize(
    ("flags", "named", "fix"),
    [
        (["--awr-value-folds", "3"], "--awr-value-folds 3", "--awr-baseline value"),
        (["--awr-baseline", "state", "--awr-value-folds", "3"], "--awr-value-folds 3", "value"),
        (["--awr-state-prior", "4"], "--awr-state-prior 4.0", "--awr-baseline state"),
        (["--awr-baseline", "q_value", "--awr-state-prior", "4"], "--awr-state-prior 4.0", "state"),
    ],
)
def test_a_flag_the_baseline_ignores_is_refused(flags: list[str], named: str, fix: str) -> None:
    with pytest.raises(ValueError) as refused:
        offline_algorithm(_cfg(*flags))
    text = str(refused.value)
    assert text.startswith(f"{named} applies only to --awr-baseline "), text
    assert fix in text


@pytest.mark.parametrize(
    "flags",
    [
        ["--awr-baseline", "value", "--awr-value-folds", "3"],
        ["--awr-baseline", "q_value", "--awr-value-folds", "3"],
        ["--awr-baseline", "state", "--awr-state-prior", "4"],
        ["--awr-baseline", "state_action", "--awr-state-prior", "4"],
        ["--awr-baseline", "mean"],
    ],
)
def test_a_flag_its_baseline_reads_is_taken(flags: list[str]) -> None:
    assert offline_algorithm(_cfg(*flags)).name == "awr"


def test_a_flag_at_its_default_is_not_given_and_takes_the_credit_default() -> None:
    """The flags' defaults are `AWRCredit`'s: a flag left at its default reaches `make_awr` as
    not given, which is taken with any baseline and gives the same credit."""
    credit = offline_algorithm(_cfg("--awr-baseline", "group")).credit_assigner
    assert isinstance(credit, AWRCredit)
    default = AWRCredit()
    assert (credit.value_folds, credit.state_prior) == (default.value_folds, default.state_prior)
    flags = _cfg("--awr-baseline", "mean", "--awr-value-folds", "5", "--awr-state-prior", "1")
    assert offline_algorithm(flags).name == "awr"
