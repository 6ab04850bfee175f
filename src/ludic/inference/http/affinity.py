"""Which conversation a model call belongs to, for clients that route calls over several
servers (`ludic.inference.http.pool.ServerPool`): every call of one episode should reach the
server that holds its prefix cache.

`conversation(key)` scopes the calls made inside it (tasks started inside inherit it); the
RolloutEngine opens one per episode. It is a context variable only: no routing happens here.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Hashable, Iterator

_CONVERSATION: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "ludic_conversation", default=None
)


@contextlib.contextmanager
def conversation(key: Hashable) -> Iterator[None]:
    """Mark the model calls made inside (this task and tasks it starts) as one conversation."""
    token = _CONVERSATION.set(key)
    try:
        yield
    finally:
        _CONVERSATION.reset(token)


def current_conversation() -> Hashable | None:
    """The key of the conversation the running code belongs to (None outside any)."""
    return _CONVERSATION.get()
