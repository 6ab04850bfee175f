"""Answer verifiers for dataset QA: `(prediction, target) -> float | bool`.

Both shipped verifiers compare an already-extracted answer; they deliberately do not search a
completion for the answer (that is the agent parser's job) and never raise on any string.
"""

from __future__ import annotations

import math
import re
from typing import Protocol


class Verifier(Protocol):
    """The verifier seam: True or 1.0 for a correct prediction; a float in between is credit."""

    def __call__(self, prediction: str, target: str, /) -> float | bool: ...


_SURROUNDING = " \t\n\r.,;:!?\"'`"
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_FRACTION = re.compile(r"([+-]?[0-9]{1,18})/([0-9]{1,18})")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{([0-9]{1,18})\}\{([0-9]{1,18})\}")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}")
# Units and decorations that do not change a number: currency, thousands separators, LaTeX
# spacing, a trailing percent sign (the target is written the same way, e.g. "25" for 25%).
_DECORATIONS = ("\\$", "$", "\\%", "%", "\\,", "\\!", "\\ ", ",", "€", "£")


def normalize_answer(text: str) -> str:
    """Casefold, collapse whitespace, drop surrounding quotes and punctuation."""
    collapsed = " ".join(str(text).split()).casefold()
    return collapsed.strip(_SURROUNDING)


def exact_match(prediction: str, target: str) -> bool:
    """True when the answers are equal after `normalize_answer`."""
    return normalize_answer(prediction) == normalize_answer(target)


def parse_number(text: str) -> float | None:
    """The number written in `text`, or None if it is not one number.

    Accepts "1000", "1,000", "1000.0", "$1,000", "\\$1000", "25%", "-3", "1e3", "3/4",
    "\\frac{3}{4}" and "\\text{42}"; a trailing period is ignored.
    """
    value = _TEXT_WRAPPER.sub(r"\1", str(text)).strip().rstrip(".")
    for decoration in _DECORATIONS:
        value = value.replace(decoration, "")
    value = value.strip()
    if match := _LATEX_FRACTION.fullmatch(value):
        sign, num, den = match.groups()
        value = f"{sign}{num}/{den}"
    if match := _FRACTION.fullmatch(value):
        num, den = int(match.group(1)), int(match.group(2))
        return num / den if den else None
    if _NUMBER.fullmatch(value):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def numeric_match(
    prediction: str, target: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> bool:
    """True when both parse as numbers (`parse_number`) within tolerance; if the target is not
    a number, falls back to `exact_match`."""
    expected = parse_number(target)
    if expected is None:
        return exact_match(prediction, target)
    got = parse_number(prediction)
    if got is None:
        return False
    return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)
