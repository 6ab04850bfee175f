"""`ludic train --parser auto` notes when the env declares no parser (the whole reply becomes
the action), and only then: an env class with a `parser`, or a registry entry that declares the
identity parser on purpose (TextArena: the reply is the move), gets no such note. The note is
printed before the model loads, so a --model that does not exist ends each run early."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ludic.cli import main as ludic_main
from ludic.envs import SingleAgentEnv
from ludic.parsers import xml_tag_parser
from ludic.types import Info, StepOutcome


class Plain(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "say a word", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=0.0, truncated=False, terminated=True, info={})


class Tagged(Plain):
    parser = xml_tag_parser("move")


def make_plain() -> Plain:
    return Plain()


def make_tagged() -> Tagged:
    return Tagged()


def _printed(env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    model = str(tmp_path / "no_model")
    with pytest.raises(FileNotFoundError, match="no model directory"):
        args = ["--out-dir", str(tmp_path / "run"), "--env", env, "--model", model]
        ludic_main(["train", "--no-progress", *args])
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "noted"),
    [
        ("parser_note_envs:make_plain", True),
        ("parser_note_envs:make_tagged", False),
        ("parser_note_envs:Tagged", False),
        ("textarena:TicTacToe-v0", False),
    ],
)
def test_the_no_parser_note_only_when_the_env_declares_none(
    env: str,
    noted: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if env.startswith("textarena:"):
        pytest.importorskip("textarena")
    monkeypatch.setitem(sys.modules, "parser_note_envs", sys.modules[__name__])
    printed = _printed(env, tmp_path, capsys)
    assert ("declares no parser" in printed) is noted, printed
