"""`--env gym:FrozenLake-v1` (no module `gym`) names the adapter prefix it most likely meant,
instead of only the failed import of a module called `gym`."""

from __future__ import annotations

import pytest

from ludic.eval.env_spec import resolve_env_factory


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("gym:FrozenLake-v1", "gymnasium:FrozenLake-v1"),
        ("reasoning-gym:countdown", "reasoning_gym:countdown"),
        ("TextArena:TicTacToe-v0", "textarena:TicTacToe-v0"),
        ("verifier:my_taskset", "verifiers:my_taskset"),
    ],
)
def test_a_misspelt_adapter_prefix_names_the_adapter(name: str, meant: str) -> None:
    with pytest.raises(ValueError, match="cannot import module") as caught:
        resolve_env_factory(name)
    assert f"Did you mean the {meant.split(':')[0]} adapter: --env {meant}?" in str(caught.value)


@pytest.mark.parametrize("name", ["lightz:LightsEnv", "g:Env"])
def test_an_unrelated_missing_module_gets_no_adapter_hint(name: str) -> None:
    with pytest.raises(ValueError, match="cannot import module") as caught:
        resolve_env_factory(name)
    assert "adapter" not in str(caught.value)
