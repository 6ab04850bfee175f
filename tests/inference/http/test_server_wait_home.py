"""`wait_for_servers` lives with the HTTP client code (`ludic.inference.http.server_wait`), not
in the Redis actor/learner package: `ludic eval` and `ludic train` wait for their servers with
it too, so importing it must load neither `ludic.pipeline` (Redis) nor torch."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
from ludic.inference.http.server_wait import wait_for_servers
assert callable(wait_for_servers)
loaded = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("torch", "redis", "transformers")
    or m.startswith(("ludic.pipeline", "ludic.training", "ludic.recipes"))
)
print(loaded)
"""


def test_the_server_wait_loads_no_pipeline_redis_or_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
