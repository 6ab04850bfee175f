"""`--env-kwargs` values of the wrong type are refused against the env factory's annotations by
every command before the model loads, naming the env, the key, the value, the type and the fix:
`{"epsilon": "0.2"}` used to fail every episode with "'<=' not supported"."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest

from ludic.cli import main as ludic_main
from ludic.eval.env_spec import check_env_kwargs, resolve_env_factory


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--no-progress"],
        ["eval", "--no-progress"],
        ["eval", "--no-progress", "--parser", "identity", "--context", "full"],
        ["actor", "--redis-url", "redis://127.0.0.1:1/0", "--batches", "1"],
    ],
)
def test_each_command_refuses_a_string_for_a_float_before_the_model_loads(
    command: list[str], tmp_path: Path
) -> None:
    out = [] if command[0] == "actor" else ["--out-dir", str(tmp_path / "run")]
    refusal = (
        "--env-kwargs: env 'tictactoe' takes 'epsilon' as float (or int), got \"0.2\" (str); "
        'write it without quotes: --env-kwargs \'{"opponent": "mixed", "epsilon": 0.2}\''
    )
    bad = ["--env", "tictactoe", "--env-kwargs", '{"opponent": "mixed", "epsilon": "0.2"}']
    with pytest.raises(ValueError) as refused:
        ludic_main([*command, *out, *bad])
    assert str(refused.value) == refusal
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize(
    ("env", "kwargs", "refusal"),
    [
        (
            "guess_number",
            {"max_number": "8"},
            "env 'guess_number' takes 'max_number' as int, got \"8\" (str); write it without "
            "quotes: --env-kwargs '{\"max_number\": 8}'",
        ),
        ("guess_number", {"max_number": 8.5}, "takes 'max_number' as int, got 8.5 (float)"),
        ("guess_number", {"max_number": True}, "takes 'max_number' as int, got true (bool)"),
        (
            "key_door",
            {"layout": "one"},
            "env 'key_door' takes 'layout' as int or None, got \"one\" (str); pass int or None "
            'for "layout" in --env-kwargs (None is null in JSON)',
        ),
        (
            "tictactoe",
            {"opponent": "best"},
            "takes 'opponent' as one of 'random', 'minimax', 'mixed', got \"best\" (str)",
        ),
        ("math_qa", {"parse_failure_ends_episode": 0}, "as bool, got 0 (int)"),
    ],
)
def test_builtin_envs_refuse_wrong_types(env: str, kwargs: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ValueError, match=r"^--env-kwargs: ") as refused:
        check_env_kwargs(resolve_env_factory(env), kwargs)
    assert refusal in str(refused.value)


def test_right_types_pass_an_int_for_a_float_and_null_for_optional() -> None:
    check_env_kwargs(resolve_env_factory("tictactoe"), {"epsilon": 1, "win_reward": 2.5})
    check_env_kwargs(resolve_env_factory("key_door"), {"layout": None})
    check_env_kwargs(resolve_env_factory("math_qa"), {"limit": 2, "verifier": "exact"})


def user_env(*, sizes: tuple[int, ...] = (3,), mode: Literal["a", "b"] = "a") -> Any:
    raise AssertionError("the kwargs check runs before the env is built")


def open_env(**kwargs: Any) -> Any:
    raise AssertionError("not built by the check")


def bare_env(size=3):  # type: ignore[no-untyped-def]
    raise AssertionError("not built by the check")


def test_a_user_factory_is_checked_by_its_annotations_unless_it_has_none_or_takes_kwargs() -> None:
    check_env_kwargs(user_env, {"sizes": [3, 4], "mode": "b"})  # a JSON array for a tuple
    with pytest.raises(ValueError, match=r"'user_env' takes 'sizes' as tuple\[int, \.\.\.\]"):
        check_env_kwargs(user_env, {"sizes": ["3"]})
    check_env_kwargs(open_env, {"size": "3"})  # **kwargs: what it passes them to decides
    check_env_kwargs(bare_env, {"size": "3"})  # no annotation: nothing to check against


def test_a_value_json_cannot_write_is_named_by_its_repr() -> None:
    """with_env also takes kwargs from Python, which may hold what JSON cannot write."""
    with pytest.raises(ValueError, match=r"got \"PosixPath\('3'\)\" \(PosixPath\)"):
        check_env_kwargs(resolve_env_factory("guess_number"), {"max_number": Path("3")})


def test_an_unknown_keyword_beside_a_value_json_cannot_write_is_still_named() -> None:
    """It raised json's "Object of type PosixPath is not JSON serializable" instead."""
    with pytest.raises(ValueError, match=r"unexpected keyword argument 'sise'.*takes max_number"):
        check_env_kwargs(resolve_env_factory("guess_number"), {"sise": Path("3")})
