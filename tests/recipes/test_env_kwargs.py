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
