"""`python examples/custom_env/train.py` run as a program answers a refusal (here an --out-dir
holding an earlier run's checkpoints) with one error line naming the problem and the fix and a
non-zero exit, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env" / "train.py"


def test_a_refused_out_dir_is_one_error_line(tmp_path: Path) -> None:
    step = tmp_path / "run" / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    (step / "MANIFEST.json").write_text("{}")
    (step / "state.json").write_text(json.dumps({"step": 2, "extra": {}}))
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out-dir", str(tmp_path / "run"), "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(
        f"train.py: error: {tmp_path / 'run'} holds an earlier run's checkpoints (newest: "
        "step_00000002)"
    )
    assert "Pass --resume to continue that run" in done.stderr
