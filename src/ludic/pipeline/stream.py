"""`SampleStream`: the Redis Stream between actors and the learner (`redis.asyncio` only).

Actors XADD entries, each under a unique key (the sample id) that a Lua script claims in the
same step (`SET NX` with a TTL), so an XADD retried after a lost reply (Redis applied it, then
died before answering) adds nothing the second time. The learner reads them through a
consumer group and, once the optimizer step that used them is done, commits them: one Lua
script acks each entry, deletes it and (optionally) records the acked sample ids in a ledger
stream, atomically, so a commit that is retried after a lost reply changes nothing; it also
records, per consumer, the step up to which that consumer has acked everything it trained.
Deleting committed entries keeps `XLEN` equal to undelivered + in-flight entries, which is what actors throttle on (`backlog`). `max_len` is a
safety cap passed as `XADD MAXLEN ~`: with backpressure working it never trims; if the learner is
gone and actors ignore the backlog, the oldest entries are trimmed rather than Redis running out
of memory. Crashed consumers' entries are claimed per named consumer (never XAUTOCLAIM, which
would also take a live sibling's). Actors reserve batch indices from a counter per actor id.
Every command retries connection failures with jittered exponential backoff, and a
group lost with Redis's data is recreated; until a first command has reached Redis, though,
the stream gives up after `first_connect_s` (a few seconds) with an error naming the URL and
the fix, since nothing listening there at startup is a wrong URL or a Redis not started, not
an outage to wait out. Entries the learner will not train are copied to `<stream>:dead` once
per entry id (a replay after a restart adds no second copy; `stream_dead`). The URL's checks
and refusals are `stream_url`'s. It does not decode payloads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ludic.errors import LudicUsageError
from ludic.pipeline.lease import describe_holder, learner_run_key, lease_key

try:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
    from redis.exceptions import AuthenticationError, BusyLoadingError, ResponseError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as e:  # an optional extra
    raise ImportError("the Redis pipeline needs redis-py: pip install 'ludic[redis]'") from e

from ludic.pipeline import stream_dead, stream_push
from ludic.pipeline.redis_memory import full_error, is_out_of_memory
from ludic.pipeline.stream_url import (
    FIRST_CONNECT_S,
    NO_DATABASE,
    RedisUnavailableError,
    check_url,
    no_database,
    not_reached,
    shown_url,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

# KEYS: stream, ledger, acked-steps hash, dead-lettered ids hash. ARGV: group, step, record
# (1/0), consumer ('' for none), then entry id / sample id pairs. The acked-steps hash keeps,
# per consumer, the highest step up to which it has acked everything it trained (a world-size
# change on resume checks it); an acked entry is never read again, so its dead-letter mark goes.
# All or nothing: Redis stops a script only at an error, keeping the writes before it, so every
# key is type-checked before the first write; and past maxmemory Redis refuses only a script's
# first write (XACK, which never is refused), never one after it, so a full Redis cannot part
# the acks from their ledger record either.
_COMMIT = """
local function foreign(key, kind)
  local held = redis.call('TYPE', key)['ok']
  return held ~= 'none' and held ~= kind
end
if foreign(KEYS[1], 'stream') or (ARGV[3] == '1' and foreign(KEYS[2], 'stream'))
   or foreign(KEYS[3], 'hash') or foreign(KEYS[4], 'hash') then
  return redis.error_reply('WRONGTYPE a key of the commit holds another type: nothing acked')
end
local acked = {}
for i = 5, #ARGV, 2 do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[4], ARGV[i])
    table.insert(acked, ARGV[i + 1])
  end
end
if ARGV[3] == '1' and #acked > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', '1000000', '*',
             'step', ARGV[2], 'consumer', ARGV[4], 'ids', cjson.encode(acked))
end
if ARGV[4] ~= '' then
  local old = tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '-1')
  if tonumber(ARGV[2]) > old then
    redis.call('HSET', KEYS[3], ARGV[4], ARGV[2])
  end
