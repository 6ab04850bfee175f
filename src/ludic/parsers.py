"""Parsers: turn a completion into an env action plus an intrinsic format reward.

A parser is any callable `str -> ParseResult`. It never raises on model output: a malformed
completion yields `ParseResult(action=None, reward=penalty, obs=feedback)`, and the protocol
records it as a parse failure without calling the env. Parsers do not validate actions against
the env's rules (an illegal move is the env's business).
"""

from __future__ import annotations

import re
from typing import Protocol

from ludic.types import ParseResult


class Parser(Protocol):
    """The parser seam: any callable `str -> ParseResult` (plain functions qualify)."""

    def __call__(self, text: str, /) -> ParseResult: ...


DEFAULT_PENALTY = -1.0


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

    return composed


def identity_parser(text: str) -> ParseResult:
    """Pass the completion through unchanged (stripped)."""
    return ParseResult(action=text.strip())


def xml_tag_parser(
    tag: str,
    *,
    success_reward: float = 0.0,
    penalty: float = DEFAULT_PENALTY,
    exactly_one: bool = False,
    strip: bool = True,
) -> Parser:
    """Extract the content of the LAST `<tag>...</tag>` in the completion.

    Fails (with `penalty` and feedback) when the tag is missing or empty, or when
    `exactly_one` is set and the tag appears more than once.
    """
    if not re.fullmatch(r"[A-Za-z_][\w\-.]*", tag):
        raise ValueError(f"xml_tag_parser: {tag!r} is not a valid tag name")
    pattern = re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)
    hint = f"Reply with your answer inside <{tag}>...</{tag}>."

    def parse(text: str) -> ParseResult:
        matches = pattern.findall(text)
        if not matches:
            return ParseResult(
                action=None, reward=penalty, obs=f"Could not find <{tag}>...</{tag}>. {hint}"
            )
        if exactly_one and len(matches) > 1:
            return ParseResult(
                action=None,
                reward=penalty,
                obs=f"Found {len(matches)} <{tag}> tags; give exactly one. {hint}",
            )
        value = matches[-1].strip() if strip else matches[-1]
        if not value:
            return ParseResult(action=None, reward=penalty, obs=f"<{tag}> was empty. {hint}")
        return ParseResult(action=value, reward=success_reward)

    return parse


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
            return ParseResult(action=stripped, reward=0.0)
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
        return ParseResult(action=rest, reward=success_reward)

    return parse


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` with balanced braces, or None."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        i = start + len("\\boxed{")
        depth = 1
        j = i
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        if depth == 0:
            return text[i : j - 1]
        start = text.rfind("\\boxed{", 0, start)
    return None


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
        return ParseResult(action=value.strip(), reward=success_reward)

    return parse


__all__ = [
    "DEFAULT_PENALTY",
    "ParseResult",
    "Parser",
    "boxed_parser",
    "compose_parsers",
    "identity_parser",
    "think_prefix_parser",
    "xml_tag_parser",
]
