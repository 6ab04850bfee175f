"""Built-in envs refuse settings of the wrong type at construction, naming the argument
(`TicTacToeEnv(epsilon="0.2")` used to fail only in reset/step with "'<=' not supported"), and
the annotation check behind it (`ludic.envs.arg_types`) follows the rules `--env-kwargs` uses."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from ludic.envs.arg_types import annotations_of, describe, fits, mismatches
from ludic.envs.guess_number import GuessNumberEnv
from ludic.envs.key_door import KeyDoorGridEnv
from ludic.envs.tictactoe import TicTacToeEnv


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: TicTacToeEnv(epsilon="0.2"),
            "TicTacToeEnv: epsilon must be float (or int), got '0.2' (str); pass epsilon=0.2",
        ),
        (
            lambda: TicTacToeEnv(win_reward=None),
            "TicTacToeEnv: win_reward must be float (or int), got None",
        ),
        (
            lambda: TicTacToeEnv(opponent=1),
            "TicTacToeEnv: opponent must be one of 'random', 'minimax', 'mixed', got 1 (int)",
        ),
        (
            lambda: GuessNumberEnv(max_number="8"),
            "GuessNumberEnv: max_number must be int, got '8' (str); pass max_number=8",
        ),
        (
            lambda: GuessNumberEnv(max_number=8.0),
            "GuessNumberEnv: max_number must be int, got 8.0 (float)",
        ),
        (
            lambda: GuessNumberEnv(max_number=True),
            "GuessNumberEnv: max_number must be int, got True (bool)",
        ),
        (
            lambda: KeyDoorGridEnv(layout="1"),
            "KeyDoorGridEnv: layout must be int or None, got '1' (str); pass layout=1",
        ),
        (
            lambda: KeyDoorGridEnv(step_penalty="0.1"),
            "KeyDoorGridEnv: step_penalty must be float (or int)",
        ),
    ],
)
def test_a_wrong_type_is_a_type_error_naming_the_argument(build: Any, message: str) -> None:
    with pytest.raises(TypeError) as caught:
        build()
    assert str(caught.value).startswith(message)


def test_a_literal_value_of_the_right_type_is_left_to_the_constructor_s_value_error() -> None:
    with pytest.raises(ValueError, match=r"opponent must be one of .*got 'best'"):
        TicTacToeEnv(opponent="best")  # type: ignore[arg-type]


def test_right_types_build_and_play() -> None:
    env = TicTacToeEnv(epsilon=0, opponent="mixed", win_reward=2)  # an int is a float
    assert env.epsilon == 0
    assert GuessNumberEnv(max_number=8).max_number == 8
    assert KeyDoorGridEnv(layout=None, step_penalty=0).fixed_layout is None
    env.reset(seed=0)


def test_fits_follows_the_rules() -> None:
    assert fits(1, float) and fits(1.5, float) and not fits(True, float) and not fits("1", float)
    assert fits(1, int) and not fits(True, int) and not fits(1.0, int)
    assert fits(False, bool) and not fits(0, bool)
    assert fits(None, int | None) and fits(3, int | None) and not fits("3", int | None)
    assert fits("X", Literal["X", "O"]) and not fits("Y", Literal["X", "O"])
    assert not fits(1, Literal[True]) and fits(True, Literal[True])
    assert fits([1, 2], tuple[int, ...]) and fits((1, 2), tuple[int, int])
    assert not fits([1, "2"], tuple[int, int]) and not fits([1], tuple[int, int])
    assert fits(["a"], list[str]) and not fits("a", list[str])
    assert fits({"a": 1}, dict[str, int]) and not fits({"a": "1"}, dict[str, int])
    assert fits(object(), TicTacToeEnv)  # an annotation it does not know accepts anything
    assert describe(int | None) == "int or None"
    assert describe(Literal["X", "O"]) == "one of 'X', 'O'"


def _annotated(*, size: int = 3, name: str = "a") -> None:
    return None


def _open(**kwargs: Any) -> None:
    return None


def _bare(size=3):  # type: ignore[no-untyped-def]
    return None


def test_mismatches_reads_the_factory_annotations_and_skips_kwargs_and_unannotated() -> None:
    assert mismatches(_annotated, {"size": "3", "name": "b"}) == [("size", int)]
    assert mismatches(_open, {"size": "3"}) == []
    assert mismatches(_bare, {"size": "3"}) == []
    assert "epsilon" in annotations_of(TicTacToeEnv)  # a class: through its __init__
