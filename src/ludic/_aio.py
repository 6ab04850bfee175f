"""Small async helpers shared across packages (not public API)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def maybe_await(value: T | Awaitable[T]) -> T:
    """Await `value` if it is awaitable, so sync and async implementations share one call site."""
    if inspect.isawaitable(value):
        return await value
    return value
