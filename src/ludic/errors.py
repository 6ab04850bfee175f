"""Which errors are refusals: bad input or setup that the message alone explains.

The `ludic` command prints a refusal as one `ludic <command>: error: <message>` block instead of
a traceback (`ludic.cli`); every other error is a bug, and keeps its traceback. `is_refusal`
decides, and this is its rule:

- `LudicUsageError` (a ValueError), raised anywhere: the explicit marker for a refusal.
- ludic's own refusal classes that are not ValueErrors (subclasses of `Refusal`: another run
  holds the run directory, a single-process command under torchrun, a corrupt checkpoint, a child server
  that exited before serving (its message holds the child's output), Redis or every inference
  server unreachable, a training run that stalled: its message names the cause and the fix).
- a ValueError or a file error (FileNotFoundError, PermissionError, IsADirectoryError,
  NotADirectoryError, FileExistsError) that ludic's own code raised explicitly: its innermost
  traceback frame is in the `ludic` package and stopped at a `raise` statement (the bytecode
  instruction the frame was at is RAISE_VARARGS, so a `raise` spanning several lines counts and
  no source file is needed). That is where the refusal sites raise, naming the problem and the
  fix; it holds for an error raised on a worker thread and re-raised by the caller too (the
  exception keeps the traceback of where it was raised). A ValueError that a builtin raised
  inside ludic's code (`a, b = (1, 2, 3)`, `zip(..., strict=True)`, `int("x")`, also when a
  bare `raise` re-raises it) is a bug: its innermost frame stopped at the unpacking or the call.
- a file error from anywhere that names its file (`filename` set: the OS's message says which),
  and so an OSError for a read-only or full disk (EROFS, ENOSPC, EDQUOT) that names its file.

Not refusals: TypeError, AttributeError, KeyError, any RuntimeError from torch, a ValueError
raised inside torch, transformers or the standard library (`json`'s "Expecting value"), and
any error raised by the user's own code (an env factory): those keep their traceback. This
module does not print, exit or change what any function raises.
"""

from __future__ import annotations

import dis
import errno
import os
from types import TracebackType

__all__ = ["LudicUsageError", "Refusal", "is_refusal", "raised_by_ludic"]


class LudicUsageError(ValueError):
    """A refusal of the user's input or setup whose message says what is wrong and how to fix
    it. A ValueError, so callers that catch ValueError keep working."""


class Refusal(Exception):
    """Marks one of ludic's refusal classes that is not a ValueError (a second base, e.g.
    `class RunDirInUseError(Refusal, RuntimeError)`): its message names the problem and the fix."""


_FILE_ERRORS = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)
_DISK_ERRNOS = (errno.EROFS, errno.ENOSPC, errno.EDQUOT)
_PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__)) + os.sep


def is_refusal(exc: BaseException) -> bool:
    """True when `exc` is a refusal by the rule in this module's docstring."""
    if isinstance(exc, LudicUsageError):
        return True
    if isinstance(exc, Refusal):
        return True
    if isinstance(exc, _FILE_ERRORS) and exc.filename is not None:
        return True
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS and exc.filename is not None:
        return True  # a read-only or full disk under the path it names: the message says so
    return isinstance(exc, (ValueError, *_FILE_ERRORS)) and raised_by_ludic(exc)


def raised_by_ludic(exc: BaseException) -> bool:
    """True when the innermost frame of `exc`'s traceback is in the `ludic` package and stopped
    at a `raise` statement: ludic's code raised `exc` explicitly, not a builtin it called (an
    unpacking, `int("x")`). False without a traceback."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    in_ludic = os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR)
    return in_ludic and _stopped_at_raise(tb)


def _stopped_at_raise(tb: TracebackType) -> bool:
    """True when `tb`'s frame was at a RAISE_VARARGS instruction (`raise X`, `raise X from Y`)
    when the exception passed through it."""
    return any(
        ins.offset == tb.tb_lasti and ins.opname == "RAISE_VARARGS"
        for ins in dis.get_instructions(tb.tb_frame.f_code)
    )
