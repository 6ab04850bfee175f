"""The CPU benches the README's table quotes say in their JSON what measured them
(`measured_on`: UTC date, CPU model, cores, load average before and after), so a row can be
labelled with its date and machine; rollout_overhead.py and off_loop_overhead.py printed none
of these, inference.py and train_step.py only the architecture."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
@pytest.mark.parametrize("script", ["rollout_overhead.py", "off_loop_overhead.py"])
def test_report_names_date_machine_and_load(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--episodes", "8", "--steps", "1", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout)["measured_on"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", measured["date"]), measured
    assert isinstance(measured["cpu"], str) and measured["cpu"], measured
    assert measured["cores"] == os.cpu_count()
    before, after = measured["loadavg_before_after"]
    assert len(before) == len(after) == 3
