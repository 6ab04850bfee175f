"""An actor's side of a `SampleStream`: its batch pushed in one step, only while the backlog has
room, and the reservation of its batch indices.

One Lua script measures the backlog (XLEN minus the group's pending entries, as
`SampleStream.backlog`) and XADDs the whole batch only if it fits under `max_backlog`, or if the
stream holds no undelivered sample (a batch larger than the bound goes alone), so actors pushing
at once never take the backlog past the bound: each push is atomic in Redis. Each entry is added
once per key (its sample id, claimed with `SET NX` and a TTL, as `SampleStream.add` does), so a
push retried after a lost reply adds nothing twice. It does not wait: the actor does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ludic.pipeline.stream import SampleStream

logger = logging.getLogger(__name__)

# KEYS: an actor's batch counter. ARGV: the caller's last batch index. Returns {index, -1}, or
# {index, what INCR gave} when the counter had fallen to that index or below (Redis lost it).
RESERVE_SCRIPT = """
local index = redis.call('INCR', KEYS[1]) - 1
local after = tonumber(ARGV[1])
if index > after then
  return {index, -1}
end
redis.call('SET', KEYS[1], after + 2)
return {after + 1, index}
"""


# KEYS: stream, then one dedupe key per entry. ARGV: group, max_len, dedupe ttl (s), max_backlog,
# arguments per entry, then each entry's field / value pairs. Returns {added, backlog}, added
# -1 when the batch does not fit (nothing is added then).
PUSH_SCRIPT = """
local limit, per = tonumber(ARGV[4]), tonumber(ARGV[5])
local n = #KEYS - 1
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])[1]
local backlog = redis.call('XLEN', KEYS[1]) - pending
if backlog > 0 and backlog + n > limit then
  return {-1, backlog}
end
local added = 0
for i = 1, n do
  if redis.call('SET', KEYS[i + 1], '1', 'NX', 'EX', ARGV[3]) then
    local fields = {}
    local base = 5 + (i - 1) * per
    for j = 1, per do
      fields[j] = ARGV[base + j]
    end
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
    added = added + 1
  end
end
return {added, backlog}
"""


async def push_within(
    stream: SampleStream,
    entries: Sequence[tuple[str, dict[bytes, bytes]]],
    *,
    max_backlog: int,
) -> tuple[bool, int]:
    """XADD `(key, fields)` entries (every entry with the same field names) in one step if the
    stream's backlog has room for all of them (or holds none); returns whether they were
    pushed (keys already added count as pushed, adding nothing) and the backlog before."""
    if not entries:
        return True, await stream.backlog()
    per = 2 * len(entries[0][1])
    args: list[Any] = [stream.group, stream.max_len, stream.dedupe_ttl_s, max_backlog, per]
    for _, fields in entries:
        if 2 * len(fields) != per:
            raise ValueError("every entry of a pushed batch must have the same fields")
        for name, value in fields.items():
            args += [name, value]
    keys = [stream.stream] + [f"{stream.stream}:added:{key}" for key, _ in entries]
    script = stream.redis.register_script(PUSH_SCRIPT)
    reply: Any = await stream._call(
        "XADD batch",
        lambda: script(keys=keys, args=args),  # type: ignore[arg-type]
    )
    added, backlog = int(reply[0]), int(reply[1])
    return added >= 0, backlog


async def reserve_batch(stream: SampleStream, actor_id: str, *, after: int) -> int:
    """`SampleStream.next_actor_batch`: the next batch index of `actor_id`, past `after`."""
    script = stream.redis.register_script(RESERVE_SCRIPT)
    key = f"{stream.stream}:actor:{actor_id}:batches"
    reply: Any = await stream._call("INCR", lambda: script(keys=[key], args=[after]))
    index, was = int(reply[0]), int(reply[1])
    if was >= 0:
        logger.warning(
            "redis lost actor %r's batch counter (it gave batch %d after %d): Redis restarted "
            "without its data (start it with --appendonly yes); samples pushed and not yet "
            "trained are lost, and this actor continues at batch %d",
            actor_id,
            was,
            after,
            index,
        )
    return index
