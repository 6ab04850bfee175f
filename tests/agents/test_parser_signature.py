"""A parser that cannot be called as `parser(reply)` is refused when the Agent is built. The
usual slip: `parser = xml_tag_parser("move")` in an env's class body (the form `--parser auto`
documents) read from an instance, `Agent(client, parser=env.parser)`, binds it as a method; each
reply then raised TypeError inside the parser and counted as a parse failure, so the run
trained on the penalty with one log line to say why."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.parsers import xml_tag_parser
from ludic.types import Info, ParseResult, StepOutcome


class MoveEnv(SingleAgentEnv):
    parser = xml_tag_parser("move")

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", terminated=True)

    def method_parser(self, text: str) -> ParseResult:
        return ParseResult(action=text, reward=0.0)


def test_a_class_attribute_parser_read_from_an_instance_is_refused_naming_the_fix() -> None:
    with pytest.raises(
        TypeError,
        match=r"bound to an instance of MoveEnv.*MoveEnv\.parser.*"
        r"staticmethod",
    ):
        Agent(ScriptedClient(["<move>1</move>"]), parser=MoveEnv().parser)


def test_a_method_taken_from_the_class_is_refused() -> None:
    with pytest.raises(TypeError, match=r"MoveEnv.method_parser\(self, text.*one argument"):
        Agent(ScriptedClient(["x"]), parser=MoveEnv.method_parser)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "parser",
    [MoveEnv.parser, str.strip, lambda text, *, strict=False: ParseResult(action=text, reward=0)],
)
def test_parsers_that_take_the_reply_are_accepted(parser: object) -> None:
    Agent(ScriptedClient(["x"]), parser=parser)  # type: ignore[arg-type]
