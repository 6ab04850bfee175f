"""How refusals show a value a user's code returned: its repr when short, and its type."""

from __future__ import annotations


def describe_value(value: object, *, qualified: bool = False, article: bool = False) -> str:
    """`repr (a type)`, or `a type` alone when the repr is longer than 40 characters.
    `qualified` names a non-builtin type by module and qualname (`numpy.ndarray`); `article`
    writes "an" before a vowel."""
    kind = type(value).__name__
    if qualified and type(value).__module__ != "builtins":
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
    kind = f"{'an' if article and kind[0] in 'aeiou' else 'a'} {kind}"
    text = repr(value)
    return f"{text} ({kind})" if len(text) <= 40 else kind
