"""`--parser auto` refuses an env class's `def parser(self, text)` method where it picks the
parser (naming the env's file and the fix), for an env class used as its own factory and for
a factory function whose env's class declares it; every episode used to fail in the Agent."""

from __future__ import annotations

import pytest

from ludic.envs import SingleAgentEnv
from ludic.eval.env_spec import declared_parser, resolve_parser
from ludic.types import Info, ParseResult, StepOutcome


class MethodParserEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True)

    def parser(self, text: str) -> ParseResult:
        return ParseResult(action=text, reward=0.0, obs=None)


def method_parser_env() -> MethodParserEnv:
    return MethodParserEnv()


def test_auto_refuses_a_self_method_naming_the_file() -> None:
    with pytest.raises(TypeError, match=r"--parser auto: MethodParserEnv.parser \(") as err:
        resolve_parser("auto", MethodParserEnv)
    assert f"{__file__}:" in str(err.value) and "@staticmethod" in str(err.value)


def test_auto_refuses_it_through_a_factory_function() -> None:
    with pytest.raises(TypeError, match=r"MethodParserEnv.parser \(.*\) is MethodParserEnv"):
        declared_parser(method_parser_env, {})
