"""`--env-kwargs` of `ludic train`, `ludic eval` and `ludic actor`: one parser
(`ludic.recipes.configs.parse_env_kwargs`), so text that is not a JSON object is refused by
each command before any work, naming the flag and showing the text."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.cli import main as ludic_main
from ludic.recipes.configs import parse_env_kwargs


def test_parse_env_kwargs() -> None:
    assert parse_env_kwargs('{"size": 3}') == {"size": 3}
    with pytest.raises(ValueError, match=r"--env-kwargs must be a JSON object, got '\[1\]'"):
        parse_env_kwargs("[1]")


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--no-progress"],
        ["eval", "--no-progress"],
        ["actor", "--redis-url", "redis://127.0.0.1:1/0", "--batches", "1"],
    ],
)
@pytest.mark.parametrize("text", ["{size: 3}", "[1]"])
def test_each_command_refuses_bad_env_kwargs_naming_the_flag(
    command: list[str], text: str, tmp_path: Path
) -> None:
    out = [] if command[0] == "actor" else ["--out-dir", str(tmp_path)]
    with pytest.raises(ValueError, match=r"--env-kwargs must be a JSON object, got '"):
        ludic_main([*command, *out, "--env", "tictactoe", "--env-kwargs", text])
    assert not any(tmp_path.iterdir())  # refused before anything was written


class _TwoSizes:
    """Stands in for a user's env class: what matters is its keyword arguments."""

    def __init__(self, size: int = 3, *, walls: bool = False) -> None:
        raise AssertionError("the kwargs check runs before the env is built")


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [({"sise": 4}, "unexpected keyword argument 'sise'"), ({"size": 1, "x": 2}, "'x'")],
)
def test_env_kwargs_the_factory_does_not_take_are_refused_naming_its_parameters(
    kwargs: dict[str, int], problem: str
) -> None:
    from ludic.eval.command import check_env_kwargs

    with pytest.raises(ValueError, match=r"--env-kwargs") as refused:
        check_env_kwargs(_TwoSizes, kwargs)
    text = str(refused.value)
    assert problem in text and "_TwoSizes" in text
    assert "size, walls" in text  # what it does take: the fix
    check_env_kwargs(_TwoSizes, {"size": 4, "walls": True})  # fits: nothing raised


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--no-progress"],
        ["eval", "--no-progress"],
        ["eval", "--no-progress", "--parser", "identity", "--context", "full"],  # no auto lookup
    ],
)
def test_each_command_refuses_env_kwargs_a_builtin_env_does_not_take(
    command: list[str], tmp_path: Path
) -> None:
    """Was a TypeError traceback from inside the env's constructor (train), or, for eval with
    explicit --parser and --context, every episode failing on it after the model loaded."""
    refusal = r"--env-kwargs .* env 'tictactoe': .*'colour'; it takes agent_mark"
    bad = ["--env", "tictactoe", "--env-kwargs", '{"colour": "red"}']
    with pytest.raises(ValueError, match=refusal):
        ludic_main([*command, "--out-dir", str(tmp_path), *bad])
    assert not any(tmp_path.iterdir())  # refused before anything was written
