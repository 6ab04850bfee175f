"""`ludic actor --server-wait-s`: how long the actor waits for its --server-url servers to
listen (it was a fixed 300 s; vLLM's CPU build took 211 s to start on a quiet machine). A value
below 1 is refused before any work, naming the flag; a server that never comes up is reported
once that wait is over, naming the server and the flag to raise."""

from __future__ import annotations

import pytest
import tyro
from pipeline_fakes import RedisServer, free_port, redis_server

from ludic.pipeline.commands import run_actor
from ludic.pipeline.config import ActorConfig

__all__ = ["redis_server"]
NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens: a check that ran late would fail there


def test_the_flag_defaults_to_five_minutes_and_parses() -> None:
    assert ActorConfig().server_wait_s == 300.0
    assert tyro.cli(ActorConfig, args=["--server-wait-s", "900"]).server_wait_s == 900.0


@pytest.mark.parametrize("seconds", [0.5, 0.0, -3.0, float("nan")])
def test_a_wait_below_one_second_is_refused_before_any_work(seconds: float) -> None:
    cfg = ActorConfig(
        redis_url=NO_REDIS, server_url=("http://127.0.0.1:1",), server_wait_s=seconds, batches=1
    )
    with pytest.raises(ValueError, match=r"^--server-wait-s is .*: pass seconds >= 1 \("):
        run_actor(cfg)


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_a_server_that_never_comes_up_is_reported_after_the_wait(
    redis_server: RedisServer,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # a free port: nothing listens there
    cfg = ActorConfig(
        redis_url=redis_server.url, server_url=(url,), server_wait_s=1.0, batches=1, stream="s"
    )
    with pytest.raises(ValueError) as refused:
        run_actor(cfg)
    message = str(refused.value)
    assert message.startswith(f"nothing listens at {url} after 1s ("), message
    assert message.endswith(
        "or check --server-url, or raise --server-wait-s for a server that takes longer to start"
    ), message
    assert redis_server.client().xlen("s") == 0  # no episode ran


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_a_host_name_that_does_not_resolve_names_only_the_url(redis_server: RedisServer) -> None:
    """Waiting longer cannot mend a host name that does not resolve: the refusal comes at once
    and names --server-url alone, not --server-wait-s."""
    cfg = ActorConfig(
        redis_url=redis_server.url,
        server_url=("http://no-such-host.invalid:8000",),
        server_wait_s=600.0,
        batches=1,
        stream="s",
    )
    with pytest.raises(ValueError, match="its host name does not resolve") as refused:
        run_actor(cfg)
    assert str(refused.value).endswith("check --server-url"), refused.value
