"""argparse types the benches share."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (no run, nothing to take a median or best of)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
