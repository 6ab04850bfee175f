"""Refusing text a tokenizer cannot take: a lone UTF-16 surrogate (e.g. "\\ud800", which JSON can
carry as an escape) is no Unicode character, cannot be encoded as UTF-8, and makes a fast tokenizer
raise a bare TypeError. `check_text` names where the bad character is instead. It does not repair
text: dropping or replacing characters would change the prompt the policy is trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

_CONTEXT_CHARS = 20  # of the text around the bad character, shown in the message


def check_text(value: object, where: str) -> None:
    """Raise ValueError naming the first lone surrogate in `value` (a string, or mappings and
    sequences holding strings, walked in order) with its path under `where` and its position."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(_message(value, e.start, where)) from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_text(key, f"{where} key")
            check_text(item, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key!r}]")
    elif isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        for i, item in enumerate(value):
            check_text(item, f"{where}[{i}]")


def _message(text: str, at: int, where: str) -> str:
    before = text[max(0, at - _CONTEXT_CHARS) : at]
    after = text[at + 1 : at + 1 + _CONTEXT_CHARS]
    around = ", ".join(
        f"{side} {part!r}" for side, part in (("after", before), ("before", after)) if part
    )
    return (
        f"{where} holds a lone surrogate {text[at]!r} at character {at}"
        f"{f' ({around})' if around else ''}: not valid Unicode, so it cannot be tokenized; "
        "fix the code that "
        "produced it (surrogates come from a JSON '\\ud800'-style escape of half a character, "
        "or from bytes decoded with errors='surrogateescape'), or replace it, e.g. with "
        "text.encode('utf-8', 'replace').decode('utf-8')"
    )
