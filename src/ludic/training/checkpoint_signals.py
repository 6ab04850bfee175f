"""A first Ctrl-C (SIGINT) or SIGTERM that arrives while a checkpoint is saved waits for the save.

A preempted job (Kubernetes, Slurm: SIGTERM, then a grace period) would rather keep the step it
was saving than lose it: under `signals_deferred` the first signal is only recorded (with one
notice on stderr), and the handler that was installed before (the `ludic` command's, which ends
the run with its one interrupted line naming the newest checkpoint; Python's own for Ctrl-C) is
called with it as soon as the save completes. A second signal during the save calls that handler
at once, for the first signal and then this one: the save is cut short and rolled back as
without deferral (its temporary directory is removed; the previous checkpoint stays intact).

Under torchrun every rank takes part in a save (each gathers its shards of the full states
that rank 0 writes), so every rank defers, from the first gather to the end of rank 0's write
(`trainer_checkpoints.write_checkpoint`; a save nested in it, `CheckpointManager.save`, adds no
deferral of its own). A signal to the whole group then lets every rank finish its part, and the
ranks agree (`agree`: one all-reduce after the save) on whether any rank got one, so every rank
stops with it, also a rank the signal did not reach, instead of going on alone into the next
collective.

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


_deferring = False  # a save nested in a deferring one (main thread only) defers nothing more


@contextmanager
def signals_deferred(what: str, *, agree: Callable[[int], int] | None = None) -> Iterator[None]:
    """Run the body (saving `what`, named in the notice) with SIGINT and SIGTERM deferred as the
    module docstring says; the deferred signal's handler runs as the body exits (after it, also
    when the body raised), so whatever it raises comes from here. `agree` (several ranks, every
    one saving together): called on every rank once the body completed, with the number of the
    signal this rank deferred (0: none), it returns the one every rank acts on (0: none), e.g.
    an all-reduce max; a rank that deferred none then raises the agreed signal in itself."""
    global _deferring
    if _deferring or threading.current_thread() is not threading.main_thread():
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
        _notice(
            f"ludic: {_name(signum)}: finishing the save of {what} first, then stopping "
            f"(Ctrl-C or SIGTERM again stops at once, without this checkpoint)\n"
        )

    for deferred in previous:
        signal.signal(deferred, defer)
    _deferring = True
    agreed = 0
    try:
        yield
        if agree is not None:  # every rank completed its part: all meet here
            agreed = agree(pending[0][0] if pending else 0)
    finally:
        _deferring = False
        restore()
        if pending:
            agreed = 0  # this rank stops with its own signal
            signum, frame = pending.pop()
            previous[signum](signum, frame)
    if agreed:  # only another rank got it: this one stops with it too, as if it had
        _notice(f"ludic: {_name(agreed)} on another rank during the save of {what}: stopping\n")
        signal.raise_signal(agreed)


def _name(signum: int) -> str:
    return _NAMES.get(signum, f"signal {signum}")


def _notice(text: str) -> None:
    """Write `text` to stderr without Python's buffered stream, which a signal handler may
    re-enter (a RuntimeError) if the main thread was writing to it when the signal came."""
    with suppress(AttributeError, OSError, ValueError):  # no usable stderr (closed, replaced)
        os.write(sys.stderr.fileno(), text.encode())
