"""Shared helpers of the ecosystem adapters: the lazy import with an install hint, the keywords
an adapter's constructor takes, and ANSI to plain text. They deliberately know nothing about
any one ecosystem."""

from __future__ import annotations

import importlib
import inspect
import re
from types import ModuleType

_ANSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def require(module: str, *, extra: str, package: str | None = None) -> ModuleType:
    """Import `module`, or raise ImportError naming the extra that installs it.

    Adapters call this when an env is built, never at import time, so `import ludic` works
    without any ecosystem installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"this env needs the {package or module!r} package, which is not installed "
            f"({e}); install it with: pip install 'ludic[{extra}]'"
        ) from e


def own_keywords(cls: type, adapter: type) -> list[str]:
    """The keyword-only parameters of `cls`'s constructor and of each class between it and
    `adapter` (a subclass that adds keywords and passes the rest on), in that order: what the
    adapter's refusal of an unknown `--env-kwargs` keyword lists as Ludic's own. Read from the
    signatures, so a keyword added to a constructor is listed without a list to keep in step."""
    names: list[str] = []
    for klass in cls.__mro__:
        if not issubclass(klass, adapter):
            break
        if "__init__" not in vars(klass):
            continue
        for param in inspect.signature(klass.__init__).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY and param.name not in names:
                names.append(param.name)
    return names


def ansi_to_text(text: str, *, highlight: str = "[{}]") -> str:
    """`text` without ANSI escape sequences; a span drawn with colours or bold (a game's way of
    marking the player, a goal, a selection) is kept visible as `highlight.format(span)`.

    Cursor movement and other non-style sequences are dropped. Only SGR (`ESC[...m`) styles
    become highlights; a reset (`ESC[0m` or `ESC[m`) ends the span.
    """
    out: list[str] = []
    span: list[str] | None = None
    pos = 0
    for match in _ANSI.finditer(text):
        (span if span is not None else out).append(text[pos : match.start()])
        pos = match.end()
        params, command = match.groups()
        if command != "m":
            continue
        if params in ("", "0"):
            if span is not None:
                out.append(highlight.format("".join(span)) if "".join(span) else "")
                span = None
        elif span is None:
            span = []
    (span if span is not None else out).append(text[pos:])
    if span is not None:
        out.append(highlight.format("".join(span)))
    return "".join(out)
