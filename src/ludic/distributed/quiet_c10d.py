"""Silence torch's C++ (c10) warnings for the span of one store wait whose failure is expected.

A TCPStore client whose store closes (the trainer exited) fails its pending call, and c10d
prints a warning with ~20 C++ stack frames before Python sees the error: noise after a normal
trainer exit. `quiet_c10_warnings()` raises c10's minimum log level (`FLAGS_caffe2_log_level`,
what `TORCH_CPP_LOG_LEVEL` sets at start-up) to ERROR while it is entered and restores it on
exit; nested and concurrent scopes share one count. It does not touch Python warnings or
logging, and is a no-op where libc10 does not export the flag, or where the user set
`TORCH_CPP_LOG_LEVEL` (their level wins). The level is process-wide: while a scope is open,
C++ warnings of other threads are not printed either (errors still are).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_ERROR = 2  # c10 severities: INFO 0, WARNING 1, ERROR 2, FATAL 3
_lock = threading.Lock()
_depth = 0
_saved = 0
_flag: ctypes.c_int | None = None
_looked_up = False


def _log_level_flag() -> ctypes.c_int | None:
    """libc10's `FLAGS_caffe2_log_level`, or None where it cannot be found."""
    global _flag, _looked_up
    if not _looked_up:
        _looked_up = True
        import torch

        suffix = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
        name = ("c10" if sys.platform == "win32" else "libc10") + suffix
        try:
            lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / name))
            _flag = ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
        except (OSError, ValueError):
            _flag = None
    return _flag


@contextmanager
def quiet_c10_warnings() -> Iterator[None]:
    """c10 logs only errors while inside (all threads of the process: keep the scope short,
    around the one call whose failure is expected)."""
    global _depth, _saved
    flag = None if os.environ.get("TORCH_CPP_LOG_LEVEL") else _log_level_flag()
    if flag is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = flag.value
            flag.value = max(_saved, _ERROR)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                flag.value = _saved
