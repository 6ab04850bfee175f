"""A first Ctrl-C (SIGINT) or SIGTERM that arrives while a checkpoint is saved waits for the save.

A preempted job (Kubernetes, Slurm: SIGTERM, then a grace period) would rather keep the step it
was saving than lose it: under `signals_deferred` the first signal is only recorded (with one
notice on stderr), and the handler that was installed before (the `ludic` command's, which ends
the run with its one interrupted line naming the newest checkpoint; Python's own for Ctrl-C) is
called with it as soon as the save completes. A second signal during the save calls that handler
at once, for the first signal and then this one: the save is cut short and rolled back as
without deferral (its temporary directory is removed; the previous checkpoint stays intact).

Only in the main thread (where Python runs signal handlers), and only for a signal whose
handler is a Python callable: one at the default action (a bare process's SIGTERM ends it at
once) or ignored (`nohup`) is left as is. Without a signal nothing changes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType

__all__ = ["signals_deferred"]

_Handler = Callable[[int, FrameType | None], object]
_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@contextmanager
def signals_deferred(what: str) -> Iterator[None]:
    """Run the body (saving `what`, named in the notice) with SIGINT and SIGTERM deferred as the
    module docstring says; the deferred signal's handler runs as the body exits (after it, also
    when the body raised), so whatever it raises comes from here."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, _Handler] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            previous[sig] = handler
    pending: list[tuple[int, FrameType | None]] = []

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def defer(signum: int, frame: FrameType | None) -> None:
        if pending:  # the second: stop now, as without deferral
            restore()
            first = pending.pop()
            previous[first[0]](*first)  # the `ludic` command's raises: the run ends as the
            previous[signum](signum, frame)  # first signal asked; a handler that returns: both
            return
        pending.append((signum, frame))
        name = _NAMES.get(signum, f"signal {signum}")
        _notice(
            f"ludic: {name}: finishing the save of {what} first, then stopping "
            f"(Ctrl-C or SIGTERM again stops at once, without this checkpoint)\n"
        )

    for deferred in previous:
        signal.signal(deferred, defer)
    try:
        yield
    finally:
        restore()
        if pending:
            signum, frame = pending.pop()
            previous[signum](signum, frame)


def _notice(text: str) -> None:
    """Write `text` to stderr without Python's buffered stream, which a signal handler may
    re-enter (a RuntimeError) if the main thread was writing to it when the signal came."""
    with suppress(AttributeError, OSError, ValueError):  # no usable stderr (closed, replaced)
        os.write(sys.stderr.fileno(), text.encode())
