"""Policy version numbers that never repeat across a learner's restarts.

A learner resumed from a checkpoint at version `r` continues from `r`, but the learner it
replaces may have published `r+1 .. M` before it died: weights that are gone, whose samples
still wait in the stream (and the servers may still serve them). Counting from `r` again would
give the resumed run's own `r+1` the number of a dead weight, so `max_lag` would read the dead
branch's samples as fresh. So the learner records, before each push, the highest version it ever
published (`RecordingPublisher`, under `<stream>:published-version`), and a resumed learner that
finds it above `r` forks: its versions continue from `M + 1` (labelling the same weights as `r`),
and `Forks` drops, counted and said once, every sample of a version in the gap `r+1 .. M`, while
the lag of the others counts only the updates on this learner's own branch. It never changes
a sample's logprobs (the behaviour policy's, as generated).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

logger = logging.getLogger("ludic.pipeline.source")  # the source's lines, under its name

# KEYS: the highest published version. ARGV: a version about to be published.
_RAISE = """
local old = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) > old then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 0
"""


def dead_span(resumed: int, new: int) -> str:
    """The versions a fork `(resumed, new)` leaves dead: 'version 3' or 'versions 3..5'."""
    first, last = resumed + 1, new - 1
    return f"version {first}" if first == last else f"versions {first}..{last}"


def dead_branch_note(count: int) -> str:
    """What a learner's waiting or closing line adds when `count` samples it read were of a
    dead learner's versions (dropped: their weights died with it)."""
    if not count:
        return ""
    return (
        f"; {count} read were of versions a killed learner published past this one's start "
        "(dropped: their weights died with it; the actors sample the new weights once the "
        "servers took them)"
    )


def published_key(stream: str) -> str:
    """Where the highest policy version a learner of `stream` published is kept."""
    return f"{stream}:published-version"


class RecordingPublisher:
    """A `PolicyPublisher` that records in Redis, before each push, the highest version pushed
    (so no server ever holds a version above the record), then pushes with `publisher`. A Redis
    outage is waited out (retried with backoff, as the stream's commands are, for up to
    `give_up_after_s`): a Redis restarted mid-run must not stop the learner at its publish."""

    def __init__(
        self, publisher: Any, *, url: str, stream: str, give_up_after_s: float = 600.0
    ) -> None:
        self.publisher = publisher
        self.key = published_key(stream)
        self.give_up_after_s = give_up_after_s
        self.redis = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=5.0)
        self._raise = self.redis.register_script(_RAISE)

    def publish(self, weights: Any, *, version: int) -> None:
        what = f"recording published policy version {version}"
        _retried(what, lambda: self._raise(keys=[self.key], args=[version]), self.give_up_after_s)
        self.publisher.publish(weights, version=version)

    def close(self) -> None:
        self.redis.close()
        close = getattr(self.publisher, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str) -> Any:  # the wrapped publisher's other attributes
        return getattr(self.publisher, name)


def highest_published(url: str, stream: str, *, give_up_after_s: float = 600.0) -> int | None:
    """The highest version a learner of `stream` recorded publishing, or None."""
    client = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=5.0)
    try:
        what = "reading the highest published policy version"
        raw = _retried(what, lambda: client.get(published_key(stream)), give_up_after_s)
    finally:
        client.close()
    return None if raw is None else int(raw)


def _retried(what: str, command: Any, give_up_after_s: float) -> Any:
    """`command()`, retrying connection failures with backoff for up to `give_up_after_s`."""
    failures, started = 0, time.monotonic()
    while True:
        try:
            return command()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            failures += 1
            if time.monotonic() - started > give_up_after_s:
                raise
            delay = min(2.0, 0.05 * 2**failures)
            logger.warning("redis: %s failed (%s); retry %d in %.2fs", what, e, failures, delay)
            time.sleep(delay)


class Forks:
    """The forks of this learner's version line: each `(resumed, new)` says that this learner
    resumed the weights of version `resumed` and labelled them `new`, so versions strictly
    between them belong to a dead learner's branch. Kept in the source's checkpoints."""

    def __init__(self) -> None:
        self.forks: list[tuple[int, int]] = []
        self._warned = False

    def add(self, resumed: int, new: int) -> None:
        self.forks.append((resumed, new))

    def dead(self, version: int) -> tuple[int, int] | None:
        """The fork whose gap holds `version` (a dead branch's), else None."""
        for resumed, new in self.forks:
            if resumed < version < new:
                return resumed, new
        return None

    def position(self, version: int) -> int:
        """`version` counted in updates along this learner's branch (gaps left out)."""
        return version - sum(new - resumed for resumed, new in self.forks if version >= new)

    def warn_dead(self, version: int, fork: tuple[int, int]) -> None:
        """Say once why samples of a dead branch are dropped."""
        if self._warned:
            return
        self._warned = True
        resumed, new = fork
        logger.warning(
            "a sample carries policy version %d, published by a learner that died after this "
            "one's checkpoint (this learner resumed the weights of version %d and numbers them "
            "%d, past every version published before): the weights that sampled it are gone, "
            "so it and every sample of %s are dropped, counted as pipeline/dead_branch",
            version,
            resumed,
            new,
            dead_span(resumed, new),
        )

    def state_dict(self) -> list[list[int]]:
        return [list(fork) for fork in self.forks]

    def load_state_dict(self, state: list[list[int]] | None) -> None:
        self.forks = [(int(a), int(b)) for a, b in state or []]
