"""Sandbox records and the backend seam: resource limits, the result of one run, and the
`SandboxBackend` protocol every isolation technique implements.

Plain data and one Protocol; it deliberately runs nothing (see `runner` and the backends).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

MiB = 1024 * 1024
_STDERR_TAIL = 4000  # where a dying program reports why
# RLIMIT_NPROC makes fork/clone fail with EAGAIN: Python's BlockingIOError (os.fork,
# subprocess), its "can't start new thread", dash's "Cannot fork", bash's / perror's "fork: ...".
_PROCESS_ERRORS = re.compile(
    r"^BlockingIOError: \[Errno 11\]|can't start new thread|Cannot fork"
    r"|\bfork: (?:retry: )?Resource temporarily unavailable",
    re.MULTILINE,
)
# RLIMIT_FSIZE: SIGXFSZ kills a program that does not ignore it; one that does (Python) gets
# EFBIG ("File too large"); a shell reports a child SIGXFSZ killed as "File size limit exceeded".
# EFBIG (a file over max_file_bytes) and ENOSPC (a write that found its capped tmpfs full: the
# only writable places in the sandbox are /tmp and /dev/shm, max_file_bytes each, and the
# scratch directory, scratch_bytes)
_FILE_SIZE_ERRORS = re.compile(
    r"File too large$|File size limit exceeded|No space left on device", re.MULTILINE
)
_OVER_FILE_SIZE = re.compile(r"File too large$|File size limit exceeded", re.MULTILINE)


class SandboxStartError(RuntimeError):
    """The sandbox failed before it ran the program (e.g. bwrap could not create its
    namespaces): the host's failure, not the program's, so it is raised instead of being
    returned as the program's exit status, and never cached."""


