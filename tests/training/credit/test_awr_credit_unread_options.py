"""`AWRCredit` built directly names an option its baseline never reads by an
`UnreadOptionWarning`, as `make_awr` does (one table, `BASELINE_OPTIONS`): set away from its
default it changes nothing, and a grid over baselines passes it to every arm, so it warns
rather than refuses. An option left at its default, or passed equal to it, is not given and is
taken by every baseline. `check_baseline_options` (for a command line) still refuses it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, get_args

import pytest

from ludic.training import AWRCredit, UnreadOptionWarning, make_awr
from ludic.training.credit.awr import (
    BASELINE_OPTIONS,
    AWRBaseline,
    UnreadAWROptionError,
    check_baseline_options,
)
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
def test_awr_credit_warns_of_an_option_its_baseline_ignores(
    option: str, baseline: AWRBaseline
) -> None:
    readers = BASELINE_OPTIONS[option]
    with pytest.warns(UnreadOptionWarning) as caught:
        credit = AWRCredit(baseline=baseline, **{option: SET[option]})
    assert getattr(credit, option) is SET[option]  # built: a grid's arm runs
    text = str(caught[0].message)
    assert text.startswith(f"AWRCredit: {option}="), text
    assert f"only baseline {' or '.join(map(repr, readers))} reads it, not {baseline!r}" in text
    assert text.endswith(f"(drop it, or pass baseline={readers[0]!r})"), text


@pytest.mark.parametrize(("option", "baseline"), UNREAD)
def test_the_command_line_check_still_refuses_it(option: str, baseline: AWRBaseline) -> None:
    with pytest.raises(UnreadAWROptionError) as refused:
        check_baseline_options(baseline, {option: SET[option]})
    readers = BASELINE_OPTIONS[option]
    assert (refused.value.option, refused.value.baseline, refused.value.readers) == (
        option,
        baseline,
        readers,
    )
    assert str(refused.value).endswith(f"drop it or pass baseline={readers[0]!r}")


def test_the_warning_shows_the_value_and_a_function_by_its_name() -> None:
    with pytest.warns(UnreadOptionWarning, match=r"^AWRCredit: state_prior=4\.0 is ignored: "):
        AWRCredit(baseline="mean", state_prior=4.0)
    with pytest.warns(UnreadOptionWarning, match=r"^AWRCredit: featurize=board is ignored: "):
        AWRCredit(baseline="state", featurize=board)


def test_a_grid_over_baselines_builds_every_arm() -> None:
    """Every baseline with every option set: each arm builds, each unread option is named."""
    with pytest.warns(UnreadOptionWarning):
        arms = [make_awr(baseline=baseline, **SET) for baseline in BASELINES]
    assert [arm.credit_assigner.baseline for arm in arms] == list(BASELINES)  # type: ignore[attr-defined]


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


def test_replace_to_a_baseline_that_ignores_a_set_option_warns() -> None:
    value = AWRCredit(baseline="value", value_folds=3)
    with pytest.warns(UnreadOptionWarning, match=r"value_folds=3 .* not 'state'"):
        replace(value, baseline="state")
    assert replace(value, baseline="q_value").value_folds == 3


@pytest.mark.parametrize("baseline", BASELINES)
def test_a_value_no_baseline_could_use_is_still_refused(baseline: AWRBaseline) -> None:
    """A grid only needs unread knobs to pass: a bad value is refused with every baseline."""
    with pytest.raises(ValueError, match=r"^AWRCredit: state_prior must be finite and > 0"):
        AWRCredit(baseline=baseline, state_prior=-1.0)
    with pytest.raises(ValueError, match=r"^AWRCredit: value_folds must be >= 2"):
        make_awr(baseline=baseline, value_folds=1)
