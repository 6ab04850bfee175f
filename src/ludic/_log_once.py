"""Warn once per key: a bug in user code (a parser, a tool, a tool handler, a hanging env) fails
every call the same way, so its first failure is worth a line and the rest are noise. It does
not count repeats or rate-limit by time; tests call `forget_warnings` to see a warning again."""

from __future__ import annotations

import logging

_warned: set[tuple[str, ...]] = set()  # (logger name, *key) already logged


def warn_once(
    logger: logging.Logger,
    key: tuple[str, ...],
    msg: str,
    *args: object,
    exc_info: BaseException | None = None,
) -> bool:
    """`logger.warning(msg, *args)` unless `key` was already warned about on this logger in
    this process. Returns whether it logged."""
    full_key = (logger.name, *key)
    if full_key in _warned:
        return False
    _warned.add(full_key)
    logger.warning(msg, *args, exc_info=exc_info)
    return True


def forget_warnings() -> None:
    """Let every key warn again (for tests: one reset for every `warn_once` caller)."""
    _warned.clear()
