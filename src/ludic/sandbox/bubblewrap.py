"""BubblewrapBackend: the preferred sandbox, built on bubblewrap (`bwrap`, Debian package
`bubblewrap`).

The program runs in fresh user, pid, network, ipc, uts and mount namespaces: `/usr` (plus the
`/bin`, `/lib` links and a few `/etc` files the dynamic linker needs) read-only, a private
`/proc`, a minimal `/dev`, a size-capped tmpfs `/tmp`, and the scratch directory at `/work`
as its working directory. Nothing else of the host is mounted (no `/root`, `/home`, the repo
or the trainer's temp files); the environment is cleared; only loopback exists, and it is not
the host's. Resource limits come from `prlimit` (or the Python launcher) inside. As root, bwrap
itself runs as a claimed unprivileged uid (see `host`), so RLIMIT_NPROC holds.
It deliberately adds no seccomp filter and no cgroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ludic.sandbox.host import claim_uid, kill_uid_processes, running_as_root, scratch_dir
from ludic.sandbox.records import SandboxLimits, SandboxResult
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


def limit_prefix(limits: SandboxLimits, *, prlimit: str | None, python: str) -> list[str]:
    """argv that applies `limits` to the program that follows it (inside the namespaces,
    so RLIMIT_NPROC counts only the sandbox's own tasks)."""
    if prlimit is not None:
        return [
            prlimit,
            f"--as={limits.memory_bytes}",
            f"--cpu={limits.cpu_time_s}:{limits.cpu_time_s + 1}",
            f"--nproc={limits.max_processes}",
            f"--fsize={limits.max_file_bytes}",
            "--core=0",
            "--",
        ]
    config = {
        "as": limits.memory_bytes,
        "cpu": limits.cpu_time_s,
        "nproc": limits.max_processes,
        "fsize": limits.max_file_bytes,
        "cwd": WORKDIR,
        "env": dict(SANDBOX_ENV),
    }
    return [python, "-I", "-S", "-c", launcher_source(), json.dumps(config)]


class BubblewrapBackend:
    """Runs programs under bubblewrap. `ro_binds` adds host paths, read-only at the same place
    (the interpreter's prefix is added when it is not under /usr)."""

    isolation = "bubblewrap"

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        python: str | None = None,
        ro_binds: Sequence[str] = (),
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

    def command(self, argv: Sequence[str], scratch: Path, limits: SandboxLimits) -> list[str]:
        """The full bwrap command line for one run."""
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
        args += ["--size", str(limits.max_file_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
        args += ["--bind", str(scratch), WORKDIR, "--chdir", WORKDIR, "--clearenv"]
        for key, value in SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        args += ["--", *limit_prefix(limits, prlimit=self.prlimit, python=self.python)]
        return [*args, *argv]

    async def probe(self) -> str | None:
        if shutil.which(self.bwrap) is None:
            return (
                f"{self.bwrap!r} not found; install it (Debian/Ubuntu: apt-get install bubblewrap)"
            )
        result = await self.run([self.python, "-c", "print('ok')"], limits=_PROBE_LIMITS)
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
        with contextlib.ExitStack() as stack:
            uid = stack.enter_context(claim_uid()) if running_as_root() else None
            scratch = stack.enter_context(scratch_dir(files or {}, owner=uid))

            async def cleanup(proc: asyncio.subprocess.Process) -> None:
                # bwrap's death takes the pid namespace with it; the uid sweep is a backstop.
                await kill_process_group(proc)
                if uid is not None:
                    kill_uid_processes(uid)

            return await run_contained(
                self.command(argv, scratch, limits),
                stdin=stdin,
                limits=limits,
                isolation=self.isolation,
                kill=cleanup,
                signal_as_128_plus=True,
                env={},
                popen_kwargs={"user": uid, "group": uid, "extra_groups": []} if uid else None,
            )
