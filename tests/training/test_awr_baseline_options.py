"""`make_awr` warns of an option that its baseline never reads (`state_prior` without state /
state_action, the value model's options without value / q_value, `featurize_action` without
q_value), naming the option and the baselines that read it (`UnreadOptionWarning`: a grid
over baselines passes every option to every arm); an option left out (None) takes
`AWRCredit`'s default with every baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any, get_args

import pytest

from ludic.training import AWRCredit, UnreadOptionWarning, make_awr
from ludic.training.credit.awr import BASELINE_OPTIONS, AWRBaseline
from ludic.training.credit.value import MLPValueFitter
from ludic.types import Turn


def board(turn: Turn) -> Sequence[object]:
    return [turn.observation]


GIVEN: dict[str, Any] = {
    "state_prior": 4.0,
    "value_folds": 3,
    "value_seed": 7,
    "featurize": board,
    "featurize_action": board,
    "fit_value": MLPValueFitter(hidden=4),
}
BASELINES: tuple[AWRBaseline, ...] = get_args(AWRBaseline)
UNREAD = [(o, b) for o in GIVEN for b in BASELINES if b not in BASELINE_OPTIONS[o]]
READ = [(o, b) for o in GIVEN for b in BASELINES if b in BASELINE_OPTIONS[o]]


@pytest.mark.parametrize(("option", "baseline"), UNREAD)
def test_an_option_the_baseline_ignores_is_named(option: str, baseline: AWRBaseline) -> None:
    with pytest.warns(UnreadOptionWarning) as caught:
        algorithm = make_awr(baseline=baseline, **{option: GIVEN[option]})
    assert algorithm.credit_assigner.baseline == baseline  # type: ignore[attr-defined]
    readers = BASELINE_OPTIONS[option]
    text = str(caught[0].message)
    assert text.startswith(f"AWRCredit: {option}="), text
    assert f"only baseline {' or '.join(map(repr, readers))} reads it, not {baseline!r}" in text
    assert text.endswith(f"pass baseline={readers[0]!r})")


def test_the_warning_names_the_value_and_a_function_by_its_name() -> None:
    with pytest.warns(UnreadOptionWarning, match=r"^AWRCredit: value_folds=3 is ignored: "):
        make_awr(baseline="group", value_folds=3)
    with pytest.warns(UnreadOptionWarning, match=r"^AWRCredit: featurize_action=board is "):
        make_awr(baseline="value", featurize=board, featurize_action=board)


@pytest.mark.parametrize(("option", "baseline"), READ)
def test_an_option_the_baseline_reads_is_taken(option: str, baseline: AWRBaseline) -> None:
    credit = make_awr(baseline=baseline, **{option: GIVEN[option]}).credit_assigner
    assert getattr(credit, option) is GIVEN[option]


@pytest.mark.parametrize("baseline", BASELINES)
def test_options_left_out_take_the_credit_defaults(baseline: AWRBaseline) -> None:
    credit = make_awr(baseline=baseline).credit_assigner
    default = AWRCredit(baseline=baseline)
    for option in BASELINE_OPTIONS:
        assert getattr(credit, option) == getattr(default, option), option


def test_the_table_names_credit_fields_and_baselines() -> None:
    names = {f.name for f in fields(AWRCredit)}
    assert set(BASELINE_OPTIONS) <= names
    assert set(GIVEN) == set(BASELINE_OPTIONS)
    assert all(set(readers) <= set(BASELINES) for readers in BASELINE_OPTIONS.values())


def test_a_bad_value_is_still_named_by_the_credit_check() -> None:
    with pytest.raises(ValueError, match=r"^AWRCredit: value_folds must be >= 2"):
        make_awr(baseline="value", value_folds=1)
