"""Fixtures shared across test folders (helpers used by one folder stay in that folder as
sibling modules imported by bare name)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """A test run started in the background (`cmd &`, nohup, some CI runners) inherits SIGINT
    ignored, and every child would inherit that too: the tests that press Ctrl-C on a `ludic`
    command need SIGINT as a terminal gives it, so this process takes Python's default handler
    back (its children then start with the default disposition)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class CpuLoad:
    """A busy process and a busy Python thread (it contends for the GIL with the event loop
    and the engine thread) while the `with` block runs; both stop when it ends."""

    def __enter__(self) -> CpuLoad:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()
        return self

    def _spin(self) -> None:
        while not self.stop.is_set():
            sum(range(10_000))

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.process.kill()
        self.process.wait()


@pytest.fixture
def cpu_load() -> type[CpuLoad]:
    """`with cpu_load(): ...` runs the block next to a busy process and a busy thread."""
    return CpuLoad
