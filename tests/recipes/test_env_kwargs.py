"""`--env-kwargs` of `ludic train`, `ludic eval` and `ludic actor`: one parser
(`ludic.recipes.configs.parse_env_kwargs`), so text that is not a JSON object is refused by
each command before any work, naming the flag and showing the text."""

from __future__ import annotations

import sys
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
    from ludic.eval.env_spec import check_env_kwargs

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


def make_nothing(size: int = 3) -> None:
    """A user's factory that forgot its `return`."""


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--no-progress"],
        ["eval", "--no-progress"],
        ["actor", "--redis-url", "redis://127.0.0.1:1/0", "--batches", "1"],
    ],
)
@pytest.mark.parametrize("explicit", [False, True])  # no --parser/--context auto lookup
def test_a_factory_that_returns_no_env_is_refused_naming_what_it_returned(
    command: list[str], explicit: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was an AttributeError traceback ('NoneType' object has no attribute 'close'), from
    `ludic train` up front and from `ludic eval` after the model loaded; `ludic actor` with
    explicit --parser and --context failed inside every episode instead."""
    monkeypatch.setitem(sys.modules, "forgetful_env", sys.modules[__name__])
    flags = ["--parser", "identity", "--context", "full"] if explicit else []
    env = ["--env", "forgetful_env:make_nothing", "--env-kwargs", '{"size": 4}']
    out = [] if command[0] == "actor" else ["--out-dir", str(tmp_path)]
    with pytest.raises(ValueError, match=r"make_nothing' returned None, not an env") as refused:
        ludic_main([*command, *flags, *out, *env])
    assert "return" in str(refused.value).split("not an env")[1]  # the likely fix
    assert not any(tmp_path.iterdir())


def test_a_factory_missing_its_arguments_says_to_pass_them() -> None:
    from ludic.eval.env_spec import check_env_kwargs

    def make_maze(size: int) -> None: ...

    with pytest.raises(ValueError, match=r"missing a required argument: 'size'") as refused:
        check_env_kwargs(make_maze, {})
    assert "--env-kwargs '{\"size\": ...}'" in str(refused.value)


def test_an_env_whose_agent_ids_answer_only_after_reset_is_an_env() -> None:
    """The not-an-env check looks at the type: a property that needs `reset` first (raising
    AttributeError before) must not make a real env read as 'not an env'."""
    from ludic.envs import SingleAgentEnv
    from ludic.eval.env_spec import _check_is_env

    class LateIds(SingleAgentEnv):
        @property
        def agent_ids(self) -> list[str]:
            return list(self._ids)  # set by reset

        def env_reset(self, seed: int | None = None) -> tuple[str, dict[str, object]]:
            self._ids = ["agent_0"]
            return "obs", {}

        def env_step(self, action: str) -> object:
            raise NotImplementedError

    _check_is_env(LateIds(), LateIds)
    with pytest.raises(ValueError, match="not an env"):
        _check_is_env(None, make_nothing)
