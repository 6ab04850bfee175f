"""README walk (walkC): an unusable `--actor-id`, `--group` or `--consumer` was refused with
"pass the same name to the actors and the learner", which holds for `--stream` alone: the
learner takes no `--actor-id`, and actors take no `--group` or `--consumer`."""

from __future__ import annotations

import pytest

from ludic.errors import LudicUsageError
from ludic.pipeline.flag_checks import check_key_names


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("stream", "the same name to the actors and the learner, e.g. --stream ludic:samples"),
        ("group", "at every restart of this learner, e.g. --group ludic-learners"),
        ("consumer", "at every restart of this learner, e.g. --consumer learner"),
        ("actor_id", "one name per actor, kept across its restarts, e.g. --actor-id actor-0"),
    ],
)
def test_each_name_gets_the_fix_that_fits_it(name: str, fix: str) -> None:
    with pytest.raises(LudicUsageError) as refused:
        check_key_names(**{name: " x"})
    text = str(refused.value)
    assert fix in text, text
    if name != "stream":
        assert "to the actors and the learner" not in text, text
