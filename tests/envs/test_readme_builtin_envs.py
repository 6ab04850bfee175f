"""The README's list of built-in envs gives each by the name `BUILTIN_ENVS`, `env_parser` and
`--env` take (it once named the code env by its class, `CodeTestEnv`, a KeyError as a name)."""

from __future__ import annotations

import re
from pathlib import Path

from ludic.envs import BUILTIN_ENVS

README = Path(__file__).resolve().parents[2] / "README.md"
LEAD = "Built-in envs (`BUILTIN_ENVS`):"


def _builtin_envs_paragraph() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(LEAD) + len(LEAD)
    return text[start : text.index("\n\n", start)]


def test_the_readme_names_every_builtin_env_by_its_registry_name() -> None:
    named = set(re.findall(r"`([a-z_]+)`", _builtin_envs_paragraph()))
    missing = sorted(set(BUILTIN_ENVS) - named)
    assert not missing, f"README's built-in envs paragraph does not name {missing}"
