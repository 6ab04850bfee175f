"""`ludic serve` stops its engine at the first Ctrl-C or SIGTERM.

uvicorn's graceful shutdown waits until every request in flight has been generated to its end
(silently at `ludic serve`'s warning log level; for ever under SIGTERM while a client never
finishes reading). Closing the engine at the first signal ends each such request at once with a
503 naming the closed engine (a streamed one with an error event), as vLLM aborts its requests;
a client's retry then finds the server gone. The signal still reaches uvicorn's own handler (a
second Ctrl-C forces its exit). It does not drain requests: stop a server after its clients.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_at_first_signal(stop: Callable[[], None]) -> Iterator[None]:
    """While open, the first SIGINT or SIGTERM starts `stop` on a thread of its own (closing an
    engine joins its worker: not inside a signal handler), then every signal goes on to the
    handler installed before (uvicorn's, when the app's lifespan opens this). Off the main
    thread (signals cannot be set there) or for a signal with no Python handler: no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    started = threading.Event()

    def chained(previous: Callable[[int, FrameType | None], Any]) -> Callable[..., None]:
        def handler(signum: int, frame: FrameType | None) -> None:
            if not started.is_set():
                started.set()
                threading.Thread(target=stop, name="ludic-serve-stop", daemon=True).start()
            previous(signum, frame)

        return handler

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for signum, handler in previous.items():
        if callable(handler):
            signal.signal(signum, chained(handler))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if callable(handler):
                signal.signal(signum, handler)
