"""RestrictedSubprocessBackend: the fallback when bubblewrap cannot run. Weaker, and says so.

What it enforces: rlimits (address space, CPU, processes, file size, no core), a clean
environment, a scratch directory as working directory, no_new_privs, a new session killed as
a group, a wall-time and output cap; a network namespace when the kernel allows one (root, or
unprivileged user namespaces). As root it also runs the program as a claimed unprivileged uid,
so root-only files and directories are closed to it and every process of that uid is killed
at the end. Memory: as for bubblewrap, a per-run memory cgroup where one can be made (the
launcher waits at a gate until it is inside), else one process per run. What it does not: hide world-readable host files, stop writes to world-writable
places (e.g. /tmp, /dev/shm), or isolate processes and IPC. `weaknesses` lists what applies
on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from ludic.sandbox.bubblewrap import default_python, launcher_source
from ludic.sandbox.cgroup import (
    MemoryCgroups,
    cgroup_opener,
    find_memory_cgroups,
    gate_pipe,
    with_cgroup_outcome,
)
from ludic.sandbox.host import claim_uid, kill_uid_processes, running_as_root, scratch_dir
from ludic.sandbox.records import SandboxIsolationWarning, SandboxLimits, SandboxResult
from ludic.sandbox.runner import kill_process_group, run_contained

_PROBE_LIMITS = SandboxLimits(wall_time_s=30.0, cpu_time_s=10, max_output_bytes=4096)
_log = logging.getLogger("ludic.sandbox")
_warned = False


def _warn_once(weaknesses: Sequence[str]) -> None:
    global _warned
    if not _warned:
        _warned = True
        message = (
            "ludic.sandbox: running untrusted code with the weaker restricted-subprocess "
            "backend (install bubblewrap for real isolation: apt-get install bubblewrap); "
            "it does not: " + "; ".join(weaknesses)
        )
        _log.warning(message)
        warnings.warn(message, SandboxIsolationWarning, stacklevel=3)


class RestrictedSubprocessBackend:
    """Runs programs as restricted subprocesses. `isolate_network=None` uses a network
    namespace when `probe()` finds one possible; True requires it; False skips it.
    `memory_cgroups` as for `BubblewrapBackend`."""

    isolation = "subprocess"

    def __init__(
        self,
        *,
        python: str | None = None,
        isolate_network: bool | None = None,
        memory_cgroups: MemoryCgroups | Literal["auto"] | None = "auto",
    ) -> None:
        self.python = python or default_python()
        self.isolate_network = isolate_network
        self._launcher = launcher_source()
        if memory_cgroups == "auto":
            found = find_memory_cgroups()
            memory_cgroups = found if isinstance(found, MemoryCgroups) else None
        self.memory_cgroups: MemoryCgroups | None = memory_cgroups

    @property
    def memory_scope(self) -> str:
        """What `memory_bytes` caps: "cgroup2" / "cgroup1" (the whole run), or "process"."""
        return self.memory_cgroups.scope if self.memory_cgroups else "process"

    @property
    def weaknesses(self) -> tuple[str, ...]:
        """What this backend cannot guarantee here (after `probe()`, for the network)."""
        gaps = [
            "hide world-readable host files",
            "stop writes to world-writable host directories",
            "isolate processes or IPC",
            "cap the total size of its scratch directory (host disk; only each file's size)",
        ]
        if not running_as_root():
            gaps.append(
                "keep the program out of the trainer's files or processes (same uid), or "
                "kill children that leave its session"
            )
        if self.isolate_network is not True:
            gaps.append("cut the network (no network namespace)")
        return tuple(gaps)

    async def probe(self) -> str | None:
        hello = [self.python, "-c", "print('ok')"]
        if self.isolate_network is None:
            self.isolate_network = True
            if not _succeeded(await self.run(hello, limits=_PROBE_LIMITS)):
                self.isolate_network = False
        result = await self.run(hello, limits=_PROBE_LIMITS)
        if not _succeeded(result):
            return (
                f"restricted subprocess cannot run {self.python} (exit {result.exit_code}): "
                f"{result.stderr.strip()[:500]}"
            )
        _warn_once(self.weaknesses)
        return None

    def command(
        self,
        argv: Sequence[str],
        scratch: Path,
        limits: SandboxLimits,
        uid: int | None,
        *,
        gate_fd: int | None = None,
    ) -> list[str]:
        config = {
            "block_fd": gate_fd,
            "unshare_net": bool(self.isolate_network),
            "uid": uid,
            "nproc": limits.max_processes if self.memory_cgroups else 1,
            "nproc_on_top_of_own": uid is None,
            "as": limits.memory_bytes,
            "cpu": limits.cpu_time_s,
            "fsize": limits.max_file_bytes,
            "cwd": str(scratch),
            "env": {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(scratch),
                "TMPDIR": str(scratch),
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
        }
        return [self.python, "-I", "-S", "-c", self._launcher, json.dumps(config), *argv]

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
            cgroup = None
            if self.memory_cgroups is not None:
                cgroup = stack.enter_context(self.memory_cgroups.run_cgroup(limits.memory_bytes))
            gate = stack.enter_context(gate_pipe()) if cgroup is not None else None

            async def kill(proc: asyncio.subprocess.Process) -> None:
                await kill_process_group(proc)
                if uid is not None:
                    kill_uid_processes(uid)
                if cgroup is not None:
                    cgroup.kill_all()

            result = await run_contained(
                self.command(argv, scratch, limits, uid, gate_fd=gate[0] if gate else None),
                stdin=stdin,
                limits=limits,
                isolation=self.isolation,
                kill=kill,
                on_start=cgroup_opener(cgroup, gate[1]) if cgroup and gate else None,
                env={},
                popen_kwargs={"cwd": str(scratch), "pass_fds": [gate[0]] if gate else []},
                memory_scope=self.memory_scope,
            )
            return with_cgroup_outcome(result, cgroup)


def _succeeded(result: SandboxResult) -> bool:
    return result.exit_code == 0 and result.stdout == "ok\n"
