"""Parsers: turn a completion into an env action plus an intrinsic format reward.

A parser is any callable `str -> ParseResult`. It never raises on model output: a malformed
completion (nested or unclosed tags, an action holding a lone surrogate) yields
`ParseResult(action=None, reward=penalty, obs=feedback)`, and the protocol records it as a
parse failure without calling the env. Parsers do not validate actions against
the env's rules (an illegal move is the env's business).

Every built-in parser runs in time linear in its input: a completion is hostile text (a model
repeating `\\boxed{` or an unclosed tag up to max_tokens), and parsing runs on the event loop
that every concurrent episode shares. They use `str.find` scans, never a regex that retries
from each position. `tag_blocks` is the shared linear scanner for `<tag>...</tag>` blocks.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import re
from collections.abc import Iterator
from typing import Protocol

from ludic._describe import describe_value
from ludic.types import ParseResult


class Parser(Protocol):
    """The parser seam: any callable `str -> ParseResult` (plain functions qualify)."""

    def __call__(self, text: str, /) -> ParseResult: ...


DEFAULT_PENALTY = -1.0


def _named(parse: Parser, name: str) -> Parser:
    """`parse` under the name a log line shows (`xml_tag_parser('move')`, not `parse`)."""
    parse.__name__ = parse.__qualname__ = name  # type: ignore[attr-defined]
    return parse


def parser_name(parser: Parser) -> str:
    """How a log line names `parser` (`xml_tag_parser('move')`, a function's name, a class)."""
    return getattr(parser, "__qualname__", None) or type(parser).__name__


def takes_one_text(parser: object) -> bool:
    """Whether `parser(text)` binds: a parser takes one argument, the reply (a callable whose
    signature cannot be read is taken). A `def parser(self, text)` read from its class does
    not bind: it wants the instance first."""
    try:
        inspect.signature(parser).bind("reply")  # type: ignore[arg-type]
    except ValueError:
        return True
    except TypeError:
        return False
    return True


def check_parse_result(result: ParseResult, *, where: str) -> ParseResult:
    """`result` with a plain float reward (a numpy or int reward converted), or a TypeError
    (ValueError for a nan or inf reward) naming `where` (the parser), the field and its type:
    the action is the text the env receives and the obs the text the model reads, and all
    three go into the rollout record (JSON), where a numpy value or an object failed only at
    the log write, after the env had received it."""
    for field in ("action", "obs"):
        value = getattr(result, field)
        if value is not None and not isinstance(value, str):
            raise TypeError(
                f"{where} returned ParseResult.{field} = {describe_value(value, qualified=True, article=True)}; {field} must be a str "
                f"(str(...)) or None ({_FIELD_ROLE[field]})"
            )
    reward = result.reward
    if isinstance(reward, str) or not isinstance(reward, numbers.Real):
        raise TypeError(
            f"{where} returned ParseResult.reward = {describe_value(reward, qualified=True, article=True)}; the reward must be a "
            "number (a float such as 0.0)"
        )
    if not math.isfinite(reward):
        raise ValueError(
            f"{where} returned ParseResult.reward = {reward}; the reward must be finite (a nan "
            "or inf would turn every advantage of its group into nan)"
        )
    return result if type(reward) is float else dataclasses.replace(result, reward=float(reward))


_FIELD_ROLE = {
    "action": "the text the env receives; None marks a reply it cannot read",
    "obs": "the feedback the model reads after a parse failure",
}


def compose_parsers(*parsers: Parser) -> Parser:
    """Apply parsers in order, each to the previous one's action; rewards add up.

    The first failure stops the chain and returns its feedback with the rewards so far.
    `compose_parsers(think_prefix_parser(), xml_tag_parser("move"))` first requires a closed
    `<think>` block, then extracts `<move>...</move>` from what follows it.
    """
    if not parsers:
        raise ValueError("compose_parsers needs at least one parser")

    def composed(text: str) -> ParseResult:
        reward = 0.0
        current = text
        for parser in parsers:
            result = parser(current)
            reward += result.reward
            if result.action is None:
                return ParseResult(action=None, reward=reward, obs=result.obs)
            current = result.action
        return ParseResult(action=current, reward=reward, obs=None)

    return _named(composed, f"compose_parsers({', '.join(parser_name(p) for p in parsers)})")


def identity_parser(text: str) -> ParseResult:
    """Pass the completion through unchanged (stripped); a lone surrogate fails (see `_valid`)."""
    return _valid(text.strip(), 0.0, DEFAULT_PENALTY)


def _valid(action: str, reward: float, penalty: float) -> ParseResult:
    """`action` with `reward`, or a failure when it holds a lone surrogate (`"\\ud800"`, which a
    server's JSON escape can put in a completion): not valid Unicode, so no env, log file or
    next request could take it. Linear: one encode, and only for text that is not ASCII."""
    if not action.isascii():
        try:
            action.encode("utf-8")
        except UnicodeEncodeError as e:
            return ParseResult(
                action=None,
                reward=penalty,
                obs=f"Your answer holds invalid text at character {e.start} (a lone surrogate, "
                "not valid Unicode); answer in plain text.",
            )
    return ParseResult(action=action, reward=reward)


def tag_blocks(text: str, open_tag: str, close_tag: str) -> Iterator[tuple[int, int, int, int]]:
    """The non-overlapping `open_tag ... close_tag` blocks of `text`, left to right, in linear time.

    Yields `(start, content_start, content_end, end)` index tuples: `text[start:end]` is the
    whole block and `text[content_start:content_end]` what lies between the tags. Each block
    closes at the first `close_tag` after its opening tag, as the regex `open(.*?)close` with
    DOTALL would match; an opening tag with no close after it ends the scan (no later one can
    close either), which is what keeps the scan linear where that regex is quadratic.
    """
    if not open_tag or not close_tag:
        raise ValueError("tag_blocks needs a non-empty open_tag and close_tag")
    pos = 0
    while (start := text.find(open_tag, pos)) >= 0:
        content_start = start + len(open_tag)
        content_end = text.find(close_tag, content_start)
        if content_end < 0:
            return
        pos = content_end + len(close_tag)
        yield start, content_start, content_end, pos


def xml_tag_parser(
    tag: str,
    *,
    success_reward: float = 0.0,
    penalty: float = DEFAULT_PENALTY,
    exactly_one: bool = False,
    strip: bool = True,
) -> Parser:
    """Extract the content of the LAST `<tag>...</tag>` in the completion.

    Fails (with `penalty` and feedback) when the tag is missing or empty, when its content
    holds another opening tag (nested, or a tag left unclosed before it), or when
    `exactly_one` is set and the tag appears more than once.
    """
    if not re.fullmatch(r"[A-Za-z_][\w\-.]*", tag):
        raise ValueError(f"xml_tag_parser: {tag!r} is not a valid tag name")
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    hint = f"Reply with your answer inside {open_tag}...{close_tag}."

    def parse(text: str) -> ParseResult:
        count, last = 0, ""
        for _, content_start, content_end, _ in tag_blocks(text, open_tag, close_tag):
            count, last = count + 1, text[content_start:content_end]
        if not count:
            return ParseResult(
                action=None, reward=penalty, obs=f"Could not find {open_tag}...{close_tag}. {hint}"
            )
        if exactly_one and count > 1:
            return ParseResult(
                action=None,
                reward=penalty,
                obs=f"Found {count} {open_tag} tags; give exactly one. {hint}",
            )
        if open_tag in last:  # `<tag>a<tag>b</tag>`: which one the model meant is a guess
            return ParseResult(
                action=None,
                reward=penalty,
                obs=f"Found {open_tag} inside {open_tag}...{close_tag}; do not nest them. {hint}",
            )
        value = last.strip() if strip else last
        if not value:
            return ParseResult(action=None, reward=penalty, obs=f"{open_tag} was empty. {hint}")
        return _valid(value, success_reward, penalty)

    return _named(parse, f"xml_tag_parser({tag!r})")


def think_prefix_parser(
    *,
    open_tag: str = "<think>",
    close_tag: str = "</think>",
    require: bool = True,
    success_reward: float = 0.0,
    penalty: float = DEFAULT_PENALTY,
) -> Parser:
    """Require (or allow) a leading `<think>...</think>` block and return the text after it.

    With `require=False` a completion without a think block passes through (stripped); an
    opened but unclosed block always fails (the model ran out of room while thinking), and so
    does an empty answer.
    """

    def parse(text: str) -> ParseResult:
        stripped = text.strip()
        if not stripped.startswith(open_tag):
            if require:
                return ParseResult(
                    action=None,
                    reward=penalty,
                    obs=f"Start your reply with {open_tag}...{close_tag}, then give your answer.",
                )
            if not stripped:
                return ParseResult(action=None, reward=penalty, obs="Your reply was empty.")
            return _valid(stripped, 0.0, penalty)
        end = stripped.find(close_tag, len(open_tag))
        if end < 0:
            return ParseResult(
                action=None,
                reward=penalty,
                obs=f"Your {open_tag} block was never closed with {close_tag}.",
            )
        rest = stripped[end + len(close_tag) :].strip()
        if not rest:
            return ParseResult(
                action=None, reward=penalty, obs=f"Give your answer after {close_tag}."
            )
        return _valid(rest, success_reward, penalty)

    return _named(parse, f"think_prefix_parser({open_tag!r}, {close_tag!r})")


_BOX = "\\boxed{"
_BRACE = re.compile(r"[{}]")


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` with balanced braces, or None.

    One pass pairs every `{` with its `}` (a stack, as any bracket matcher does); the answer
    is the last box whose opening brace found a partner. Scanning forward from each box in
    turn, as a first version did, is quadratic on a completion that repeats `\\boxed{`.
    """
    first = text.find(_BOX)
    if first < 0:
        return None
    box_braces: list[int] = []  # index of each box's "{", in order
    pos = first
    while pos >= 0:
        box_braces.append(pos + len(_BOX) - 1)
        pos = text.find(_BOX, pos + len(_BOX))
    partner = _closing_braces(text, box_braces[0])
    for brace in reversed(box_braces):
        if (close := partner.get(brace)) is not None:
            return text[brace + 1 : close]
    return None


def _closing_braces(text: str, pos: int) -> dict[int, int]:
    """For each `{` at or after `pos` that is closed, the index of its matching `}`."""
    partner: dict[int, int] = {}
    open_braces: list[int] = []
    for match in _BRACE.finditer(text, pos):
        if match.group() == "{":
            open_braces.append(match.start())
        elif open_braces:
            partner[open_braces.pop()] = match.start()
    return partner


def boxed_parser(*, success_reward: float = 0.0, penalty: float = DEFAULT_PENALTY) -> Parser:
    r"""Extract the content of the last balanced `\boxed{...}` (math answers)."""

    def parse(text: str) -> ParseResult:
        value = _last_boxed(text)
        if value is None or not value.strip():
            return ParseResult(
                action=None,
                reward=penalty,
                obs="Put your final answer in \\boxed{...}.",
            )
        return _valid(value.strip(), success_reward, penalty)

    return _named(parse, "boxed_parser()")


__all__ = [
    "DEFAULT_PENALTY",
    "ParseResult",
    "Parser",
    "boxed_parser",
    "check_parse_result",
    "compose_parsers",
    "identity_parser",
    "tag_blocks",
    "think_prefix_parser",
    "xml_tag_parser",
]
