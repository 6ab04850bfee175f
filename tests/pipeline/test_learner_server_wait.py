"""`ludic learner --server-wait-s`: how long the learner waits, before its model loads, for its
--server-url servers to listen (a fixed 300 s before, as the actor's). A server that never
comes up is reported once that wait is over, naming the server and the flag to raise. (Values
below 1: `test_learner_real_flags.py`.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, free_port, redis_server

from ludic.pipeline.commands import run_learner
from ludic.pipeline.config import LearnerConfig

__all__ = ["redis_server"]


def test_the_flag_defaults_to_five_minutes() -> None:
    assert LearnerConfig().server_wait_s == 300.0


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_a_server_that_never_comes_up_is_reported_after_the_wait(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # a free port: nothing listens there
    cfg = LearnerConfig(
        redis_url=redis_server.url,
        server_url=(url,),
        token="secret",
        server_wait_s=1.0,
        steps=1,
        out_dir=tmp_path / "run",
    )
    with pytest.raises(ValueError) as refused:
        run_learner(cfg)
    message = str(refused.value)
    assert message.startswith(f"nothing listens at {url} after 1s ("), message
    assert message.endswith(
        "or check --server-url, or raise --server-wait-s for a server that takes longer to start"
    ), message
