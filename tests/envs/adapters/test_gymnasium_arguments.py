"""GymnasiumEnv's `action_names` is a list of names, one per action. A str was split into its
characters without a word (`action_names="LDRU"` named FrozenLake's actions L, D, R and U, and
"Left" was then an illegal action); names that are not strings crashed the parser on the first
reply, and two names equal but for case left the second action out of reach. An env built by
hand (`env=`) is named by its class in the system prompt (it was "environment env")."""

from __future__ import annotations

import pytest

from ludic.envs.adapters import GymnasiumEnv

gym = pytest.importorskip("gymnasium", reason="needs gymnasium: pip install 'ludic[gymnasium]'")


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


class Walk(gym.Env):  # type: ignore[misc]
    """A hand-built Gymnasium env (no registered id)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Discrete(3)
        self.action_space = gym.spaces.Discrete(2)


def test_a_hand_built_env_is_named_by_its_class_in_the_system_prompt() -> None:
    env = GymnasiumEnv(env=gym.wrappers.TimeLimit(Walk(), 3), action_names=["back", "forward"])
    assert env.env_id == "Walk"  # was "env": "You are playing the Gymnasium environment env"
    assert "Gymnasium environment Walk." in str(env.system_prompt)
