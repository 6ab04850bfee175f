"""The keywords an adapter's refusal of an unknown `--env-kwargs` key lists as Ludic's own are
read from the constructor, so a keyword added to it (here by a subclass) is accepted and listed
without a hand-kept list to update."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from ludic.envs.adapters._common import own_keywords

pytest.importorskip(
    "reasoning_gym", reason="needs reasoning-gym: pip install 'ludic[reasoning-gym]'"
)
pytest.importorskip("textarena", reason="needs textarena: pip install 'ludic[textarena]'")

from ludic.envs.adapters.reasoning_gym import ReasoningGymEnv
from ludic.envs.adapters.textarena import TextArenaEnv


class HintedReasoningGymEnv(ReasoningGymEnv):
    def __init__(self, name: str, *, hint: str = "", **kwargs: Any) -> None:
        self.hint = hint
        super().__init__(name, **kwargs)


class HintedTextArenaEnv(TextArenaEnv):
    def __init__(self, env_id: str, *, hint: str = "", **kwargs: Any) -> None:
        self.hint = hint
        super().__init__(env_id, **kwargs)


def _keyword_only(cls: type) -> list[str]:
    params = inspect.signature(cls).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def test_the_listed_keywords_are_the_constructors() -> None:
    assert own_keywords(ReasoningGymEnv, ReasoningGymEnv) == _keyword_only(ReasoningGymEnv)
    assert own_keywords(TextArenaEnv, TextArenaEnv) == _keyword_only(TextArenaEnv)
    assert own_keywords(HintedTextArenaEnv, TextArenaEnv) == [
        "hint",
        *_keyword_only(TextArenaEnv),
    ]


def test_a_keyword_added_to_a_reasoning_gym_constructor_is_accepted_and_listed() -> None:
    env = HintedReasoningGymEnv("countdown", hint="think", size=3)
    assert env.hint == "think" and len(env.dataset) == 3
    with pytest.raises(ValueError, match="no config field not_a_field") as caught:
        HintedReasoningGymEnv("countdown", not_a_field=1)
    listed = str(caught.value).split("and Ludic's: ")[1].split(", ")
    assert listed == ["hint", *_keyword_only(ReasoningGymEnv)]


def test_a_keyword_added_to_a_textarena_constructor_is_accepted_and_listed() -> None:
    env = HintedTextArenaEnv("TicTacToe-v0", hint="think", opponent_seed=1)
    assert env.hint == "think" and env.agent_ids == ("player_0",)
    with pytest.raises(ValueError, match="takes no keyword llm_seat") as caught:
        HintedTextArenaEnv("TicTacToe-v0", llm_seat=[0])
    listed = str(caught.value).split("Ludic's TextArenaEnv ")[1].split(", ")
    assert listed == ["hint", *_keyword_only(TextArenaEnv)]
