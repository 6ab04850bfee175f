"""The code interpreter as an internal tool: `make_python_tool(pool)` returns an async
`python(code)` callable that ToolAgent / ReActAgent turn into a tool schema.

The code runs in a `ludic.sandbox` sandbox; the model sees stdout, stderr, the exit status
and which limit was hit, in a compact text. Each call is a fresh process: it deliberately
keeps no interpreter state between calls (no notebook semantics).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ludic.sandbox import SandboxLimits, SandboxPool, SandboxResult, shared_pool


def _limit_text(result: SandboxResult, limit: str, limits: SandboxLimits) -> str:
    if limit == "file_size" and result.storage_full:  # which tmpfs was full, it cannot tell
        return (
            f"storage, a write found its directory full (the working directory holds "
            f"{limits.scratch_bytes} bytes in all, /tmp and /dev/shm {limits.max_file_bytes} "
            "bytes each)"
        )
    return {
        "wall_time": f"wall time ({limits.wall_time_s:g} s), the program was killed",
        "cpu_time": f"CPU time ({limits.cpu_time_s} s), the program was killed",
        "memory": f"memory ({limits.memory_bytes / 2**20:g} MiB)",
        "output": f"output size ({limits.max_output_bytes} bytes), output cut and program killed",
        "processes": f"process count ({limits.max_processes}), a fork or thread was refused",
        "file_size": f"file size ({limits.max_file_bytes} bytes), a write was refused",
    }[limit]


def _clip(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} chars cut] ...\n{text[-half:]}"


def format_sandbox_result(
    result: SandboxResult, limits: SandboxLimits, *, max_chars: int = 2000
) -> str:
    """A compact report of one run for the model: status, the limit hit, stdout, stderr."""
    if result.exit_code is not None:
        lines = [f"exit status: {result.exit_code}"]
    else:
        lines = [f"killed by signal {result.killed_signal}"]
    if result.limit_hit is not None:
        lines.append("limit hit: " + _limit_text(result, result.limit_hit, limits))
    stdout = result.stdout if result.stdout.strip() else "(empty)"
    lines += ["stdout:", _clip(stdout.rstrip("\n"), max_chars)]
    if result.stderr.strip():
        lines += ["stderr:", _clip(result.stderr.rstrip("\n"), max_chars)]
    return "\n".join(lines)


def make_python_tool(
    pool: SandboxPool | None = None,
    *,
    limits: SandboxLimits | None = None,
    max_chars: int = 2000,
) -> Callable[[str], Awaitable[str]]:
    """An internal tool named `python` that runs code in `pool` (default: the event loop's
    `shared_pool()`) under `limits` (default: the pool's)."""

    async def python(code: str) -> str:
        """Run a Python 3 program in a sandbox and return its exit status, stdout and stderr.

        Each call is a fresh process with no network and no files from earlier calls; print
        what you want to see.

        Args:
            code: the complete program source; it can read nothing from stdin.
        """
        runner = pool or shared_pool()
        run_limits = limits or runner.limits
        result = await runner.run_python(code, limits=run_limits)
        return format_sandbox_result(result, run_limits, max_chars=max_chars)

    return python


__all__ = ["format_sandbox_result", "make_python_tool"]
