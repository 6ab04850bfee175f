"""Host-side plumbing for sandboxes: a private scratch directory per run, an unprivileged
host uid per concurrent sandbox when the trainer runs as root, and killing every process
of such a uid.

Why a uid of its own: as root, RLIMIT_NPROC is not enforced and root-owned files are
readable, so a sandbox started as root must drop to a uid that owns nothing. Uids are
claimed with a lock file, so concurrent sandboxes (and concurrent trainer processes) never
share one. It deliberately creates no users: the uids have no passwd entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

DEFAULT_UID_BASE = 61000
DEFAULT_UID_COUNT = 2000
_LOCK_DIR = "ludic-sandbox-uids"


def running_as_root() -> bool:
    return os.geteuid() == 0


def _uid_is_free(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False  # a real account: its files and processes are not ours to share


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / _LOCK_DIR
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.geteuid():
        raise RuntimeError(
            f"{path} is not a directory owned by uid {os.geteuid()}; remove it so the "
            "sandbox can keep its uid locks there"
        )
    return path


@contextlib.contextmanager
def claim_uid(base: int = DEFAULT_UID_BASE, count: int = DEFAULT_UID_COUNT) -> Iterator[int]:
    """Hold an unused host uid (no passwd entry, no other holder) for one sandbox run."""
    lock_dir = _lock_dir()
    for uid in range(base, base + count):
        if not _uid_is_free(uid):
            continue
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            kill_uid_processes(uid)  # leftovers of a crashed trainer must not join this run
            if _uid_pids(uid, dead=True):
                # Killed but not yet reaped (a slow or non-reaping pid 1): they still count
                # against the uid's RLIMIT_NPROC, so a run here could not fork. Take another.
                continue
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise RuntimeError(
        f"all sandbox uids {base}..{base + count - 1} are in use; lower the pool's "
        "concurrency or widen the uid range"
    )


def _uid_pids(uid: int, *, dead: bool = False) -> list[int]:
    """Live processes owned by `uid`; with `dead`, zombies waiting to be reaped too."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid == uid:
                stat = Path(entry.path, "stat").read_text()
                if dead or stat[stat.rindex(")") + 2] not in "ZX":
                    pids.append(int(entry.name))
    return pids


def kill_uid_processes(uid: int, *, rounds: int = 100) -> int:
    """SIGKILL every process owned by `uid` until none is left; returns how many were seen.

    Repeats because a process may fork between the scan and the kill (RLIMIT_NPROC bounds
    how many it can make, so this converges).
    """
    if uid == 0 or uid == os.geteuid():
        raise ValueError(f"refusing to kill every process of uid {uid} (that is us)")
    seen = 0
    for _ in range(rounds):
        pids = _uid_pids(uid)
        if not pids:
            break
        seen += len(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return seen


@contextlib.contextmanager
def scratch_dir(
    files: Mapping[str, bytes], *, owner: int | None, mode: int = 0o700
) -> Iterator[Path]:
    """A fresh temporary directory holding `files`, owned by `owner`; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ludic-sbx-"))
    try:
        for name, content in files.items():
            target = (path / name).resolve()
            if path.resolve() not in target.parents:
                raise ValueError(
                    f"sandbox file name {name!r} must be a relative path inside the scratch dir"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        if owner is not None:
            for p in (path, *path.rglob("*")):
                os.chown(p, owner, owner, follow_symlinks=False)
        path.chmod(mode)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
