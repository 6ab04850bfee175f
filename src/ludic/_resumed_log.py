"""JSON Lines logs that a resumed run continues: metrics (by step), rollouts and samples (by
the batch index `RolloutBatchSource` stamps in their meta).

A run resumed from a checkpoint writes again the positions an interrupted run wrote after that
checkpoint; those records belong to the stretch the resume discarded (as TensorBoard's
`purge_step`). So the first record a writer logs with a position `p` drops the file's records
at `p` and later, and any line a killed run cut off or an edit left damaged (not JSON, or not
UTF-8: a warning names the first one). A last record without its newline (an editor saved the
file so) is whole: it is kept and given one, so the next record starts its own line. Records
without a position (files written before positions were logged, or rollouts that were not
drawn for a training batch) are kept. Lines are split on "\\n" only: JSON escapes it in
strings, but not U+2028 or the other characters `str.splitlines` would also split on.

Deliberately small: one writer per file, no locking, no rotation.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PositionOf = Callable[[Any], int | None]
"""Reads a decoded record's position (its step or batch index); None when it has none."""


def drop_from(path: Path, position: int, position_of: PositionOf) -> bool:
    """Rewrite the file at `path` without its records at `position` or later and without its
    damaged lines; returns whether anything was dropped (a missing file stays missing)."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        if all(_kept(line, position, position_of) == line for line in f):
            return False
    scratch = path.with_name(path.name + ".tmp")
    damaged: list[int] = []
    with path.open("rb") as f, scratch.open("wb") as out:
        for number, line in enumerate(f, start=1):
            kept = _kept(line, position, position_of)
            if kept is not None:
                out.write(kept)
            elif _record(line) is _DAMAGED:
                damaged.append(number)
    os.replace(scratch, path)
    if damaged:
        logger.warning(
            "%s: dropped %d damaged line(s) (not a JSON record in UTF-8: cut off by a killed "
            "run, or edited), the first at line %d",
            path,
            len(damaged),
            damaged[0],
        )
    return True


_DAMAGED = object()


def _record(line: bytes) -> Any:
    """The record `line` holds; `_DAMAGED` when it is not JSON in UTF-8."""
    try:
        return json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError or JSONDecodeError
        return _DAMAGED


def _kept(line: bytes, position: int, position_of: PositionOf) -> bytes | None:
    """`line` as it stays when it is a whole record from before `position` or one with no
    position (ending in a newline: only the file's last line can lack one); None otherwise."""
    record = _record(line)
    if record is _DAMAGED:
        return None  # cut off mid-write, or not a record
    at = position_of(record)
    if at is not None and at >= position:
        return None
    return line if line.endswith(b"\n") else line + b"\n"


class ResumedLog:
    """Drops the records a resume discards from `path`, once: before the first write that has
    a position (`before_write`); writes without one leave the file alone."""

    def __init__(self, path: str | Path, position_of: PositionOf) -> None:
        self.path = Path(path)
        self.position_of = position_of
        self._done = False

    def before_write(self, position: int | None) -> bool:
        """Call before writing a record at `position`; returns whether the file was rewritten
        (an open append handle must then be reopened)."""
        if self._done or position is None:
            return False
        self._done = True
        return drop_from(self.path, position, self.position_of)


def int_or_none(value: Any) -> int | None:
    """`value` when it is an int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def step_of(record: Any) -> int | None:
    """A metrics record's `step`."""
    return int_or_none(record.get("step")) if isinstance(record, dict) else None


def batch_index_of(record: Any) -> int | None:
    """A rollout's or sample's record's `meta["batch_index"]`."""
    return meta_batch_index(record.get("meta") if isinstance(record, dict) else None)


def meta_batch_index(meta: Any) -> int | None:
    """`meta["batch_index"]` of a rollout's or sample's meta."""
    return int_or_none(meta.get(BATCH_INDEX)) if isinstance(meta, dict) else None


BATCH_INDEX = "batch_index"
"""Rollout and sample meta key: the index of the training batch it was drawn for (stamped by
`RolloutBatchSource`, whose checkpointed position it is)."""
