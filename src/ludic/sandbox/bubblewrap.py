"""BubblewrapBackend: the preferred sandbox, built on bubblewrap (`bwrap`, Debian package
`bubblewrap`).

The program runs in fresh user, pid, network, ipc, uts and mount namespaces: `/usr` (plus the
`/bin`, `/lib` links and a few `/etc` files the dynamic linker needs) read-only, a private
`/proc`, a minimal `/dev`, and three size-capped tmpfs mounts, the only writable places:
`/tmp` and `/dev/shm` (`max_file_bytes` each) and the scratch directory `/work`
(`scratch_bytes`), its working directory, which bwrap fills with the run's files. `/` and `/dev`
are remounted read-only (bwrap makes them tmpfs mounts sized at half the host's RAM). Nothing
else of the host is mounted (no `/root`, `/home`, the repo or the trainer's temp files); the
environment is cleared; only loopback exists, and it is not the host's.

Limits: `prlimit` (or the Python launcher) sets rlimits inside. Where a memory cgroup can be
made (`cgroup.find_memory_cgroups`), bwrap starts held at `--block-fd`, its processes are moved
into a fresh cgroup capped at `memory_bytes`, then the gate opens: every process of the run and
every page it writes to its tmpfs mounts count against one cap. Elsewhere the run is held to
one process (RLIMIT_NPROC 1) so that RLIMIT_AS caps the whole run. As root, bwrap itself runs
as a claimed unprivileged uid (see `host`), so RLIMIT_NPROC holds. It deliberately adds no
seccomp filter.

bwrap reports on `--json-status-fd` whether it ran the program: an "exit-code" line comes only
once its setup finished and the program was started. bwrap that exits without one never ran
it (no namespace, a mount that failed, no launcher): that is raised as a `SandboxStartError`
with bwrap's message, not returned as the program's exit status, so a host failure is never
scored as the model's code nor cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

from ludic.sandbox.cgroup import (
    MemoryCgroups,
    cgroup_opener,
    find_memory_cgroups,
    gate_pipe,
    with_cgroup_outcome,
)
from ludic.sandbox.host import claim_uid, kill_uid_processes, running_as_root
from ludic.sandbox.records import SandboxLimits, SandboxResult, SandboxStartError
from ludic.sandbox.runner import kill_process_group, run_contained

WORKDIR = "/work"
SANDBOX_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)
_PROBE_LIMITS = SandboxLimits(wall_time_s=30.0, cpu_time_s=10, max_output_bytes=4096)
_SAID_CHARS = 2000  # of bwrap's stderr, when it did not start the program


def default_python() -> str:
    """A Python interpreter for sandboxed code: the system one when there is one (it lives
    under /usr, which every backend can see), else the interpreter running Ludic."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return os.path.realpath(sys.executable)


def launcher_source() -> str:
    """The text of `_launch.py`, run with `python -I -S -c` inside sandboxes."""
    return (Path(__file__).parent / "_launch.py").read_text(encoding="utf-8")


def limit_prefix(
    limits: SandboxLimits, *, prlimit: str | None, python: str, nproc: int | None = None
) -> list[str]:
    """argv that applies `limits` to the program that follows it (inside the namespaces,
    so RLIMIT_NPROC counts only the sandbox's own tasks). `nproc` overrides
    `limits.max_processes` (1 where no cgroup caps the run's memory)."""
    nproc = limits.max_processes if nproc is None else nproc
    if prlimit is not None:
        return [
            prlimit,
            f"--as={limits.memory_bytes}",
            f"--cpu={limits.cpu_time_s}:{limits.cpu_time_s + 1}",
            f"--nproc={nproc}",
            f"--fsize={limits.max_file_bytes}",
            "--core=0",
            "--",
        ]
    config = {
        "as": limits.memory_bytes,
        "cpu": limits.cpu_time_s,
        "nproc": nproc,
        "fsize": limits.max_file_bytes,
        "cwd": WORKDIR,
        "env": dict(SANDBOX_ENV),
    }
    return [python, "-I", "-S", "-c", launcher_source(), json.dumps(config)]


def staged_files(files: Mapping[str, bytes]) -> list[tuple[PurePosixPath, bytes]]:
    """`files` as paths relative to the scratch directory; refuses names that escape it."""
    staged = []
    for name, content in files.items():
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not path.parts or "\0" in name:
            raise ValueError(
                f"sandbox file name {name!r} must be a relative path inside the scratch dir"
            )
        staged.append((path, content))
    return staged


