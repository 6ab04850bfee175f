"""`--env PREFIX:TARGET` resolution without any ecosystem installed: built-in names and
`module:factory` strings keep working, and empty targets say why."""

from __future__ import annotations

import pytest

from ludic.envs import GuessNumberEnv
from ludic.envs.registry import ADAPTER_PREFIXES, adapter_spec
from ludic.eval.env_spec import resolve_env_factory


def test_builtin_names_and_module_factories_are_not_adapters() -> None:
    assert adapter_spec("tictactoe") is None
    assert adapter_spec("ludic.envs:GuessNumberEnv") is None
    assert resolve_env_factory("ludic.envs:GuessNumberEnv") is GuessNumberEnv


def test_every_prefix_names_an_importable_adapter_module() -> None:
    import importlib

    for module in ADAPTER_PREFIXES.values():
        assert callable(importlib.import_module(module).env_spec)


def test_an_empty_target_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="names no env after 'gymnasium:'"):
        adapter_spec("gymnasium:")
    with pytest.raises(ValueError, match=r"names no env after 'verifiers:'.*verifiers:my_taskset"):
        adapter_spec("verifiers:")
