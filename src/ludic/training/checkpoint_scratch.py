"""Scratch directories of checkpoint saves (`.tmp-step_*` being written, `.old-step_*` being
replaced): names that record their writer, and removal of those whose writer is gone.

A save killed mid-write leaves its scratch directory behind. Its name carries the writer's pid,
the process start time (so a reused pid is not mistaken for the writer) and host, so a later
process removes it only when that writer is provably dead. A re-save of a step killed between
its two renames leaves the old `step_N` aside as `.old-step_N-*` and no `step_N`: that aside is
renamed back (`restore_interrupted_resaves`), never removed. It never touches a directory whose
writer is alive, nor one written on another host (liveness cannot be checked from here: it is
reported, not removed). Scratch directories named before owners were recorded count as dead
once nothing in them changed for `UNOWNED_GRACE_S`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ludic.training.checkpoint_manifest import fsync_path

logger = logging.getLogger(__name__)

UNOWNED_GRACE_S = 3600.0
_OWNED = re.compile(
    r"^\.(?:tmp|old)-step_\d+-[0-9a-f]{8}-(?P<pid>\d+)-(?P<start>\d+)-(?P<host>[A-Za-z0-9._-]+)$"
)
_UNOWNED = re.compile(r"^\.(?:tmp|old)-step_\d+-[0-9a-f]{8}$")
_ASIDE = re.compile(r"^\.old-(?P<step>step_\d+)-")


@dataclass(frozen=True, kw_only=True, slots=True)
class Writer:
    """A process that writes checkpoints: pid, start time (clock ticks since boot; 0 where
    unknown) and host name (sanitised for a file name)."""

    pid: int
    start: int
    host: str

    def is_alive(self) -> bool:
        """Whether this process still runs (True when it cannot be told, e.g. another host)."""
        if self.host != this_host():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by another user
        state, start = _proc_stat(self.pid)
        if state == "Z":  # killed, not yet reaped
            return False
        return not (self.start and start and start != self.start)  # pid reused by another


def this_host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "unknown"


def this_writer() -> Writer:
    pid = os.getpid()
    return Writer(pid=pid, start=_proc_stat(pid)[1], host=this_host())


def scratch_name(kind: Literal["tmp", "old"], final_name: str) -> str:
    """`.{kind}-{final_name}-{random}-{pid}-{start}-{host}`: unique, and names its writer."""
    writer = this_writer()
    return f".{kind}-{final_name}-{uuid.uuid4().hex[:8]}-{writer.pid}-{writer.start}-{writer.host}"


def swap_in(tmp: Path, final: Path) -> None:
    """Rename the written checkpoint `tmp` to `final`. Re-saving a step moves the old one aside
    first and drops it after: killed between the renames, the aside (named after this dead
    writer) is renamed back by the next listing (`restore_interrupted_resaves`), so the step is
    never lost. A file or symlink (even a broken one or a loop) in the step's name is replaced
    too."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(scratch_name("old", final.name))
        os.replace(final, old)
        fsync_path(final.parent)
    os.replace(tmp, final)
    fsync_path(final.parent)
    if old is not None and old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    elif old is not None:  # a file or symlink in the step's name: no checkpoint
        old.unlink(missing_ok=True)


def writer_of(name: str) -> Writer | None:
    """The writer recorded in a scratch directory's name (None: not an owned scratch name)."""
    match = _OWNED.match(name)
    if match is None:
        return None
    return Writer(pid=int(match["pid"]), start=int(match["start"]), host=match["host"])


def stale_scratch_dirs(root: Path, *, now: float | None = None) -> tuple[list[Path], list[Path]]:
    """(scratch directories under `root` whose writer is gone, those written on another host)."""
    if not root.is_dir():
        return [], []
    now = time.time() if now is None else now
    stale, foreign = [], []
    for path in sorted(root.iterdir()):
        if not path.is_dir():
            continue
        writer = writer_of(path.name)
        if writer is not None:
            if writer.host != this_host():
                foreign.append(path)
            elif not writer.is_alive():
                stale.append(path)
        elif _UNOWNED.match(path.name) and now - _newest_mtime(path) > UNOWNED_GRACE_S:
            stale.append(path)
    return stale, foreign


def restore_interrupted_resaves(root: Path) -> list[Path]:
    """Rename back each `.old-step_N-*` aside of a dead writer under `root` whose `step_N` is
    gone (a re-save killed between its renames); returns the restored `step_N` paths. Where the
    rename fails (a read-only copy), it says which command restores the step."""
    if not root.is_dir() or not any(_ASIDE.match(p.name) for p in root.iterdir()):
        return []
    restored = []
    for aside in stale_scratch_dirs(root)[0]:
        match = _ASIDE.match(aside.name)
        if match is None:
            continue
        step_dir = root / match["step"]
        if step_dir.exists():
            continue  # killed after the second rename: the aside is an old copy to remove
        try:
            os.rename(aside, step_dir)
        except OSError as e:
            logger.warning(
                "%s is missing: a re-save of it was killed mid-way and left the previous one as "
                "%s, which cannot be renamed back (%s); restore it with: mv %s %s",
                step_dir,
                aside.name,
                e,
                aside,
                step_dir,
            )
            continue
        logger.warning(
            "restored %s from %s: a re-save of that step was killed between its renames",
            step_dir.name,
            aside.name,
        )
        restored.append(step_dir)
    return restored


def remove_stale_scratch(root: Path, *, warn_foreign: bool = False) -> list[Path]:
    """Restore interrupted re-saves, then remove the scratch directories of dead writers under
    `root`; returns what was removed."""
    restore_interrupted_resaves(root)
    stale, foreign = stale_scratch_dirs(root)
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
        logger.info("removed %s, left by a checkpoint save that did not finish", path)
    if warn_foreign and foreign:
        logger.warning(
            "%d unfinished checkpoint save(s) from another host under %s (%s): left alone, since "
            "their writers may still run; delete them once those runs are gone",
            len(foreign),
            root,
            ", ".join(p.name for p in foreign),
        )
    return stale


def _proc_stat(pid: int) -> tuple[str, int]:
    """(state letter, start time in clock ticks since boot) from /proc; ("", 0) if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
    try:
        return fields[0], int(fields[19])  # state is field 3, starttime field 22 (man proc)
    except (IndexError, ValueError):
        return "", 0


def _newest_mtime(path: Path) -> float:
    newest = 0.0
    for entry in [path, *path.rglob("*")]:
        try:
            newest = max(newest, entry.stat().st_mtime)
        except OSError:
            continue
    return newest
