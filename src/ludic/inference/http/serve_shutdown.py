"""uvicorn's server for `ludic serve`, stopping the engine at the first Ctrl-C or SIGTERM.

uvicorn's graceful shutdown waits until every request in flight has been generated to its end
(silently at `ludic serve`'s warning log level; for ever under SIGTERM while a client never
finishes reading). Closing the engine at the first signal ends each such request at once with a
503 naming the closed engine (a streamed one with an error event), as vLLM aborts its requests;
a client's retry then finds the server gone. A second Ctrl-C still forces uvicorn's exit. It
does not drain requests: a server meant to finish its work must be stopped after its clients.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import FrameType

import uvicorn


class EngineStoppingServer(uvicorn.Server):
    """A `uvicorn.Server` that calls `stop_engine` (off the event loop) at the first signal."""

    def __init__(self, config: uvicorn.Config, stop_engine: Callable[[], None]) -> None:
        super().__init__(config)
        self._stop_engine = stop_engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first:  # joins the engine's worker (one step at most): not in the signal handler
            threading.Thread(target=self._stop_engine, name="ludic-serve-stop", daemon=True).start()
