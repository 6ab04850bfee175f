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

The record also names the run its learner trained (`PublishedRecord`), so a stream name reused by
a new run does not make that run's versions jump past the old run's: a learner that knows its run
from the start (`--run-id`, or its checkpoint's) and finds another run's record numbers its own
versions and replaces the record at its first publish (a resumed one: its publish at resume),
which says so naming both runs (`RecordingPublisher`). A learner that does not know
its run yet (a fresh one without `--run-id`: it takes the run of the first sample it reads)
forks past any record, as it must when that record is its own run's killed learner's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

logger = logging.getLogger("ludic.pipeline.source")  # the source's lines, under its name

# KEYS: the record. ARGV: a version about to be published, the publisher's run ('' unknown).
# Raise the version (the run with it); another run's record (both runs known) is replaced, and
# returned ({version, run}) for the publisher to say so; else {}.
_RAISE = """
local raw = redis.call('GET', KEYS[1])
local old, run = -1, ''
if raw then
  local ok, record = pcall(cjson.decode, raw)
  if ok and type(record) == 'table' then
    old = tonumber(record['version']) or -1
    if type(record['run']) == 'string' then run = record['run'] end
  else
    old = tonumber(raw) or -1
  end
end
local other = ARGV[2] ~= '' and run ~= '' and ARGV[2] ~= run
if other or tonumber(ARGV[1]) > old then
  redis.call('SET', KEYS[1], cjson.encode({version = tonumber(ARGV[1]), run = ARGV[2]}))
end
if other then return {old, run} end
return {}
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


@dataclass(frozen=True)
class PublishedRecord:
    """`<stream>:published-version`: the highest policy version a learner of the stream
    published, and the run that learner trained (None: not known when it published)."""

    version: int
    run: str | None

    @classmethod
    def parse(cls, raw: bytes | str) -> PublishedRecord:
        """The record as stored: JSON, or a bare version (written before records named runs)."""
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return cls(int(value["version"]), str(value.get("run") or "") or None)
        return cls(int(raw), None)


class RecordingPublisher:
    """Wrap your `PolicyPublisher` in this in a learner loop of your own that publishes to the
    servers of a pipeline stream's actors (`ludic learner` does): before each push it records in
    Redis the highest version pushed, with the run `run()` names (so no server ever holds a
    version above the record), then pushes with `publisher`. A record of another run than
    `run()` (a stream name reused by a new run) is replaced, with a warning naming both runs:
    said where it happens, so a resumed learner, whose publish at resume comes before
    `fork_versions`, says it as a fresh one does. `fork_versions` reads the record
    when a learner starts, so a learner started after a killed one never reuses a version that
    named the killed one's weights. A Redis outage is waited out (retried with backoff, as the
    stream's commands are, for up to `give_up_after_s`): a Redis restarted mid-run must not stop
    the learner at its publish."""

    def __init__(
        self,
        publisher: Any,
        *,
        url: str,
        stream: str,
        run: Callable[[], str | None] = lambda: None,
        give_up_after_s: float = 600.0,
    ) -> None:
        self.publisher = publisher
        self.stream = stream
        self.key = published_key(stream)
        self.run = run
        self.give_up_after_s = give_up_after_s
        self.redis = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=5.0)
        self._raise = self.redis.register_script(_RAISE)

    def publish(self, weights: Any, *, version: int) -> None:
        what = f"recording published policy version {version}"
        run = self.run()
        args: list[int | str] = [version, run or ""]
        replaced = _retried(
            what, lambda: self._raise(keys=[self.key], args=args), self.give_up_after_s
        )
        if replaced and run is not None:
            old = PublishedRecord(int(replaced[0]), _text(replaced[1]))
            logger.warning(other_run_line(self.stream, old, run, version))
        self.publisher.publish(weights, version=version)

    def close(self) -> None:
        self.redis.close()
        close = getattr(self.publisher, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str) -> Any:  # the wrapped publisher's other attributes
        return getattr(self.publisher, name)


def other_run_line(stream: str, record: PublishedRecord, run: str, version: int) -> str:
    """The warning of a learner of `run` whose publish of `version` replaces `record`, another
    run's."""
    return (
        f"stream {stream!r} records policy versions up to {record.version} published by a "
        f"learner of run {record.run}, not this learner's run {run}: a stream name reused by "
        f"a new run, so this learner numbers its versions as its own (version {version} "
        "published now, not past that run's) and replaces that record. A server still serving "
        "that run's weights tags samples with its versions, which read as newer than this "
        "learner (warned once): restart the servers for a new run"
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def published_record(
    url: str, stream: str, *, give_up_after_s: float = 600.0
) -> PublishedRecord | None:
    """The highest version a learner of `stream` recorded publishing and its run, or None."""
    client = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=5.0)
    try:
        what = "reading the highest published policy version"
        raw = _retried(what, lambda: client.get(published_key(stream)), give_up_after_s)
    finally:
        client.close()
    return None if raw is None else PublishedRecord.parse(raw)


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
            "a sample carries policy version %d, published by a learner killed before this one "
            "started, past the version %d this one starts from (its checkpoint's; 0: a fresh "
            "learner) and numbers %d on, past every version published before: the weights that "
            "sampled it are gone, so it and every sample of %s are dropped, counted as "
            "pipeline/dead_branch",
            version,
            resumed,
            new,
            dead_span(resumed, new),
        )

    def state_dict(self) -> list[list[int]]:
        return [list(fork) for fork in self.forks]

    def load_state_dict(self, state: list[list[int]] | None) -> None:
        self.forks = [(int(a), int(b)) for a, b in state or []]
