"""An env class's declared parser is checked where `--parser auto` picks it: a `def parser(self,
text)` method was taken as is, and every episode then failed in the Agent ("cannot be called
as parser(reply)") without naming the env's file; a str declaration was silently no parser."""

from __future__ import annotations

import inspect

import pytest

from ludic.envs.declared_parser import DeclaredParserError, checked_declared_parser
from ludic.errors import is_refusal
from ludic.parsers import xml_tag_parser
from ludic.types import ParseResult


class MethodParserEnv:
    def parser(self, text: str) -> ParseResult:
        return ParseResult(action=text, reward=0.0, obs=None)


class StaticParserEnv:
    @staticmethod
    def parser(text: str) -> ParseResult:
        return ParseResult(action=text, reward=0.0, obs=None)


class StrParserEnv:
    parser = "xml:move"


def test_a_self_method_is_refused_naming_the_file_line_and_fix() -> None:
    with pytest.raises(DeclaredParserError) as err:
        checked_declared_parser(MethodParserEnv.parser, MethodParserEnv)
    line = MethodParserEnv.parser.__code__.co_firstlineno
    message = str(err.value)
    assert message.startswith(
        f"--parser auto: MethodParserEnv.parser ({__file__}:{line}) is MethodParserEnv.parser"
        "(self, text: 'str') -> 'ParseResult', which cannot be called as parser(reply)"
    )
    assert "@staticmethod" in message and "--parser module:function" in message
    assert isinstance(err.value, TypeError) and is_refusal(err.value)  # the CLI: one line


def test_a_str_declaration_is_refused_instead_of_meaning_no_parser() -> None:
    with pytest.raises(
        DeclaredParserError, match=r"StrParserEnv.parser \(.*\) is str 'xml:move', not a "
    ):
        checked_declared_parser(StrParserEnv.parser, StrParserEnv)


@pytest.mark.parametrize(
    "parser",
    [StaticParserEnv.parser, xml_tag_parser("move"), None],
    ids=["staticmethod", "xml_tag_parser", "none"],
)
def test_usable_declarations_pass_through(parser: object) -> None:
    assert checked_declared_parser(parser, StaticParserEnv) is parser


def test_an_owner_without_a_file_is_named_alone() -> None:
    owner = type("Built", (), {"parser": lambda self, text: None})
    owner.__module__ = "builtins"
    with pytest.raises(DeclaredParserError, match=r"^--parser auto: Built.parser is "):
        checked_declared_parser(owner.parser, owner)
    assert inspect.isfunction(owner.parser)