@contextlib.contextmanager
def _memfds(staged: Sequence[tuple[PurePosixPath, bytes]]) -> Iterator[list[tuple[int, str]]]:
    """Each file's content in a memfd (bwrap copies it into the scratch tmpfs): (fd, path)."""
    opened: list[tuple[int, str]] = []
    try:
        for path, content in staged:
            fd = os.memfd_create("ludic-sbx-file")
            opened.append((fd, f"{WORKDIR}/{path}"))
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.lseek(fd, 0, os.SEEK_SET)
        yield opened
    finally:
        for fd, _ in opened:
            os.close(fd)


@contextlib.contextmanager
def _status_pipe() -> Iterator[tuple[int, int]]:
    """A pipe for bwrap's `--json-status-fd` (the write end); read after bwrap exits."""
    read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(read_fd, False)
        yield read_fd, write_fd
    finally:
        os.close(read_fd)
        os.close(write_fd)


def _program_started(status_fd: int) -> bool:
    """Whether bwrap's JSON status reports the program's exit code, which it writes only for
    a program it started (read once bwrap has exited, so all it wrote is in the pipe)."""
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(status_fd, 65536):
            data += chunk
    for line in data.decode("utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            if "exit-code" in json.loads(line):
                return True
    return False


def _check_started(result: SandboxResult, status_fd: int, bwrap: str) -> None:
    """Raises `SandboxStartError` when bwrap exited by itself without running the program.
    (A run killed by a limit or the runner has no exit code to report: it is the program's.)"""
    if result.killed_signal is not None or result.timed_out or _program_started(status_fd):
        return
    said = result.stderr.strip()[-_SAID_CHARS:] or "(nothing on stderr)"
    raise SandboxStartError(
        f"the sandbox did not start: {bwrap} exited with status {result.exit_code} before "
        f"running the program, saying: {said}. This is the host's failure, not the program's "
        "(e.g. the user-namespace limit reached under load: /proc/sys/user/max_*_namespaces)"
    )


class BubblewrapBackend:
    """Runs programs under bubblewrap. `ro_binds` adds host paths, read-only at the same place
    (the interpreter's prefix is added when it is not under /usr). `memory_cgroups="auto"`
    finds where per-run memory cgroups can be made (`find_memory_cgroups`); None runs
    without one (one process per run); `memory_problem` says why there is none."""

    isolation = "bubblewrap"

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        python: str | None = None,
        ro_binds: Sequence[str] = (),
        memory_cgroups: MemoryCgroups | Literal["auto"] | None = "auto",
    ) -> None:
        self.bwrap = bwrap or shutil.which("bwrap") or "bwrap"
        self.python = python or default_python()
        binds = list(ro_binds)
        real_python = Path(os.path.realpath(self.python))
        if not real_python.is_relative_to("/usr"):  # e.g. pyenv, conda: <prefix>/bin/python
            binds.append(str(real_python.parent.parent))
        self.ro_binds = tuple(binds)
        prlimit = "/usr/bin/prlimit"
        self.prlimit: str | None = prlimit if os.access(prlimit, os.X_OK) else None
        self.memory_problem: str | None = None
        if memory_cgroups == "auto":
            found = find_memory_cgroups()
            memory_cgroups = found if isinstance(found, MemoryCgroups) else None
            self.memory_problem = found if isinstance(found, str) else None
        elif memory_cgroups is None:
            self.memory_problem = "memory cgroups were turned off (memory_cgroups=None)"
        self.memory_cgroups: MemoryCgroups | None = memory_cgroups

    @property
    def memory_scope(self) -> str:
        """What `memory_bytes` caps: "cgroup2" / "cgroup1" (the whole run), or "process"."""
        return self.memory_cgroups.scope if self.memory_cgroups else "process"

    def command(
        self,
        argv: Sequence[str],
        limits: SandboxLimits,
        *,
        files: Sequence[tuple[int, str]] = (),
        gate_fd: int | None = None,
        status_fd: int | None = None,
    ) -> list[str]:
        """The full bwrap command line for one run: `files` are (fd, path in the sandbox)
        copied into the scratch tmpfs; with `gate_fd`, bwrap waits for a byte on it before
        starting the program; with `status_fd`, bwrap writes its JSON status there."""
        args = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        args += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for name in _ROOT_LINKS:
            path = Path("/", name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        for path_text in _ETC_FILES:
            args += ["--ro-bind-try", path_text, path_text]
        for path_text in self.ro_binds:
            args += ["--ro-bind", path_text, path_text]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for place, size in (("/dev/shm", limits.max_file_bytes), ("/tmp", limits.max_file_bytes)):
            args += ["--size", str(size), "--perms", "1777", "--tmpfs", place]
        args += ["--size", str(limits.scratch_bytes), "--perms", "0700", "--tmpfs", WORKDIR]
        for directory in sorted({str(PurePosixPath(p).parent) for _, p in files} - {WORKDIR}):
            args += ["--perms", "0755", "--dir", directory]
        for fd, target in files:
            args += ["--perms", "0644", "--file", str(fd), target]
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        args += ["--chdir", WORKDIR, "--clearenv"]
        for key, value in SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        if gate_fd is not None:
            args += ["--block-fd", str(gate_fd)]
        if status_fd is not None:
            args += ["--json-status-fd", str(status_fd)]
        nproc = None if self.memory_cgroups else 1
        prefix = limit_prefix(limits, prlimit=self.prlimit, python=self.python, nproc=nproc)
        return [*args, "--", *prefix, *argv]

    async def probe(self) -> str | None:
        if shutil.which(self.bwrap) is None:
            return (
                f"{self.bwrap!r} not found; install it (Debian/Ubuntu: apt-get install bubblewrap)"
            )
        try:
            result = await self.run([self.python, "-c", "print('ok')"], limits=_PROBE_LIMITS)
        except SandboxStartError as exc:
            return f"bwrap cannot start a sandbox here: {exc}"
        if result.exit_code == 0 and result.stdout == "ok\n":
            return None
        return (
            f"bwrap cannot start a sandbox here (exit {result.exit_code}, signal "
            f"{result.killed_signal}): {result.stderr.strip()[:500]}. Check that user "
            "namespaces are allowed (sysctl kernel.unprivileged_userns_clone, a container's "
            "seccomp profile) and, as root, that the interpreter and ro_binds are readable by "
            "an unprivileged uid (bwrap runs as one)"
        )

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes = b"",
        limits: SandboxLimits,
    ) -> SandboxResult:
        staged = staged_files(files or {})
        stored = sum(len(content) for _, content in staged)
        if stored > limits.scratch_bytes:
            raise ValueError(
                f"the run's files take {stored} bytes, more than its scratch directory holds "
                f"(SandboxLimits.scratch_bytes={limits.scratch_bytes}); raise scratch_bytes"
            )
        with contextlib.ExitStack() as stack:
            uid = stack.enter_context(claim_uid()) if running_as_root() else None
            file_fds = stack.enter_context(_memfds(staged))
            cgroup = None
            if self.memory_cgroups is not None:
                cgroup = stack.enter_context(self.memory_cgroups.run_cgroup(limits.memory_bytes))
            gate = stack.enter_context(gate_pipe()) if cgroup is not None else None
            status = stack.enter_context(_status_pipe())

            async def cleanup(proc: asyncio.subprocess.Process) -> None:
                # bwrap's death takes the pid namespace with it; the uid sweep is a backstop.
                await kill_process_group(proc)
                if uid is not None:
                    kill_uid_processes(uid)
                if cgroup is not None:
                    cgroup.kill_all()

            pass_fds = [fd for fd, _ in file_fds] + ([gate[0]] if gate else []) + [status[1]]
            popen: dict[str, object] = {"pass_fds": pass_fds}
            if uid is not None:
                popen |= {"user": uid, "group": uid, "extra_groups": []}
            gate_fd = gate[0] if gate else None
            result = await run_contained(
                self.command(argv, limits, files=file_fds, gate_fd=gate_fd, status_fd=status[1]),
                stdin=stdin,
                limits=limits,
                isolation=self.isolation,
                kill=cleanup,
                on_start=cgroup_opener(cgroup, gate[1]) if cgroup and gate else None,
                signal_as_128_plus=True,
                env={},
                popen_kwargs=popen,
                memory_scope=self.memory_scope,
            )
            _check_started(result, status[0], self.bwrap)
            return with_cgroup_outcome(result, cgroup)
