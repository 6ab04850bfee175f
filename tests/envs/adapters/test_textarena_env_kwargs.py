"""A keyword neither TextArenaEnv nor the TextArena game takes (`--env-kwargs '{"llm_seat":
[0]}'`, a typo of llm_seats) is a refusal naming both keyword lists, not a TypeError from inside
TextArena that `ludic train` blames on the env's own code."""

from __future__ import annotations

import pytest

from ludic.errors import is_refusal

pytest.importorskip("textarena", reason="needs textarena: pip install 'ludic[textarena]'")

from ludic.envs.adapters.textarena import TextArenaEnv


def test_a_keyword_nobody_takes_is_refused_naming_both_lists() -> None:
    with pytest.raises(ValueError, match="takes no keyword llm_seat") as caught:
        TextArenaEnv("TicTacToe-v0", llm_seat=[0])
    assert "llm_seats" in str(caught.value)  # Ludic's own keywords are listed
    assert is_refusal(caught.value)


def test_the_games_own_keywords_still_pass_through() -> None:
    env = TextArenaEnv("GuessTheNumber-v0", min_number=1, max_number=5, max_turns=3)
    assert env.agent_ids == ("player_0",)
