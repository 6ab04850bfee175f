"""Why a checkpoint save failed, in one line a user can act on: the disk filled up, the file system
is read-only, permission was denied, naming the directory, how much the save had written, how
much is free, and the last complete checkpoint (which a failed save never touches: it writes to a
scratch directory that is removed).

torch reports a full disk as "[enforce fail at inline_container.cc] unexpected pos ..." (a
RuntimeError without errno), so an error without an errno (nor one quoted in its message, as
safetensors quotes "os error 28") counts as a full disk only when the file system is nearly full
when it is raised; any other is not this module's and is re-raised as is. It does not retry,
free space, or choose another directory.
"""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

from ludic.errors import Refusal

# below this many free bytes when a write fails, the write failed because the disk is full
FULL_BELOW_BYTES = 16 * 2**20
_FREE_SPACE = "free space on that disk (or pass a checkpoint directory on a larger one)"
_WRITABLE = "pass a checkpoint directory this process can write"
_DISK_FULL = ("the disk is full", _FREE_SPACE)
_CAUSES = {  # errno -> (what happened, what to do)
    errno.ENOSPC: _DISK_FULL,
    errno.EDQUOT: ("the disk quota is exceeded", _FREE_SPACE),
    errno.EFBIG: ("a file is larger than this process may write", "raise `ulimit -f`"),
    errno.EROFS: ("the file system is read-only", _WRITABLE),
    errno.EACCES: ("permission is denied", _WRITABLE),
    errno.EPERM: ("permission is denied", _WRITABLE),
}


class CheckpointSaveError(Refusal, OSError):
    """A checkpoint could not be written; the message names the cause, the directory, and the
    last complete checkpoint, left intact."""


def save_failed(
    error: BaseException, *, final: Path, scratch: Path, last_complete: Path | None
) -> CheckpointSaveError | None:
    """The refusal for `error`, raised while checkpoint `final` was written to `scratch` (call it
    before `scratch` is removed: its size is what the save had written), or None when `error` is
    not a file-system failure (re-raise it as is)."""
    root = final.parent
    free = _free_bytes(root)
    code = error.errno if isinstance(error, OSError) else _os_error_in(str(error))
    if code is not None:
        cause, fix = _CAUSES.get(code, ("the file system refused a write", _WRITABLE))
    elif free is not None and free < FULL_BELOW_BYTES:  # torch's and safetensors' own errors
        cause, fix = _DISK_FULL
    else:
        return None
    sizes = ""
    if fix == _FREE_SPACE:
        sizes = f"the save had written {_mib(_bytes_under(scratch))}, {_mib(free or 0)} free; "
    kept, then = (
        (f"the last complete checkpoint, {last_complete}, is intact", "resume")
        if last_complete is not None
        else ("no earlier checkpoint was saved there", "run again")
    )
    return CheckpointSaveError(
        f"saving checkpoint {final.name} under {root} failed: {cause} ({sizes}"
        f"{type(error).__name__}: {_one_line(error)}). The partial save is removed and {kept}: "
        f"{fix}, then {then}"
    )


def _os_error_in(message: str) -> int | None:
    """The errno a library's message quotes (safetensors: "... (os error 28)"), if any."""
    found = re.search(r"\(os error (\d+)\)", message)
    return int(found.group(1)) if found else None


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue  # not created yet: the file system of the nearest existing parent
    return None


def _bytes_under(path: Path) -> int:
    total = 0
    for file in path.rglob("*"):
        try:
            total += file.stat().st_size if file.is_file() else 0
        except OSError:
            continue
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
