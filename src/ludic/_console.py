"""The `ludic` console script's entry point: SIGINT and SIGTERM are recorded from the first line
of Ludic's code the process runs, then handed to `ludic.cli`, which stops the command before it
runs (the one interrupted line, exit code 130 / 143). Before, Python's own handlers held until
`ludic.cli` and its imports had loaded (tens of milliseconds, several times that on a busy
machine): Ctrl-C there printed a KeyboardInterrupt traceback and SIGTERM ended the process
silently. What is left is the interpreter's own start: this module imports only `_signal`, the
C module under `signal` (whose `enum` import alone took 30 ms on a busy 2-core machine). A
signal the process was started ignoring (`nohup`, a background job) stays ignored."""

import _signal
from types import FrameType

_RECEIVED: list[int] = []


def _record(signum: int, frame: FrameType | None) -> None:
    _RECEIVED.append(signum)


_BEFORE = {
    sig: _signal.signal(sig, _record)
    for sig in (_signal.SIGINT, _signal.SIGTERM)
    if _signal.getsignal(sig) != _signal.SIG_IGN
}


def main() -> None:
    """Run the `ludic` command (`ludic.cli`), with the signals received while it loaded."""
    try:
        from ludic.cli import console_main

        console_main(_RECEIVED)
    finally:
        for sig, before in _BEFORE.items():
            _signal.signal(sig, before)
