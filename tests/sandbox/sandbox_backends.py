"""Shared by the sandbox tests: every backend this machine can run, probed once, and what
the weaker ones cannot promise here (so a test asserts what they do guarantee and records
the rest as an expected weakness)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ludic.sandbox import (
    BubblewrapBackend,
    ContainerBackend,
    RestrictedSubprocessBackend,
    SandboxBackend,
    SandboxLimits,
    SandboxResult,
)

MiB = 1024 * 1024
# Container backends take part where their CLI is installed (they skip, saying why, when
# its daemon or image is missing).
BACKEND_NAMES = ["bubblewrap", "subprocess"] + [c for c in ("docker", "podman") if shutil.which(c)]
TEST_LIMITS = SandboxLimits(
    wall_time_s=20.0,
    cpu_time_s=10,
    memory_bytes=256 * MiB,
    max_processes=16,
    max_file_bytes=1 * MiB,
    max_output_bytes=64 * 1024,
)

_probed: dict[str, SandboxBackend | str] = {}


def _make(name: str) -> SandboxBackend:
    if name == "bubblewrap":
        return BubblewrapBackend()
    if name == "subprocess":
        return RestrictedSubprocessBackend()
    return ContainerBackend(cli=name)


async def get_backend(name: str) -> SandboxBackend:
    """The probed backend, or a skip saying why it does not work here."""
    if name not in _probed:
        backend = _make(name)
        problem = await backend.probe()
        _probed[name] = backend if problem is None else problem
    found = _probed[name]
    if isinstance(found, str):
        pytest.skip(f"{name} sandbox unavailable here: {found}")
    return found


def weakness(backend: SandboxBackend, guarantee: str) -> str | None:
    """Why `backend` cannot promise `guarantee` on this machine, or None when it can."""
    if not isinstance(backend, RestrictedSubprocessBackend):
        return None
    root = os.geteuid() == 0
    reasons = {
        "world_readable_files": "the subprocess backend shares the host filesystem",
        "host_tmp": "the subprocess backend can write world-writable host dirs such as /tmp",
        "private_files": None if root else "without root it runs as the trainer's own uid",
        "other_processes": None if root else "without root it runs as the trainer's own uid",
        "escaped_children": None if root else "without root a setsid child leaves its group",
        "network": None if backend.isolate_network else "no network namespace on this host",
    }
    return reasons[guarantee]


async def run_python(
    backend: SandboxBackend,
    code: str,
    *,
    marker: str = "",
    stdin: bytes = b"",
    limits: SandboxLimits = TEST_LIMITS,
) -> SandboxResult:
    """Run `code` as main.py; `marker` is passed as an argument so the test can find every
    process of the run in the host's /proc."""
    argv = [backend.python, "main.py", *([marker] if marker else [])]
    return await backend.run(argv, files={"main.py": code.encode()}, stdin=stdin, limits=limits)


def host_pids_with(marker: str) -> list[int]:
    """Host processes whose command line holds `marker` (sandboxed ones included)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmdline = (entry / "cmdline").read_bytes()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if marker.encode() in cmdline and stat[stat.rindex(")") + 2] not in "ZX":
                pids.append(int(entry.name))
    return pids


class EchoBackend:
    """Echoes stdin; records how many runs overlap. No processes."""

    isolation = "fake"
    python = "python3"

    def __init__(self, *, delay_s: float = 0.01, timed_out: bool = False) -> None:
        self.delay_s = delay_s
        self.timed_out = timed_out
        self.runs = 0
        self.active = 0
        self.peak = 0

    async def probe(self) -> str | None:
        return None

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes = b"",
        limits: SandboxLimits,
    ) -> SandboxResult:
        self.runs += 1
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.active -= 1
        return SandboxResult(
            stdout=stdin.decode(), stderr="", exit_code=0, timed_out=self.timed_out
        )


class ScriptedBackend:
    """Returns the scripted results in order, one per run, the last again once they run out.
    No processes."""

    isolation = "fake"
    python = "python3"

    def __init__(self, *results: SandboxResult) -> None:
        self.results = list(results)
        self.runs = 0

    async def probe(self) -> str | None:
        return None

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes = b"",
        limits: SandboxLimits,
    ) -> SandboxResult:
        self.runs += 1
        return self.results[min(self.runs, len(self.results)) - 1]
