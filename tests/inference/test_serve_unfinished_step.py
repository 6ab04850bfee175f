"""`ludic serve --model RUN/checkpoints/step_N` of a step whose save never finished (no
MANIFEST.json) was refused only after the server had bound its port, so the refusal of the
model came after a port was taken (and, on a port in use, the port was named first). It is
refused before any socket is bound, in one line naming the last complete step, exit code 1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.models.test_loading_unfinished import fake_step

# a fresh interpreter that records every socket bind (Python's "socket.bind" audit event) on
# stderr before running the command as the `ludic` entry point does
_RUN_RECORDING_BINDS = """
import sys

def record(event, args):
    if event == "socket.bind":
        print(f"BOUND {args[1]!r}", file=sys.stderr, flush=True)

sys.addaudithook(record)
from ludic._console import main
sys.argv = ["ludic", *sys.argv[1:]]
main()
"""


def test_an_unfinished_step_is_refused_before_the_port_is_bound(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    complete = fake_step(root, 2, complete=True)
    fake_step(root, 3, complete=False)
    step = "run/checkpoints/step_00000003"
    with socket.socket() as taken:  # a port in use: named first, were the port bound first
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = ["serve", "--model", step, "--port", str(port)]
        result = subprocess.run(
            [sys.executable, "-c", _RUN_RECORDING_BINDS, *command],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=300,
        )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "BOUND" not in result.stderr, result.stderr[-2000:]
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"ludic serve: error: {step} has no MANIFEST.json"), lines
    assert (
        f"load the last complete step instead: {complete.relative_to(tmp_path)}/model" in (lines[0])
    )
    assert "in use" not in result.stderr
    assert lines[1:] == ["(LUDIC_TRACEBACK=1 shows the traceback)"]
