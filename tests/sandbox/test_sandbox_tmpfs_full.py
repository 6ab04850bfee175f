"""A program that fills a capped tmpfs with files each under max_file_bytes hit "file_size"."""

from __future__ import annotations

import asyncio

import pytest

from ludic.sandbox import SandboxLimits, SandboxPool

MiB = 2**20


@pytest.mark.parametrize("where", ["/tmp/f", "f"])  # /tmp: max_file_bytes; cwd: scratch_bytes
def test_filling_a_capped_tmpfs_names_the_limit(where: str) -> None:
    limits = SandboxLimits(
        wall_time_s=10, memory_bytes=256 * MiB, max_file_bytes=4 * MiB, scratch_bytes=4 * MiB
    )
    pool = SandboxPool(limits=limits)
    code = (
        f"i = 0\nwhile True:\n    open(f'{where}{{i}}', 'wb').write(b'x' * {3 * MiB})\n    i += 1"
    )
    result = asyncio.run(pool.run_python(code, use_cache=False))
    if result.isolation != "bubblewrap":
        pytest.skip("only bubblewrap mounts capped tmpfs")
    assert "No space left on device" in result.stderr
    assert result.limit_hit == "file_size"
