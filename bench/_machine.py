"""What a bench's numbers were measured on, for its JSON report (README tables label each row
with it): the UTC date, the CPU model, the core count and the load average before and after
(other jobs on a shared box move timings). Not a benchmark; `bench/*.py` import it."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measured_on(load_before: tuple[float, float, float]) -> dict[str, object]:
    """The report's `measured_on` block; `load_before` is `os.getloadavg()` taken at start."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_before_after": [list(load_before), list(os.getloadavg())],
    }
