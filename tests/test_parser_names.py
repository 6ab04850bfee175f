"""Parsers carry the name a log line shows: `ludic train` printed
`parser: xml_tag_parser.<locals>.parse`, which says neither the tag nor the settings."""

from __future__ import annotations

from ludic.parsers import (
    boxed_parser,
    compose_parsers,
    identity_parser,
    parser_name,
    think_prefix_parser,
    xml_tag_parser,
)


def test_parsers_are_named_as_they_were_built() -> None:
    assert parser_name(xml_tag_parser("move")) == "xml_tag_parser('move')"
    assert parser_name(boxed_parser()) == "boxed_parser()"
    assert parser_name(identity_parser) == "identity_parser"
    composed = compose_parsers(think_prefix_parser(), xml_tag_parser("answer"))
    assert parser_name(composed) == (
        "compose_parsers(think_prefix_parser('<think>', '</think>'), xml_tag_parser('answer'))"
    )
    assert xml_tag_parser("move")("<move>5</move>").action == "5"  # still the parser


def test_a_callable_object_is_named_by_its_class() -> None:
    class Mine:
        def __call__(self, text: str) -> None: ...

    assert parser_name(Mine()) == "Mine"  # type: ignore[arg-type]
