"""`ludic learner` in a fresh process, pointed at a server of another model shape: the server
refuses its first push (a 400) and the learner ends with one `error:` line naming the server's
URL, the status, the server's words and the fix, not a traceback. A real embedded server
(`weight_server`), redis-server and learner, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from distributed_fakes import SPEC, TOKEN, ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from pipeline_fakes import RedisServer, redis_server

__all__ = ["redis_server"]  # a fixture
pytestmark = [pytest.mark.redis, pytest.mark.distributed, pytest.mark.timeout(300)]


def test_ludic_learner_ends_with_one_line_naming_the_refusal(
    weight_server: ServerProcess, redis_server: RedisServer, tmp_path: Path
) -> None:
    from ludic.models import tiny_model_dir

    wide = tiny_model_dir(spec=replace(SPEC, hidden_size=64, intermediate_size=128))
    args = ["--redis-url", redis_server.url, "--server-url", weight_server.url, "--token", TOKEN]
    args += ["--model", str(wide), "--steps", "1", "--out-dir", str(tmp_path / "learner")]
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "learner", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1", "LUDIC_TRACEBACK": ""},
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("ludic learner: error:")]
    assert len(errors) == 1, output[-3000:]
    assert f"server {weight_server.url}: push refused (400): " in errors[0]
    assert "shape mismatches" in errors[0]  # the server's own words
    assert "The server serves another model than the trainer's" in errors[0]
