"""A backend given to SandboxPool is probed on its first use, as a detected one is: one that
cannot run programs here is refused naming why (not a failed result for every run, which an
env scores as wrong code), and the probe settles what the backend adapts to the host (the
restricted backend's network namespace, otherwise never made)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from ludic.sandbox import RestrictedSubprocessBackend, SandboxLimits, SandboxPool, SandboxResult


class BrokenBackend:
    """Probes as a container backend does without its daemon; counts the runs it is given."""

    isolation = "fake"
    python = "python3"

    def __init__(self) -> None:
        self.probes = 0
        self.runs = 0

    async def probe(self) -> str | None:
        self.probes += 1
        return "docker daemon is not reachable (`docker info` failed)"

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes = b"",
        limits: SandboxLimits,
    ) -> SandboxResult:
        self.runs += 1
        return SandboxResult(stdout="", stderr="docker: cannot connect", exit_code=125)


async def test_a_given_backend_that_cannot_run_here_is_refused_naming_why() -> None:
    backend = BrokenBackend()
    pool = SandboxPool(backend)
    with pytest.raises(RuntimeError, match=r"BrokenBackend.*docker daemon is not reachable"):
        await pool.run_python("print(1)")
    with pytest.raises(RuntimeError, match="docker daemon is not reachable"):
        await pool.run_python("print(2)", use_cache=False)
    assert backend.runs == 0


async def test_a_given_backend_is_probed_once() -> None:
    backend = RestrictedSubprocessBackend()
    probes = 0
    probe = backend.probe

    async def counted() -> str | None:
        nonlocal probes
        probes += 1
        return await probe()

    backend.probe = counted  # type: ignore[method-assign]
    pool = SandboxPool(backend)
    results = await asyncio.gather(*(pool.run_python(f"print({i})") for i in range(3)))
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"] and probes == 1


async def test_the_restricted_backend_given_to_a_pool_cuts_the_network_where_it_can() -> None:
    probed = RestrictedSubprocessBackend()
    if await probed.probe() is not None or not probed.isolate_network:
        pytest.skip("no network namespace can be made on this host")
    backend = RestrictedSubprocessBackend()  # isolate_network=None: decided by its probe
    code = "import socket\nprint(sorted(name for _, name in socket.if_nameindex()))\n"
    result = await SandboxPool(backend).run_python(code)
    assert result.stdout == "['lo']\n", result  # a fresh network namespace holds loopback only
