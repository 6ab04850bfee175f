"""Memory cgroups: one cap on the memory of every process of a sandboxed run together,
tmpfs pages it writes included (the kernel charges those to the writer's cgroup).

`find_memory_cgroups()` looks for a place where this process may create memory cgroups:
`LUDIC_SANDBOX_CGROUP` when set (a cgroup v2 directory with `memory` in its
`cgroup.subtree_control`, or a cgroup v1 memory directory), else our own cgroup v2 when its
children get the memory controller (the delegated case), else our own cgroup in a v1 memory
hierarchy (hybrid hosts: root can create children there). Each run gets a child
`ludic-sbx-<pid>-<n>` limited to `SandboxLimits.memory_bytes` with no swap; the backend moves
the run's processes into it while they are held at a gate, before any untrusted code runs.

It deliberately moves no process it did not start (a cgroup v2 whose own cgroup holds
processes cannot hand the memory controller to children; delegate one, see the README), and
manages no other controller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import signal
import time
from asyncio.subprocess import Process
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ludic.sandbox.records import SandboxResult, memory_error_reported

ENV_VAR = "LUDIC_SANDBOX_CGROUP"
_PREFIX = "ludic-sbx-"
_counter = itertools.count()
_busy: set[Path] = set()  # run cgroups of ours that were still busy when their run ended
_log = logging.getLogger("ludic.sandbox")


@dataclass(frozen=True, slots=True)
class MemoryCgroups:
    """A directory where per-run memory cgroups can be created (`version` 1 or 2)."""

    parent: Path
    version: int

    @property
    def scope(self) -> str:
        """How a run's memory is capped: "cgroup2" or "cgroup1" (all processes together)."""
        return f"cgroup{self.version}"

    @contextlib.contextmanager
    def run_cgroup(self, memory_bytes: int) -> Iterator[RunCgroup]:
        """A fresh cgroup capped at `memory_bytes`; its processes are killed and it is removed
        on exit."""
        for leftover in list(_busy):
            with contextlib.suppress(OSError):
                leftover.rmdir()
                _busy.discard(leftover)
        path = self.parent / f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        path.mkdir()
        cgroup = RunCgroup(path=path, version=self.version)
        try:
            cgroup.limit(memory_bytes)
            yield cgroup
        finally:
            cgroup.kill_all()
            cgroup.remove()


@dataclass(frozen=True, slots=True)
class RunCgroup:
    """The memory cgroup of one run."""

    path: Path
    version: int

    def limit(self, memory_bytes: int) -> None:
        if self.version == 2:
            _write(self.path / "memory.max", memory_bytes)
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: no swap to use
                _write(self.path / "memory.swap.max", 0)
        else:
            _write(self.path / "memory.limit_in_bytes", memory_bytes)
            with contextlib.suppress(FileNotFoundError, PermissionError):
                _write(self.path / "memory.memsw.limit_in_bytes", memory_bytes)

    def pids(self) -> list[int]:
        text = (self.path / "cgroup.procs").read_text()
        return [int(pid) for pid in text.split()]

    def join_tree(self, root_pid: int) -> None:
        """Move `root_pid` and all its descendants in here; repeats until a full pass finds
        every one inside (a process forked during a pass is caught by the next). The tree
        must be held still (at a gate) so that none of it runs untrusted code meanwhile."""
        for _ in range(100):
            outside = [pid for pid in _tree(root_pid) if pid not in set(self.pids())]
            if not outside:
                return
            for pid in outside:
                with contextlib.suppress(ProcessLookupError):  # it exited: nothing to cap
                    _write(self.path / "cgroup.procs", pid)
        raise RuntimeError(f"could not move the sandbox's processes into {self.path}")

    def oom_kills(self) -> int:
        """How many processes the kernel killed here for memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError):
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def limit_reached(self) -> bool:
        """Whether usage ever hit the cap (v1 `failcnt`, v2 `max` events)."""
        with contextlib.suppress(OSError, ValueError):
            if self.version == 1:
                return int((self.path / "memory.failcnt").read_text()) > 0
            for line in (self.path / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value) > 0
        return False

    def kill_all(self) -> None:
        with contextlib.suppress(OSError):
            if self.version == 2 and (self.path / "cgroup.kill").exists():
                _write(self.path / "cgroup.kill", 1)
                return
        for _ in range(100):
            try:
                pids = self.pids()
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self, *, wait_s: float = 2.0) -> None:
        """rmdir, waiting briefly for killed processes to be reaped; a cgroup still busy then
        is removed by the next run (or, once this process is gone, by `remove_stale`)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    _busy.add(self.path)
                    _log.warning("ludic.sandbox: could not remove %s yet: %s", self.path, exc)
                    return
                time.sleep(0.01)


def _write(path: Path, value: int) -> None:
    with open(path, "w") as file:
        file.write(str(value))


