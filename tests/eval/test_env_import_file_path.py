"""`--env ./my_env.py:make_env` (a path where a module name belongs) was a raw TypeError
traceback from importlib ("the 'package' argument is required to perform a relative
import"), and `my_env.py:make_env` a "No module named 'my_env.py'" that never said to drop
the suffix; both are now refused naming the module name to write and where to run from."""

from __future__ import annotations

import pytest

from ludic.eval.env_spec import import_object, resolve_env_factory


@pytest.mark.parametrize(
    ("spec", "write", "where"),
    [
        ("./my_env.py:make_env", "'my_env:make_env'", "the folder that holds it"),
        ("my_env.py:make_env", "'my_env:make_env'", "the folder that holds it"),
        ("envs/my_env.py:make_env", "'my_env:make_env'", "envs"),
        ("/abs/envs/my_env:make_env", "'my_env:make_env'", "/abs/envs"),
        (".my_env:make_env", "'my_env:make_env'", "the folder that holds it"),
    ],
)
def test_a_file_path_is_refused_naming_the_module_to_write(
    spec: str, write: str, where: str
) -> None:
    with pytest.raises(ValueError) as refused:
        resolve_env_factory(spec)
    message = str(refused.value)
    assert f"{spec!r} names a file, not a module: write the module name, {write}" in message
    assert f"run from {where} " in message


def test_a_module_name_still_imports() -> None:
    from ludic.envs import TicTacToeEnv

    assert import_object("ludic.envs:TicTacToeEnv") is TicTacToeEnv