end
return #acked
"""


# KEYS: stream, dedupe key. ARGV: max_len, dedupe ttl (s), then field / value pairs.
_ADD_ONCE = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[2]) then
  return false
end
local fields = {}
for i = 3, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamEntry:
    """One entry as read; `fields` is None when it was trimmed away before being read."""

    entry_id: str
    fields: dict[bytes, bytes] | None


class SampleStream:
    """One Redis stream (`stream`) and its consumer group (`group`) at `url`.

    - `ledger`: a stream key recording each commit's sample ids (audits; None: no record).
    - `dedupe_ttl_s`: how long a keyed `add` remembers its key (must outlast the longest
      retry, `give_up_after_s`).
    - `retry_base_s`, `retry_cap_s`: backoff between reconnection attempts;
      `give_up_after_s`: raise RedisUnavailableError after failing this long (None: never).
    - `first_connect_s`: before any command has reached Redis, raise RedisUnavailableError
      (naming the URL, and redis-server or the URL as the fix) after failing this long.
    """

    def __init__(
        self,
        url: str,
        *,
        stream: str = "ludic:samples",
        group: str = "ludic-learners",
        max_len: int = 100_000,
        ledger: str | None = None,
        retry_base_s: float = 0.05,
        retry_cap_s: float = 2.0,
        give_up_after_s: float | None = 600.0,
        first_connect_s: float = FIRST_CONNECT_S,
        socket_timeout_s: float = 30.0,
        dedupe_ttl_s: int = 3600,
    ) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if give_up_after_s is not None and dedupe_ttl_s <= give_up_after_s:
            raise ValueError(
                f"dedupe_ttl_s ({dedupe_ttl_s}) must exceed give_up_after_s ({give_up_after_s}): "
                "a retried add must still find its key"
            )
        self.dedupe_ttl_s = dedupe_ttl_s
        self.url, self.stream, self.group = url, stream, group
        self.max_len = max_len
        self.ledger = ledger
        self.give_up_after_s = give_up_after_s
        self.first_connect_s = first_connect_s
        self.reached = False  # whether a command has reached Redis yet
        self.socket_timeout_s = socket_timeout_s
        check_url(url)  # http://..., a typo: redis-py's ValueError names no flag
        self.redis = aioredis.from_url(
            url,
            decode_responses=False,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=5.0,
            retry=Retry(NoBackoff(), 0),  # retries happen in `_call`, with backoff and logging
        )
        self._backoff = ExponentialWithJitterBackoff(cap=retry_cap_s, base=retry_base_s)
        self._commit_script = self.redis.register_script(_COMMIT)
        self._add_once_script = self.redis.register_script(_ADD_ONCE)
        self._dead_letter_script = self.redis.register_script(stream_dead.DEAD_LETTER_SCRIPT)
        self.reconnect_attempts = 0

    async def ensure_group(self) -> None:
        """Create the stream and group if missing (reading from the stream's start)."""
        await self._call("XGROUP CREATE", self._create_group)

    async def _create_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def add(self, fields: dict[bytes, bytes], *, key: str | None = None) -> str | None:
        """XADD one entry, retried on connection failures; returns its id.

        With `key` (e.g. the sample id) the add happens at most once per key within
        `dedupe_ttl_s`: a retry whose first attempt did reach Redis, or a second add of the same
        key, adds nothing and returns None. Without `key` a retry may add the entry twice.
        """
        if key is None:
            entry_id = await self._call(
                "XADD",
                lambda: self.redis.xadd(self.stream, fields, maxlen=self.max_len, approximate=True),  # type: ignore[arg-type]
            )
            return _text(entry_id)
        args: list[bytes | int] = [self.max_len, self.dedupe_ttl_s]
        for name, value in fields.items():
            args += [name, value]
        keys = [self.stream, f"{self.stream}:added:{key}"]
        entry_id = await self._call(
            "XADD once",
            lambda: self._add_once_script(keys=keys, args=args),  # type: ignore[arg-type]
        )
        return None if entry_id is None else _text(entry_id)

    async def backlog(self) -> int:
        """Entries not yet delivered to the learner (stream length minus in-flight entries)."""

        async def query() -> int:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xlen(self.stream)
                pipe.xpending(self.stream, self.group)
                length, pending = await pipe.execute()
            return int(length) - int(pending["pending"])

        return await self._call("XLEN/XPENDING", query)

    async def read(
        self, consumer: str, *, count: int, block_ms: int | None = None
    ) -> list[StreamEntry]:
        """Up to `count` new entries for `consumer`, waiting up to `block_ms` for the first."""
        if block_ms is not None and block_ms >= self.socket_timeout_s * 1000:
            raise ValueError(f"block_ms={block_ms} must be below the socket timeout")
        return await self._read_group(consumer, ">", count=count, block_ms=block_ms)

    async def read_pending(
        self, consumer: str, *, after: str = "0", count: int
    ) -> list[StreamEntry]:
        """Entries delivered to `consumer` earlier and not committed, with ids after `after`
        (what a restarted learner must finish first)."""
        return await self._read_group(consumer, after, count=count, block_ms=None)

    async def _read_group(
        self, consumer: str, start: str, *, count: int, block_ms: int | None
    ) -> list[StreamEntry]:
        reply: Any = await self._call(
            "XREADGROUP",
            lambda: self.redis.xreadgroup(
                self.group,
                consumer,
                {self.stream: start},
                count=count,
                block=block_ms,
            ),
        )
        return [_entry(e) for _, entries in (reply or []) for e in entries]

    async def newest(self, count: int) -> list[StreamEntry]:
        """The stream's newest `count` entries, newest first (XREVRANGE; nothing is delivered)."""
        reply: Any = await self._call(
            "XREVRANGE", lambda: self.redis.xrevrange(self.stream, count=count)
        )
        return [_entry(e) for e in reply or []]

    async def length(self) -> int:
        """Entries in the stream: undelivered ones and those read but not yet acked."""
        return int(await self._call("XLEN", lambda: self.redis.xlen(self.stream)))

    async def pending_consumers(self) -> dict[str, int]:
        """Consumers of the group that hold uncommitted entries, with how many each holds."""
        summary: Any = await self._call(
            "XPENDING", lambda: self.redis.xpending(self.stream, self.group)
        )
        return {_text(c["name"]): int(c["pending"]) for c in summary.get("consumers") or []}

    async def claim_from(
        self, owner: str, consumer: str, *, min_idle_ms: int, count: int = 512
    ) -> list[StreamEntry]:
        """Move to `consumer` the entries `owner` left uncommitted for at least `min_idle_ms`
        (XPENDING for that owner alone, then XCLAIM, which skips any entry that another
        claimer took in between). Unlike XAUTOCLAIM it never touches other consumers' entries.
        Entries deleted from the stream meanwhile are dropped from the pending list by Redis."""
        claimed: list[StreamEntry] = []
        start = "-"
        while True:
            rows: Any = await self._call(
                "XPENDING",
                lambda s=start: self.redis.xpending_range(  # type: ignore[misc]
                    self.stream, self.group, s, "+", count, consumername=owner, idle=min_idle_ms
                ),
            )
            if not rows:
                return claimed
            ids = [_text(r["message_id"]) for r in rows]
            reply: Any = await self._call(
                "XCLAIM",
                lambda ids=ids: self.redis.xclaim(  # type: ignore[misc]
                    self.stream, self.group, consumer, min_idle_ms, ids
                ),
            )
            claimed.extend(_entry(e) for e in reply or [] if e is not None)
            start = "(" + ids[-1]

    async def commit(
        self, entries: Sequence[tuple[str, str]], *, step: int, consumer: str | None = None
    ) -> int:
        """Ack and delete `(entry_id, sample_id)` pairs (and record them in the ledger);
        returns how many were still pending (already-acked ones are skipped). With `consumer`,
        also record that it has acked everything it trained up to `step` (see `acked_steps`),
        even when `entries` is empty."""
        if not entries and consumer is None:
            return 0
        ledger = self.ledger or f"{self.stream}:ledger"
        args: list[str | int] = [self.group, step, "1" if self.ledger else "0", consumer or ""]
        for entry_id, sample_id in entries:
            args += [entry_id, sample_id]
        keys = [self.stream, ledger, self._acked_key, self._dead_ids_key]
        acked = await self._call(
            "commit",
            lambda: self._commit_script(keys=keys, args=args),  # type: ignore[arg-type]
        )
        return int(acked)

    async def acked_steps(self) -> dict[str, int]:
        """Per consumer, the highest step up to which it acked everything it trained."""
        raw: Any = await self._call("HGETALL", lambda: self.redis.hgetall(self._acked_key))
        return {_text(k): int(v) for k, v in raw.items()}

    async def next_actor_batch(self, actor_id: str, *, after: int = -1) -> int:
        """Reserve the next batch index of actor `actor_id` (0, 1, 2, ... across restarts and
        across processes sharing the id): its seeds and sample ids are never used twice. A
        counter Redis lost (restarted without its data) that falls to `after` (the caller's
        last index) or below is raised past it, with a warning."""
        return await stream_push.reserve_batch(self, actor_id, after=after)

    async def lease_holder(self, consumer: str) -> str | None:
        """Who holds the live learner lease on `consumer` (`ConsumerLease`), or None."""
        raw = await self._call(
            "GET lease", lambda: self.redis.get(lease_key(self.stream, self.group, consumer))
        )
        return None if raw is None else describe_holder(raw)

    async def learner_run(self) -> tuple[str, str] | None:
        """The run the live learner of this stream trains and who it is (`host H pid P`), as
        its lease publishes them (`ConsumerLease.publish_run`); None when no live learner has
        published one."""
        raw = await self._call(
            "GET learner run", lambda: self.redis.get(learner_run_key(self.stream))
        )
        if raw is None:
            return None
        try:
            run = str(json.loads(raw)["run"])
        except (ValueError, KeyError, TypeError):
            return None  # not ours to read: another program's key
        return run, describe_holder(raw)

    @property
    def _acked_key(self) -> str:
        return f"{self.stream}:acked:{self.group}"

    @property
    def _dead_ids_key(self) -> str:
        return stream_dead.dead_ids_key(self.stream)

    async def dead_letter(self, entry: StreamEntry, error: str) -> bool:
        """Keep a copy of an entry the learner will not train (undecodable, another run's) in
        `<stream>:dead` for inspection, once per entry id: an entry read again before it is
        acked (a learner restarted from a checkpoint taken before it) is not copied twice, nor
        is a retry whose first attempt reached Redis. Returns whether it was copied now. The
        mark goes when the entry is committed."""
        return await stream_dead.dead_letter(self, entry, error)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def _call(self, what: str, command: Callable[[], Awaitable[T]]) -> T:
        """Run `command`, retrying connection failures with backoff; recreate a lost group."""
        failures, started = 0, time.monotonic()
        need_group = recreated = False
        while True:
            try:
                if need_group:
                    await self._create_group()
                    need_group = False
                result = await command()
                self.reached = True
                return result
            except ResponseError as e:
                self.reached = True
                if is_out_of_memory(e):  # past maxmemory: waiting frees nothing by itself
                    raise full_error(shown_url(self.url), what, e) from e
                if NO_DATABASE in str(e):  # /99 where Redis holds 16 databases
                    raise LudicUsageError(no_database(self.url, e)) from e
                if "WRONGTYPE" in str(e):  # another program's data under one of our keys
                    raise LudicUsageError(await stream_dead.wrong_type(self, what)) from e
                if "NOGROUP" not in str(e) or recreated:
                    raise
                logger.warning("redis lost group %r (data lost?): recreating it", self.group)
                need_group = recreated = True
            except (RedisConnectionError, RedisTimeoutError, OSError) as e:
                if isinstance(e, AuthenticationError) and not self.reached:  # no wait helps
                    raise RedisUnavailableError(self._not_reached(what, e)) from e
                failures += 1
                self.reconnect_attempts += 1
                if isinstance(e, BusyLoadingError):  # Redis answers, still loading its data
                    self.reached = True
                waited = time.monotonic() - started
                if not self.reached and waited > self.first_connect_s:
                    raise RedisUnavailableError(self._not_reached(what, e)) from e
                if self.give_up_after_s is not None and waited > self.give_up_after_s:
                    raise RedisUnavailableError(
                        f"redis at {shown_url(self.url)} unreachable for {waited:.0f}s ({what}: {e})"
                    ) from e
                delay = self._backoff.compute(failures)
                logger.warning("redis %s failed (%s); retry %d in %.2fs", what, e, failures, delay)
                await asyncio.sleep(delay)

    def _not_reached(self, what: str, error: Exception) -> str:
        return not_reached(self.url, what, self.first_connect_s, error)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(raw: Any) -> StreamEntry:
    entry_id, fields = raw
    return StreamEntry(entry_id=_text(entry_id), fields=dict(fields) if fields else None)
