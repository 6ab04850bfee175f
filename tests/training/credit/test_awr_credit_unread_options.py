"""`AWRCredit` built directly refuses an option its baseline never reads, as `make_awr` does
(one table, `BASELINE_OPTIONS`): set away from its default it would change nothing, silently.
An option left at its default, or passed equal to it, is not given and is taken by every
baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, get_args

import pytest

from ludic.training import AWRCredit, make_awr
from ludic.training.credit.awr import BASELINE_OPTIONS, AWRBaseline, UnreadAWROptionError
from ludic.training.credit.value import (
    DEFAULT_VALUE_FITTER,
    MLPValueFitter,
    action_features,
    observation_features,
)
from ludic.types import Turn


def board(turn: Turn) -> Sequence[object]:
    return [turn.observation]


SET: dict[str, Any] = {
    "state_prior": 4.0,
    "value_folds": 3,
    "value_seed": 7,
    "featurize": board,
    "featurize_action": board,
    "fit_value": MLPValueFitter(hidden=4),
}
# each option passed equal to its default: not given
AS_DEFAULT: dict[str, Any] = {
    "state_prior": 1.0,
    "value_folds": 5,
    "value_seed": 0,
    "featurize": observation_features,
    "featurize_action": action_features,
    "fit_value": MLPValueFitter(),  # equal to DEFAULT_VALUE_FITTER, not the same object
}
BASELINES: tuple[AWRBaseline, ...] = get_args(AWRBaseline)
UNREAD = [(o, b) for o in SET for b in BASELINES if b not in BASELINE_OPTIONS[o]]
READ = [(o, b) for o in SET for b in BASELINES if b in BASELINE_OPTIONS[o]]


@pytest.mark.parametrize(("option", "baseline"), UNREAD)
def test_awr_credit_refuses_an_option_its_baseline_ignores(
    option: str, baseline: AWRBaseline
) -> None:
    with pytest.raises(UnreadAWROptionError) as refused:
        AWRCredit(baseline=baseline, **{option: SET[option]})
    readers = BASELINE_OPTIONS[option]
    assert (refused.value.option, refused.value.baseline, refused.value.readers) == (
        option,
        baseline,
        readers,
    )
    text = str(refused.value)
    assert text.startswith(f"AWRCredit: {option}="), text
    assert f"applies only to baseline {' or '.join(map(repr, readers))}, not {baseline!r}" in text
    assert text.endswith(f"drop it or pass baseline={readers[0]!r}"), text


def test_the_refusal_shows_the_value_and_a_function_by_its_name() -> None:
    with pytest.raises(ValueError, match=r"^AWRCredit: state_prior=4\.0 applies only to "):
        AWRCredit(baseline="mean", state_prior=4.0)
    with pytest.raises(ValueError, match=r"^AWRCredit: featurize=board applies only to "):
        AWRCredit(baseline="state", featurize=board)


@pytest.mark.parametrize(("option", "baseline"), READ)
def test_awr_credit_takes_an_option_its_baseline_reads(option: str, baseline: AWRBaseline) -> None:
    assert getattr(AWRCredit(baseline=baseline, **{option: SET[option]}), option) is SET[option]


@pytest.mark.parametrize("baseline", BASELINES)
def test_an_option_at_its_default_is_not_given(baseline: AWRBaseline) -> None:
    assert AWRCredit(baseline=baseline).fit_value is DEFAULT_VALUE_FITTER
    credit = AWRCredit(baseline=baseline, **AS_DEFAULT)
    assert credit == AWRCredit(baseline=baseline)


@pytest.mark.parametrize("baseline", BASELINES)
def test_make_awr_with_its_defaults_builds_every_baseline(baseline: AWRBaseline) -> None:
    assert make_awr(baseline=baseline).credit_assigner == AWRCredit(baseline=baseline)


def test_replace_to_a_baseline_that_ignores_a_set_option_is_refused() -> None:
    value = AWRCredit(baseline="value", value_folds=3)
    with pytest.raises(UnreadAWROptionError, match=r"value_folds=3 .* not 'state'"):
        replace(value, baseline="state")
    assert replace(value, baseline="q_value").value_folds == 3


def test_a_bad_value_is_named_before_the_unread_check() -> None:
    """The range checks come first, so a CLI flag's out-of-range value is named as such."""
    with pytest.raises(ValueError, match=r"^AWRCredit: state_prior must be finite and > 0"):
        AWRCredit(baseline="group", state_prior=-1.0)
