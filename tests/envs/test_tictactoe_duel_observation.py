"""TicTacToeDuelEnv(observation="compact"): both seats see the board as TicTacToeEnv's compact
text shows it (so a quickstart checkpoint plays self-play on the text it was trained on)."""

from __future__ import annotations

import pytest

from ludic.envs.tictactoe import TicTacToeEnv
from ludic.envs.tictactoe_duel import TicTacToeDuelEnv


def test_compact_duel_shows_the_same_text_as_the_compact_single_agent_env() -> None:
    duel = TicTacToeDuelEnv(observation="compact")
    single = TicTacToeEnv(observation="compact")
    start = duel.reset(seed=0)
    ((single_obs, _),) = single.reset(seed=0).values()
    assert start["X"][0] == single_obs == "1|2|3\n4|5|6\n7|8|9\nX to move"
    after = duel.step({"X": "5"})
    # the seat to move next sees the board and its own mark to play, nothing else
    assert after["O"].obs == after["X"].obs == "1|2|3\n4|X|6\n7|8|9\nO to move"


def test_full_duel_keeps_the_explained_text() -> None:
    duel = TicTacToeDuelEnv()
    duel.reset(seed=0)
    waiting = duel.step({"X": "5"})["O"].obs
    assert waiting.startswith("X played 5.\nYou are O.") and "Legal moves" in waiting


def test_unknown_observation_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'full' or 'compact'"):
        TicTacToeDuelEnv(observation="short")  # type: ignore[arg-type]
