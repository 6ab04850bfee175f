"""`ludic actor` with nothing listening at `--redis-url` fails naming the URL and the fix
before it imports torch or transformers (loading them first took ~29 s of the failure on a
loaded box); the refusals that must come before Redis keep their place
(`test_actor_preset_checks.py`, `test_pipeline_flag_checks.py`, `test_env_kwargs.py`)."""

from __future__ import annotations

import pytest
from pipeline_fakes import free_port, ludic_without_torch

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce"])
def test_no_redis_is_named_before_torch_is_imported(algorithm: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # a free port: nothing listens there
    result = ludic_without_torch(
        "actor", "--redis-url", url, "--batches", "1", "--algorithm", algorithm
    )
    assert result.returncode == 1, result.stderr
    assert f"ludic actor: error: redis at {url} unreachable since startup (PING" in result.stderr
    assert "Is Redis running there? Start it (e.g. `redis-server --port" in result.stderr
    assert "imported before the Redis check" not in result.stderr
