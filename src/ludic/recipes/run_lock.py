"""`run_lock`: one run at a time in a run directory, and a clear refusal naming the other run.

A lock file in the directory holds an exclusive `flock` for as long as the run lives, and
records who holds it (pid, host, start time, command line). A second run that finds it held
raises `RunDirInUseError` naming that run at once, before it touches anything in the
directory (`check_run_lock` asks the same before a command loads its model). The kernel drops the lock when its process dies, however it dies (`kill -9`
included), so a file a killed run left is taken over by the next run, which says whose it
was. The file is removed when the run ends. It relies on POSIX `flock` (no-op where `fcntl`
is missing, e.g. Windows), so it protects runs on one machine, not across an NFS mount.

The commands that hold it (`ludic train`, `sft`, `quickstart`) are single-process: launched
by `torchrun` with WORLD_SIZE > 1, every rank would be a separate run in one directory, so
`check_single_process` refuses on every rank at once, naming what to use instead (the Trainer
under torchrun, or the pipeline learner). It does not share a lock between ranks.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ludic.errors import Refusal

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LUDIC_RUN",
    "RUN_LOCK",
    "MultiProcessLaunchError",
    "RunDirInUseError",
    "check_run_lock",
    "check_single_process",
    "run_lock",
]

RUN_LOCK = "run.lock"
"""The lock file of a `ludic train`, `sft` or `quickstart` run in its OUT_DIR."""

LUDIC_RUN = "ludic"
"""`what` for the commands' locks: the refusal names the holder's own command line, so a
`ludic train` refused by a `ludic sft` reads "in use by another ludic run (...: ludic sft ...)"."""


class RunDirInUseError(Refusal, RuntimeError):
    """Another live run holds the run directory's lock."""


class MultiProcessLaunchError(Refusal, RuntimeError):
    """A single-process command was launched as one of several processes (torchrun)."""


def check_single_process(command: str = "this ludic command") -> None:
    """Raise `MultiProcessLaunchError` when this process is one rank of several (torchrun's
    WORLD_SIZE > 1): every rank would run `command` on its own, in the same directory."""
    world_size = os.environ.get("WORLD_SIZE", "1").strip()
    if not world_size.isdigit() or int(world_size) <= 1:
        return
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "?"))
    raise MultiProcessLaunchError(
        f"{command} runs in one process, but this is rank {rank} of WORLD_SIZE={world_size} "
        "(launched by torchrun?): each rank would be a separate run in the same --out-dir. "
        "Run it without torchrun. For several training processes, write the loop with the "
        'Trainer and launch that script with torchrun (FSDP2; README "Multi-process training '
        '(FSDP2)"), or run the actor/learner pipeline with its learner under torchrun '
        "(`torchrun --nproc_per_node N -m ludic.pipeline learner ...`)."
    )


@contextmanager
def run_lock(
    path: Path, *, what: str, notice: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the lock file `path` while the block runs; `what` names the guarded run in the
    refusal (e.g. "`ludic train --local-server`"). `notice` hears about a file a dead run left.
    Refused under torchrun with WORLD_SIZE > 1 (`check_single_process`)."""
    check_single_process()
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = _acquire(path, what)
    try:
        left = _holder(handle)
        if left and notice is not None:
            notice(f"took over {path} from a run that no longer holds it ({_describe(left)})")
        _record(handle)
        yield
    finally:
        path.unlink(missing_ok=True)  # still held: no other run can hold this file meanwhile
        handle.close()  # drops the flock


def check_run_lock(path: Path, *, what: str) -> None:
    """Raise `RunDirInUseError` now if a live run holds `path` (cheap: a command calls it
    before loading a model; `run_lock` still decides, as another run may start meanwhile).
    Refused under torchrun with WORLD_SIZE > 1 (`check_single_process`)."""
    check_single_process()
    if fcntl is None or not path.exists():
        return
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115  # closed below
    except FileNotFoundError:  # the run holding it just ended
        return
    with handle:  # a shared probe: two commands checking at once never refuse each other
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirInUseError(_refusal(path, what, _holder(handle))) from None


def _acquire(path: Path, what: str) -> IO[str]:
    """The open lock file, flock-ed; retried when the file was replaced between the open and
    the lock (a run that ended removed it, another created a new one)."""
    assert fcntl is not None
    deadline = time.monotonic() + _PROBE_WAIT_S
    while True:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115  # closed by run_lock
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            handle.close()
            if not _alive(holder) and time.monotonic() < deadline:
                time.sleep(0.05)  # another command's `check_run_lock` probe, or a run that
                continue  # is still writing its record: both let go within moments
            raise RunDirInUseError(_refusal(path, what, holder)) from None
        try:
            same = os.fstat(handle.fileno()).st_ino == path.stat().st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()


def _holder(handle: IO[str]) -> dict[str, Any]:
    handle.seek(0)
    try:
        record = json.loads(handle.read() or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _record(handle: IO[str]) -> None:
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "?"
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
    handle.write(json.dumps({**record, "command": command}))
    handle.flush()


_PROBE_WAIT_S = 2.0
"""How long `run_lock` retries a lock held by no live run it can name (a probe, a starting run)."""


def _alive(holder: dict[str, Any]) -> bool:
    """The record names a live process on this host (another host's pid cannot be checked:
    taken as alive)."""
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a run that is starting (it has not written its pid yet)"
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
        f"{holder.get('started', '?')}: {holder.get('command', '?')}"
    )


def _refusal(path: Path, what: str, holder: dict[str, Any]) -> str:
    return (
        f"{path.parent} is in use by another {what} run ({_describe(holder)}); two runs in "
        "one directory would delete each other's files and overwrite each other's "
        f"checkpoints. Wait for it to end (or stop it), or pass another --out-dir. (Lock file: "
        f"{path}; the lock goes with its process, so a killed run's file is taken over.)"
    )
