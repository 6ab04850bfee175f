"""GymnasiumEnv's `action_names` is a list of names, one per action. A str was split into its
characters without a word (`action_names="LDRU"` named FrozenLake's actions L, D, R and U, and
"Left" was then an illegal action); names that are not strings crashed the parser on the first
reply, and two names equal but for case left the second action out of reach."""

from __future__ import annotations

import pytest

from ludic.envs.adapters import GymnasiumEnv

pytest.importorskip("gymnasium", reason="needs gymnasium: pip install 'ludic[gymnasium]'")


def test_a_str_is_refused_with_the_list_to_pass() -> None:
    with pytest.raises(TypeError, match=r"got str 'LDRU'.*action_names=\['Left'") as caught:
        GymnasiumEnv("FrozenLake-v1", action_names="LDRU")
    assert '{"action_names": ["Left"' in str(caught.value)  # the --env-kwargs form too


@pytest.mark.parametrize(
    ("names", "error", "named"),
    [
        ([0, 1, 2, 3], TypeError, "non-empty strings, got 0"),
        (["Left", "", "Right", "Up"], TypeError, "non-empty strings, got ''"),
        (["go", "Go", "stop", "wait"], ValueError, r"repeats \['Go', 'go'\]"),
        (["Left", "Down"], ValueError, "2 names for 4 actions"),
    ],
)
def test_names_the_parser_could_not_use_are_refused(
    names: list[object], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        GymnasiumEnv("FrozenLake-v1", action_names=names)  # type: ignore[arg-type]


def test_a_list_or_tuple_of_names_is_taken_as_given() -> None:
    for names in (["W", "S", "E", "N"], ("W", "S", "E", "N")):
        env = GymnasiumEnv("FrozenLake-v1", action_names=names)
        assert env.action_names == ("W", "S", "E", "N")
        assert env.parser("<action>e</action>").action == "E"
