"""A flag that only one setting reads (`--gigpo.*` with `--algorithm gigpo`, `--awr-*` with
`--algorithm awr`, `--gigpo.*` with `ludic eval --credit gigpo`) is refused with another value
even when typed at its default: the config alone cannot tell that from a flag left out, so
`--gigpo.normalize-std` with GRPO used to run, silently ignored."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from ludic.cli import COMMANDS, ScopedFlags
from ludic.cli import main as ludic_main


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (
            ["train", "--no-progress", "--gigpo.normalize-std"],
            "--gigpo.normalize-std applies only to --algorithm gigpo, not 'grpo' (which would "
            "ignore it): drop it or pass --algorithm gigpo",
        ),
        (
            ["actor", "--redis-url", "redis://127.0.0.1:1/0", "--gigpo.episode-stat=trajectory"],
            "--gigpo.episode-stat applies only to --algorithm gigpo",
        ),
        (
            ["sft", "--awr-baseline", "group", "--awr_beta", "1.0"],
            "--awr-baseline --awr_beta apply only to --algorithm awr, not 'sft' (which would "
            "ignore them): drop them or pass --algorithm awr",
        ),
        (
            ["eval", "--env", "tictactoe", "--gigpo.episode-stat", "trajectory"],
            "--gigpo.episode-stat applies only to --credit gigpo, not 'none'",
        ),
    ],
)
def test_a_flag_typed_at_its_default_is_refused_before_anything_runs(
    argv: list[str], refusal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = argv[0]
    command = COMMANDS[name]
    never = replace(command, run=f"{__name__}:_never")  # the check comes first, or this fails
    monkeypatch.setitem(COMMANDS, name, never)
    extra = ["--data", str(tmp_path / "rollouts.jsonl")] if name == "sft" else []
    with pytest.raises(ValueError) as refused:
        ludic_main([*argv, *extra])
    assert refusal in str(refused.value)


def _never(cfg: object) -> None:
    raise AssertionError("the command ran before its flags were checked")


def test_the_flags_pass_with_the_setting_that_reads_them() -> None:
    scoped = ScopedFlags("--gigpo.", "algorithm", "gigpo")
    scoped.check(SimpleNamespace(algorithm="gigpo"), ["--gigpo.normalize-std"])
    scoped.check(SimpleNamespace(algorithm="grpo"), ["--env", "tictactoe"])
    assert scoped.typed(["--gigpo.state_key=env", "--gigpo.x", "--env", "--gigpo"]) == [
        "--gigpo.state_key",
        "--gigpo.x",
    ]
