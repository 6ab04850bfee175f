"""ContainerBackend: run programs in a throwaway Docker or Podman container, for users who
already run one of those (the image must be present locally; it is never pulled).

Each run is `<cli> run --rm` with no network, a read-only root, all capabilities dropped,
no_new_privs, an unprivileged user, memory / pids / CPU / file-size limits (the memory limit
is the container's cgroup: all its processes together, `memory_scope` "container"),
size-capped tmpfs /tmp and /dev/shm, and the scratch directory at /work. The scratch directory
is a host directory with no quota beyond the per-file size. It deliberately manages no long-lived
containers: start-up cost is the price of a clean one per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from ludic.sandbox.host import scratch_dir
from ludic.sandbox.records import SandboxLimits, SandboxResult
from ludic.sandbox.runner import kill_process_group, run_contained
from ludic.types import new_id

_PROBE_LIMITS = SandboxLimits(wall_time_s=60.0, cpu_time_s=10, max_output_bytes=4096)


async def _quiet(*argv: str, timeout_s: float = 30.0) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        return await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.kill()
        return -1


class ContainerBackend:
    """`cli` is "docker" or "podman"; `image` must hold `python` (default: python3)."""

    def __init__(
        self,
        *,
        cli: str = "docker",
        image: str = "python:3.11-slim",
        python: str = "python3",
        user: str = "65534:65534",
    ) -> None:
        self.cli = cli
        self.image = image
        self.python = python
        self.user = user
        self.isolation = Path(cli).name
        self.memory_scope = "container"

    def command(
        self, argv: Sequence[str], scratch: Path, limits: SandboxLimits, name: str
    ) -> list[str]:
        memory = str(limits.memory_bytes)
        return [
            self.cli, "run", "--rm", "-i", "--name", name,
            "--network", "none", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--user", self.user,
            "--memory", memory, "--memory-swap", memory,
            "--pids-limit", str(limits.max_processes), "--cpus", "1",
            "--ulimit", f"cpu={limits.cpu_time_s}:{limits.cpu_time_s + 1}",
            "--ulimit", f"fsize={limits.max_file_bytes}",
            "--ulimit", "core=0",
            "--tmpfs", f"/tmp:rw,size={limits.max_file_bytes}",
            "--shm-size", str(limits.max_file_bytes),
            "--volume", f"{scratch}:/work:rw", "--workdir", "/work",
            "--env", "HOME=/work", "--env", "PYTHONDONTWRITEBYTECODE=1",
            self.image, *argv,
        ]  # fmt: skip

    async def probe(self) -> str | None:
        if shutil.which(self.cli) is None:
            return f"{self.cli} CLI not found"
        if await _quiet(self.cli, "info") != 0:
            return f"{self.cli} daemon is not reachable (`{self.cli} info` failed)"
        if await _quiet(self.cli, "image", "inspect", self.image) != 0:
            return f"image {self.image!r} is not present locally; `{self.cli} pull` it first"
        result = await self.run([self.python, "-c", "print('ok')"], limits=_PROBE_LIMITS)
        if result.exit_code == 0 and result.stdout == "ok\n":
            return None
        return f"{self.cli} run failed (exit {result.exit_code}): {result.stderr.strip()[:500]}"

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes = b"",
        limits: SandboxLimits,
    ) -> SandboxResult:
        name = f"ludic-sbx-{new_id()[:16]}"

        async def kill(proc: asyncio.subprocess.Process) -> None:
            await _quiet(self.cli, "kill", name)
            await _quiet(self.cli, "rm", "-f", name)
            await kill_process_group(proc)

        async def no_leftovers(proc: asyncio.subprocess.Process) -> None:
            return None  # `run --rm` removed the container when its program ended

        # The container user is not the host owner of scratch: make it writable to all
        # (it sits in a private, randomly named temp directory and is removed afterwards).
        with scratch_dir(files or {}, owner=None, mode=0o777) as scratch:
            for path in scratch.rglob("*"):
                with contextlib.suppress(OSError):
                    path.chmod(0o777 if path.is_dir() else 0o666)
            return await run_contained(
                self.command(argv, scratch, limits, name),
                stdin=stdin,
                limits=limits,
                isolation=self.isolation,
                kill=kill,
                cleanup=no_leftovers,
                signal_as_128_plus=True,
                memory_scope=self.memory_scope,
                env=_cli_env(),
            )


def _cli_env() -> dict[str, str]:
    # The CLI needs to find its daemon (DOCKER_HOST, XDG_RUNTIME_DIR for rootless podman),
    # and nothing of it reaches the container, which gets only what `command` sets.
    keep = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "XDG_RUNTIME_DIR", "CONTAINER_HOST")
    return {k: os.environ[k] for k in keep if k in os.environ}
