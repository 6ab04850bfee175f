"""Agent refuses a client or parser of the wrong kind at construction, naming the fix.

Without the check, a model name passed as the client failed on every episode with an
AttributeError, and a parser passed as a string made every reply a silent parse failure."""

from __future__ import annotations

import pytest

from ludic.agents import Agent, ReActAgent, ToolAgent
from ludic.envs import env_parser
from ludic.envs.long_task import MemoryCorridorEnv
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser


@pytest.mark.parametrize("cls", [Agent, ToolAgent, ReActAgent])
def test_a_model_name_as_client_is_refused(cls: type[Agent]) -> None:
    with pytest.raises(TypeError, match=r"needs a ChatClient.*got str 'gpt-4o'.*ScriptedClient"):
        cls("gpt-4o", parser=xml_tag_parser("answer"))  # type: ignore[arg-type]


@pytest.mark.parametrize("parser", ["xml", 3])
def test_a_parser_that_is_not_callable_is_refused(parser: object) -> None:
    with pytest.raises(TypeError, match=r"parser must be a callable.*xml_tag_parser"):
        Agent(ScriptedClient(["x"]), parser=parser)  # type: ignore[arg-type]


async def test_parser_none_is_the_identity_as_env_parser_promises() -> None:
    # env_parser returns None for an env without a parser ("use the completion as the
    # action"); Agent(parser=env_parser(name)) must then act on the whole reply.
    assert env_parser("memory_corridor") is None
    agent = Agent(ScriptedClient(["next"]), parser=env_parser("memory_corridor"))
    (rollout,) = await SingleAgentProtocol(agent, max_steps=1).run(MemoryCorridorEnv(), env_seed=0)
    step = rollout.env_steps[0]
    assert step.action == "next" and not step.info.get("parse_error", False)


def test_valid_arguments_still_build() -> None:
    agent = Agent(ScriptedClient(["<move>5</move>"]), parser=env_parser("tictactoe"))
    assert callable(agent.parser)
    assert Agent(ScriptedClient(["x"])).parser("anything").action == "anything"
