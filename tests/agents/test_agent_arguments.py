"""Agent refuses a client or parser of the wrong kind at construction, naming the fix.

Without the check, a model name passed as the client failed on every episode with an
AttributeError, and a parser passed as a string made every reply a silent parse failure."""

from __future__ import annotations

import pytest

from ludic.agents import Agent, ReActAgent, ToolAgent
from ludic.envs import env_parser
from ludic.inference import ScriptedClient
from ludic.parsers import xml_tag_parser


@pytest.mark.parametrize("cls", [Agent, ToolAgent, ReActAgent])
def test_a_model_name_as_client_is_refused(cls: type[Agent]) -> None:
    with pytest.raises(TypeError, match=r"needs a ChatClient.*got str 'gpt-4o'.*ScriptedClient"):
        cls("gpt-4o", parser=xml_tag_parser("answer"))  # type: ignore[arg-type]


@pytest.mark.parametrize("parser", ["xml", None, 3])
def test_a_parser_that_is_not_callable_is_refused(parser: object) -> None:
    with pytest.raises(TypeError, match=r"parser must be a callable.*xml_tag_parser"):
        Agent(ScriptedClient(["x"]), parser=parser)  # type: ignore[arg-type]


def test_valid_arguments_still_build() -> None:
    agent = Agent(ScriptedClient(["<move>5</move>"]), parser=env_parser("tictactoe"))
    assert callable(agent.parser)
    assert Agent(ScriptedClient(["x"])).parser("anything").action == "anything"
