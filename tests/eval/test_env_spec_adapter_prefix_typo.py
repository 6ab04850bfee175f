"""`--env gym:FrozenLake-v1` (no module `gym`) names the adapter prefix it most likely meant, and
`--env lights:LightEnv` the name in the module it most likely meant,
instead of only "cannot import module 'gym'" or "has no attribute 'LightEnv'"."""

from __future__ import annotations

from pathlib import Path

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


def test_a_misspelt_name_in_the_module_names_the_closest_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lamps_env.py").write_text("class LightsEnv:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as caught:
        resolve_env_factory("lamps_env:LightEnv")
    assert str(caught.value) == (
        "module 'lamps_env' has no attribute 'LightEnv'; did you mean 'LightsEnv'?"
    )
    with pytest.raises(ValueError) as unrelated:
        resolve_env_factory("lamps_env:Zzz")
    assert str(unrelated.value) == "module 'lamps_env' has no attribute 'Zzz'"
