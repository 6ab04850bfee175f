"""The parser an env class declares (`parser = ...` in its body), checked where `--parser auto`
picks it, so a declaration no Agent can use is refused naming the env's file and the fix
instead of failing every episode later in the Agent. It does not pick the parser itself
(`ludic.eval.env_spec.declared_parser` does)."""

from __future__ import annotations

import inspect

from ludic.errors import LudicUsageError
from ludic.parsers import Parser, parser_name, takes_one_text


class DeclaredParserError(LudicUsageError, TypeError):
    """`--parser auto`'s refusal of an env's parser declaration: a usage error, so the CLI
    prints its message alone, and a TypeError, as the Agent's check of the same parser is."""


def checked_declared_parser(parser: object, owner: object) -> Parser | None:
    """`parser`, as `owner` (an env class or factory) declares it for `--parser auto`, when a
    reply alone can be passed to it; None when it declares none. A declaration that is not a
    parser is refused with a DeclaredParserError (the CLI's one-line refusal) naming the file and
    the fix: a `def parser(self, text)` method (read from the class, it wants the env first)
    or a value that is not callable (a str such as "xml:move" was taken as no parser at all).
    """
    if parser is None:
        return None
    where = f"--parser auto: {_declared_at(owner, parser)}"
    if not callable(parser):
        raise DeclaredParserError(
            f"{where} is {type(parser).__name__} {parser!r:.60}, not a parser; declare a "
            "callable str -> ParseResult (`parser = xml_tag_parser('move')`), or pass "
            "--parser (e.g. --parser xml:move)"
        )
    if not takes_one_text(parser):
        raise DeclaredParserError(
            f"{where} is {parser_name(parser)}{_signature(parser)}, which cannot be called as "
            "parser(reply): a method written `def parser(self, text)` wants the env first. "
            "Make it a @staticmethod taking only the text (`@staticmethod` above `def "
            "parser(text)`), or declare `parser = xml_tag_parser('move')`, or pass --parser "
            "module:function"
        )
    return parser  # type: ignore[return-value]


def _declared_at(owner: object, parser: object) -> str:
    """ "MyEnv.parser (my_env.py:12)": where `owner` declares `parser`, as far as it is known."""
    name = getattr(owner, "__qualname__", None) or type(owner).__name__
    file = _source_file(owner)
    line = getattr(getattr(parser, "__code__", None), "co_firstlineno", None)
    if file and line is not None and _source_file(parser) == file:
        return f"{name}.parser ({file}:{line})"
    return f"{name}.parser ({file})" if file else f"{name}.parser"


def _source_file(obj: object) -> str | None:
    try:
        return inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:  # a builtin, or an object defined in no file
        return None


def _signature(parser: object) -> str:
    try:
        return str(inspect.signature(parser))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
