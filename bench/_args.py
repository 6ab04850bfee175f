"""argparse types the benches share."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (no run, nothing to take a median or best of)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0 (e.g. warm-up steps, which may be none)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """An argparse type: comma-separated ints >= 1, at least one, each once (e.g. thread
    counts, one arm each)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated whole numbers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers >= 1, got {text!r}")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"names a number twice: {text!r}")
    return values


def show_defaults(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`parser`, its --help naming each option's default, also for options given no help text
    (`weight_sync.py --help` showed `--models MODELS`, not which models or that it runs
    `tiny,100m`). Options without a default say what their absence means themselves."""
    for action in parser._actions:
        help_text = action.help or ""
        if not action.option_strings or help_text == argparse.SUPPRESS or "%(default)" in help_text:
            continue
        if action.default in (None, False, "", argparse.SUPPRESS):
            continue
        action.help = f"{help_text} (default: %(default)s)".strip()
    return parser
