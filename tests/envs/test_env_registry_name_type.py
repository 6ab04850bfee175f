"""`env_parser(None)` and `make_env(None)` raise a TypeError naming what to pass, not
"'NoneType' object has no attribute 'partition'" from inside the adapter lookup."""

from __future__ import annotations

from typing import Any

import pytest

from ludic.envs.registry import env_parser, make_env
from ludic.envs.tictactoe import TicTacToeEnv


@pytest.mark.parametrize("name", [None, TicTacToeEnv, 3])
@pytest.mark.parametrize("function", [env_parser, make_env])
def test_a_name_that_is_not_a_str_is_a_type_error_naming_what_to_pass(
    function: Any, name: object
) -> None:
    with pytest.raises(TypeError) as refused:
        function(name)
    text = str(refused.value)
    assert text.startswith(f"{function.__name__} takes an env's name as a str")
    assert "'tictactoe'" in text and "gymnasium:FrozenLake-v1" in text
    assert f"got {name!r} ({type(name).__name__})" in text


def test_names_still_resolve() -> None:
    assert env_parser("tictactoe") is not None
    assert env_parser("memory_corridor") is None
    assert isinstance(make_env("tictactoe"), TicTacToeEnv)
    with pytest.raises(KeyError, match="no built-in env 'nope'"):
        env_parser("nope")