def _tree(root_pid: int) -> list[int]:
    """`root_pid` and its live descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _own_cgroup_dirs() -> list[tuple[Path, int]]:
    """Our cgroup directories: (path, version), the v2 one first."""
    mounts: dict[str, Path] = {}  # "2" or a v1 controller -> mount point
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if kind and kind[0] == "cgroup2":
            mounts.setdefault("2", Path(fields[4]))
        elif kind and kind[0] == "cgroup" and "memory" in kind[-1].split(","):
            mounts.setdefault("memory", Path(fields[4]))
    found: list[tuple[Path, int]] = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if number == "0" and "2" in mounts:
            found.insert(0, (mounts["2"] / relative, 2))
        elif "memory" in controllers.split(",") and "memory" in mounts:
            found.append((mounts["memory"] / relative, 1))
    return found


def _usable(path: Path, version: int) -> str | None:
    """None when memory cgroups can be created under `path`, else why not."""
    if not path.is_dir():
        return f"{path} is not a cgroup directory"
    if version == 2:
        controls = path / "cgroup.subtree_control"
        if not controls.exists():
            return f"{path} is not a cgroup v2 directory"
        if "memory" not in controls.read_text().split():
            return (
                f"cgroup v2 {path} does not give its children the memory controller "
                "(memory is not in its cgroup.subtree_control)"
            )
    elif not (path / "memory.limit_in_bytes").exists():
        return f"{path} is not a cgroup v1 memory directory"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable by uid {os.geteuid()}"
    return None


def _try_create(candidate: MemoryCgroups) -> str | None:
    """Make, limit and remove a test cgroup: None when it all works."""
    try:
        with candidate.run_cgroup(64 * 1024 * 1024):
            pass
    except OSError as exc:
        return f"cannot create a memory cgroup in {candidate.parent}: {exc}"
    return None


_found: dict[str | None, MemoryCgroups | str] = {}


def find_memory_cgroups(*, use_cached: bool = True) -> MemoryCgroups | str:
    """Where run cgroups can be made here, or a sentence saying why nowhere (and what to do)."""
    explicit = os.environ.get(ENV_VAR) or None
    if use_cached and explicit in _found:
        return _found[explicit]
    result = _find(explicit)
    if isinstance(result, MemoryCgroups):
        remove_stale(result.parent)
    _found[explicit] = result
    return result


def _find(explicit: str | None) -> MemoryCgroups | str:
    if explicit is not None:
        path = Path(explicit)
        version = 2 if (path / "cgroup.subtree_control").exists() else 1
        problem = _usable(path, version)
        if problem is None:
            candidate = MemoryCgroups(parent=path, version=version)
            problem = _try_create(candidate)
            if problem is None:
                return candidate
        return f"{ENV_VAR}={explicit} cannot be used: {problem}"
    problems = []
    try:
        own = _own_cgroup_dirs()
    except (OSError, ValueError) as exc:
        own, problems = [], [f"cannot read this process's cgroups: {exc}"]
    for path, version in own:
        problem = _usable(path, version)
        if problem is None:
            candidate = MemoryCgroups(parent=path, version=version)
            problem = _try_create(candidate)
            if problem is None:
                return candidate
        problems.append(problem)
    if not own and not problems:
        problems.append("no cgroup filesystem is mounted")
    return (
        "; ".join(problems) + f". Delegate a cgroup v2 subtree with the memory controller to "
        f"this user and name it in {ENV_VAR} (e.g. systemd-run --user -p Delegate=yes, or a "
        "container started with a writable cgroup namespace), or run as root where the memory "
        "controller is mounted"
    )


def remove_stale(parent: Path) -> None:
    """Remove run cgroups left by trainer processes that are gone (empty ones only)."""
    with contextlib.suppress(OSError):
        for path in parent.glob(f"{_PREFIX}*"):
            pid = path.name[len(_PREFIX) :].split("-")[0]
            if pid.isdigit() and not Path("/proc", pid).exists():
                with contextlib.suppress(OSError):
                    path.rmdir()


@contextlib.contextmanager
def gate_pipe() -> Iterator[tuple[int, int]]:
    """A pipe: bwrap waits (`--block-fd`) on the read end until a byte is written."""
    read_fd, write_fd = os.pipe()
    try:
        yield read_fd, write_fd
    finally:
        os.close(read_fd)
        os.close(write_fd)


def cgroup_opener(cgroup: RunCgroup, gate_write_fd: int) -> Callable[[Process], Awaitable[None]]:
    """Moves the held sandbox into its cgroup, then opens the gate."""

    async def open_gate(proc: Process) -> None:
        cgroup.join_tree(proc.pid)
        os.write(gate_write_fd, b"1")

    return open_gate


def with_cgroup_outcome(result: SandboxResult, cgroup: RunCgroup | None) -> SandboxResult:
    """`result`, with `memory_exceeded` as the run's cgroup tells it: set when the kernel
    killed a process at the cap; cleared when a SIGKILL was read as one but the cgroup saw no
    OOM kill and never reached its cap (a program that killed itself, or was killed by another)."""
    if cgroup is None:
        return result
    if cgroup.oom_kills():
        if result.memory_exceeded:
            return result
        return dataclasses.replace(result, memory_exceeded=True, cpu_time_exceeded=False)
    guessed_from_sigkill = (
        result.memory_exceeded
        and result.killed_signal == signal.SIGKILL
        and not memory_error_reported(result.stderr)
    )
    if guessed_from_sigkill and not cgroup.limit_reached():
        return dataclasses.replace(result, memory_exceeded=False)
    return result