class SandboxIsolationWarning(UserWarning):
    """Sandboxed code will run with weaker isolation than Ludic gives where the host allows
    it (no bubblewrap, or no memory cgroup for a whole-run memory cap)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxLimits:
    """Limits for one sandboxed run.

    - `wall_time_s`: killed after this many seconds of real time (`timed_out`).
    - `cpu_time_s`: RLIMIT_CPU in whole seconds (SIGXCPU, then SIGKILL a second later): each
      process's own, so a run that forks may use more in all (`wall_time_s` bounds it).
    - `memory_bytes`: memory of the whole run: every process together plus what it stores in
      its tmpfs mounts, capped by a memory cgroup (`SandboxResult.memory_scope` "cgroup1" or
      "cgroup2"; the kernel kills a process at the cap). It is also RLIMIT_AS per process
      (allocations fail: Python raises MemoryError). Where no memory cgroup can be made,
      the run may hold only one process (`memory_scope` "process"; forks and threads fail),
      so the per-process limit is the limit of the whole run.
    - `max_processes`: tasks (processes and threads) the sandbox may hold at once (1 where
      `memory_scope` is "process").
    - `max_file_bytes`: RLIMIT_FSIZE, the largest file it may write; also the size of each of
      the sandbox's `/tmp` and `/dev/shm` (size-capped tmpfs mounts; `/` and `/dev` are
      read-only).
    - `scratch_bytes`: the size of the scratch directory (the working directory, a tmpfs
      holding the run's files): everything the run stores there together.
    - `max_output_bytes`: per stream (stdout, stderr); more is cut and the run killed.
    """

    wall_time_s: float = 10.0
    cpu_time_s: int = 5
    memory_bytes: int = 512 * MiB
    max_processes: int = 32
    max_file_bytes: int = 16 * MiB
    scratch_bytes: int = 64 * MiB
    max_output_bytes: int = 1 * MiB

    def __post_init__(self) -> None:
        for name in (
            "wall_time_s",
            "cpu_time_s",
            "memory_bytes",
            "max_processes",
            "max_file_bytes",
            "scratch_bytes",
            "max_output_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
        if not isinstance(self.cpu_time_s, int):
            raise ValueError(
                f"SandboxLimits.cpu_time_s must be whole seconds (RLIMIT_CPU), got "
                f"{self.cpu_time_s!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxResult:
    """What one sandboxed run did. JSON-safe through `to_dict` (for step info).

    `exit_code` is the program's exit status, None when a signal ended it (`killed_signal`).
    `timed_out` is the wall-time limit; `cpu_time_exceeded`, `memory_exceeded`,
    `processes_exceeded` and `file_size_exceeded` are best-effort readings of how the program
    died (`memory_exceeded` is certain where a memory cgroup recorded a kill; the last two are
    read from the signal or the error a failed program reported). `isolation` names the
    backend that ran it, e.g. "bubblewrap" or "subprocess" (weaker), so a weak sandbox is
    never silent; `memory_scope` says what
    `memory_bytes` capped: "cgroup2" / "cgroup1" (all processes of the run together),
    "container" (the container's cgroup) or "process" (one process; the run could not fork).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    cpu_time_exceeded: bool = False
    memory_exceeded: bool = False
    output_truncated: bool = False
    killed_signal: int | None = None
    duration_s: float = 0.0
    isolation: str = ""
    memory_scope: str = ""
    cached: bool = False

    @property
    def processes_exceeded(self) -> bool:
        """The process cap refused a fork or thread and the program failed, reporting it
        (a program that copes and exits 0 hit no limit)."""
        return self.exit_code != 0 and bool(_PROCESS_ERRORS.search(self.stderr[-_STDERR_TAIL:]))

    @property
    def file_size_exceeded(self) -> bool:
        """A write went over `max_file_bytes`, or found its capped tmpfs full (`/tmp` and
        `/dev/shm` hold `max_file_bytes`, the scratch directory `scratch_bytes`): SIGXFSZ
        killed the program, or it failed reporting the EFBIG or ENOSPC."""
        return self.killed_signal == signal.SIGXFSZ or (
            self.exit_code != 0 and bool(_FILE_SIZE_ERRORS.search(self.stderr[-_STDERR_TAIL:]))
        )

    @property
    def storage_full(self) -> bool:
        """The file-size limit was a full tmpfs (ENOSPC: the scratch directory's
        `scratch_bytes`, or `/tmp` / `/dev/shm`'s `max_file_bytes`; which one, the result
        cannot tell), not a single file over `max_file_bytes` (SIGXFSZ or EFBIG)."""
        return (
            self.file_size_exceeded
            and self.killed_signal != signal.SIGXFSZ
            and not _OVER_FILE_SIZE.search(self.stderr[-_STDERR_TAIL:])
        )

    @property
    def limit_hit(self) -> str | None:
        """The first limit the run hit, in this order: "wall_time", "cpu_time", "memory",
        "output", "processes" (a fork or thread the process cap refused), "file_size" (a write
        over `max_file_bytes`, or into a full tmpfs: see `storage_full`), or None."""
        if self.timed_out:
            return "wall_time"
        if self.cpu_time_exceeded:
            return "cpu_time"
        if self.memory_exceeded:
            return "memory"
        if self.output_truncated:
            return "output"
        if self.processes_exceeded:
            return "processes"
        if self.file_size_exceeded:
            return "file_size"
        return None

    @property
    def ok(self) -> bool:
        """Exited with status 0 and hit no limit."""
        return self.exit_code == 0 and self.limit_hit is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class SandboxBackend(Protocol):
    """One way of isolating a program.

    `run` copies `files` (relative name -> content) into a fresh scratch directory, which is
    the program's working directory and its only writable place, runs `argv` there with
    `stdin`, and never raises for anything the program does. `python` is the interpreter path
    as seen inside the sandbox. `probe` returns None when the backend works on this machine,
    else the reason it does not.
    """

    @property
    def isolation(self) -> str: ...

    @property
    def python(self) -> str: ...

    async def probe(self) -> str | None: ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes = b"",
        limits: SandboxLimits,
    ) -> SandboxResult: ...


_MEMORY_ERRORS = re.compile(
    r"^MemoryError\b|Cannot allocate memory|std::bad_alloc|out of memory", re.MULTILINE
)


def memory_error_reported(stderr: str) -> bool:
    """Whether the end of `stderr` reports a failed allocation (MemoryError, bad_alloc, ...)."""
    return bool(_MEMORY_ERRORS.search(stderr[-_STDERR_TAIL:]))


def classify_exit(
    returncode: int,
    stderr: str,
    *,
    limits: SandboxLimits,
    duration_s: float,
    killed_by_runner: bool,
    signal_as_128_plus: bool,
) -> dict[str, Any]:
    """Exit code, signal and limit flags from a raw return code (pure; best-effort).

    Backends that run the program under a wrapper (bwrap, docker) report a signal death as
    128 + signal; plain subprocesses report it as a negative code.
    """
    killed_signal: int | None = None
    if returncode < 0:
        killed_signal = -returncode
    elif signal_as_128_plus and 128 < returncode < 128 + 65:
        killed_signal = returncode - 128
    exit_code = None if killed_signal is not None else returncode
    cpu = killed_signal == signal.SIGXCPU or (
        killed_signal == signal.SIGKILL and not killed_by_runner and duration_s >= limits.cpu_time_s
    )
    # RLIMIT_AS makes allocations fail (MemoryError); a cgroup limit (containers) SIGKILLs.
    oom_kill = killed_signal == signal.SIGKILL and not killed_by_runner and not cpu
    memory = not cpu and (oom_kill or memory_error_reported(stderr))
    return {
        "exit_code": exit_code,
        "killed_signal": killed_signal,
        "cpu_time_exceeded": cpu,
        "memory_exceeded": memory,
    }
