"""`cpu_time_s` is each process's RLIMIT_CPU, not a CPU budget of the whole run (unlike
memory, processes and files): a parent whose children each burn to their own limit exits 0
with no limit hit. The README's sandbox section must not claim every limit holds for the
whole run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from sandbox_backends import get_backend, run_python

from ludic.sandbox import SandboxLimits

README = Path(__file__).resolve().parents[2] / "README.md"
BURNING_CHILDREN = """
import os
pids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    pids.append(pid)
for pid in pids:
    _, status = os.waitpid(pid, 0)
    print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bubblewrap", "subprocess"])
async def test_each_process_has_its_own_cpu_time(name: str) -> None:
    backend = await get_backend(name)
    limits = SandboxLimits(wall_time_s=120.0, cpu_time_s=1, max_processes=8)
    result = await run_python(backend, BURNING_CHILDREN, limits=limits)
    # Each child used its own second (killed by SIGXCPU, or the SIGKILL after it); the parent,
    # which used almost none, lives on: the run as a whole spent more than cpu_time_s.
    killed = {int(line) for line in result.stdout.split()}
    assert killed <= {signal.SIGXCPU, signal.SIGKILL} and len(result.stdout.split()) == 2
    assert result.exit_code == 0 and result.limit_hit is None


def test_the_readme_says_cpu_time_is_per_process() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Running model-written code safely")
    section = " ".join(text[start : text.index("\n## ", start + 1)].split())
    assert "Limits hold for the whole run, not each process, except CPU time" in section
    assert "`cpu_time_s` is each process's own RLIMIT_CPU" in section
