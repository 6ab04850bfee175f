"""A server restarted mid-run (`ludic serve` killed and started again) failed every batch of
`ludic actor` while it loaded its model: each batch's episodes failed within seconds once the
client's retries ran out, and the next batch started at once (two batches of 8 episodes lost in
25 s on the walk). After a batch whose every episode failed, the actor now waits for its
servers to listen, as it does at startup, up to --server-wait-s; otherwise it goes on at
once."""

from __future__ import annotations

import asyncio

from ludic.pipeline.actor import ActorBatchStats
from ludic.pipeline.commands import wait_after_failed_batch
from ludic.pipeline.config import ActorConfig

URLS = ("http://127.0.0.1:8000", "http://127.0.0.1:8001")


def stats(*, failed: int) -> ActorBatchStats:
    return ActorBatchStats(
        batch_index=0, num_rollouts=4, num_failed=failed, num_samples=6 * (4 - failed),
        mean_reward=0.0, policy_version_min=None if failed == 4 else 0,
        policy_version_max=None if failed == 4 else 0, backpressure_seconds=0.0,
        generate_seconds=1.0,
    )  # fmt: skip


def waited(cfg: ActorConfig, batch: ActorBatchStats) -> list[tuple[list[str], float]]:
    """Each wait the actor made: the servers, and for how long at most."""
    calls: list[tuple[list[str], float]] = []

    async def wait(urls: list[str], *, within_s: float, wait_setting: str) -> None:
        calls.append((list(urls), within_s))

    asyncio.run(wait_after_failed_batch(cfg, batch, wait=wait))
    return calls


def test_a_batch_whose_every_episode_failed_waits_for_every_server() -> None:
    assert waited(ActorConfig(server_url=URLS), stats(failed=4)) == [(list(URLS), 300.0)]


def test_it_waits_as_long_as_the_flag_says() -> None:
    cfg = ActorConfig(server_url=URLS, server_wait_s=900.0)
    assert waited(cfg, stats(failed=4)) == [(list(URLS), 900.0)]


def test_a_batch_with_a_sample_goes_on_at_once() -> None:
    assert waited(ActorConfig(server_url=URLS), stats(failed=3)) == []


def test_the_embedded_engine_has_no_server_to_wait_for() -> None:
    assert waited(ActorConfig(), stats(failed=4)) == []
