"""Why a line of a JSON Lines file does not decode, worded so a user can act on it.

Shared by the rollout and metrics readers. It only words the error: no line is ever skipped.
"""

from __future__ import annotations

import json
from pathlib import Path


def undecodable_line(
    path: str | Path,
    lineno: int,
    line: str,
    error: json.JSONDecodeError,
    what: str,
    eval_summary_advice: str = "",
) -> str:
    """The message for line `lineno` of `path` (`line`, as read) that is not JSON.

    A last line that no newline ends is what a reader sees while a run is still appending to
    the file (or after one was killed mid-write): say so, and that reading again once the line
    is finished works, instead of asking to edit a file that is being written. A file that is
    one JSON document over several lines (such as `ludic eval`'s metrics.json) is named as
    such, with `eval_summary_advice` when it is that eval summary.
    """
    head = f"{path}:{lineno}: not a JSON {what} ({error})"
    document = _one_json_document(Path(path)) if lineno == 1 else None
    if document is not None:
        kind = (
            "`ludic eval`'s metrics.json (one summary of the whole evaluation)"
            if _is_eval_summary(document)
            else "one JSON document over several lines"
        )
        advice = eval_summary_advice if _is_eval_summary(document) else ""
        return f"{path}: not JSON Lines (one {what} per line) but {kind}{advice}"
    if not line.endswith("\n"):
        return (
            f"{head}; it is the last line and no newline ends it: a run is still writing this "
            "file, or one was killed mid-write. Read it again once the line is finished, or, "
            "if nothing writes the file any more, drop that line"
        )
    return f"{head}; the file may have been cut off mid-write: drop the damaged line and read again"


def _one_json_document(path: Path) -> object | None:
    """The file parsed as one JSON document, or None when it is not one."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _is_eval_summary(document: object) -> bool:
    return isinstance(document, dict) and "episodes" in document and "success_rate" in document
