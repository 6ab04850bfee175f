"""Why a line of a JSON Lines file does not decode, worded so a user can act on it.

Shared by the rollout and metrics readers. It only words the error: no line is ever skipped.
"""

from __future__ import annotations

import json
from pathlib import Path


def undecodable_line(
    path: str | Path, lineno: int, line: str, error: json.JSONDecodeError, what: str
) -> str:
    """The message for line `lineno` of `path` (`line`, as read) that is not JSON.

    A last line that no newline ends is what a reader sees while a run is still appending to
    the file (or after one was killed mid-write): say so, and that reading again once the line
    is finished works, instead of asking to edit a file that is being written.
    """
    head = f"{path}:{lineno}: not a JSON {what} ({error})"
    if not line.endswith("\n"):
        return (
            f"{head}; it is the last line and no newline ends it: a run is still writing this "
            "file, or one was killed mid-write. Read it again once the line is finished, or, "
            "if nothing writes the file any more, drop that line"
        )
    return f"{head}; the file may have been cut off mid-write: drop the damaged line and read again"
