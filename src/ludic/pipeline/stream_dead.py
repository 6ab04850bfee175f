"""Dead letters of a `SampleStream`: entries the learner will not train, copied to
`<stream>:dead` once per entry id, and the diagnosis of a stream key that another program holds
(Redis's WRONGTYPE names none). It does not decide which entries are dead: the learner's source
does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ludic.pipeline.stream_url import shown_url

if TYPE_CHECKING:
    from ludic.pipeline.stream import SampleStream, StreamEntry

# KEYS: dead-letter stream, dead-lettered ids hash. ARGV: the original entry id, then field /
# value pairs. Marked by entry id, so an entry replayed (a learner restarted before a checkpoint
# acked it) or a retried call after a lost reply is copied once.
DEAD_LETTER_SCRIPT = """
if redis.call('HSETNX', KEYS[2], ARGV[1], '1') == 0 then
  return false
end
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
return redis.call('XADD', KEYS[1], 'MAXLEN', '~', '10000', '*', unpack(fields))
"""


def dead_ids_key(stream: str) -> str:
    """The hash marking which entry ids of `stream` were dead-lettered (a commit clears one)."""
    return f"{stream}:dead:ids"


async def dead_letter(stream: SampleStream, entry: StreamEntry, error: str) -> bool:
    """`SampleStream.dead_letter`: copy `entry` with `error` to `<stream>:dead`, once per entry
    id; returns whether it was copied now."""
    fields: dict[bytes, bytes] = {
        b"entry_id": entry.entry_id.encode(),
        b"error": error.encode(),
    }
    fields.update(entry.fields or {})
    args = [entry.entry_id.encode()]
    for name, value in fields.items():
        args += [name, value]
    keys = [f"{stream.stream}:dead", dead_ids_key(stream.stream)]
    script = stream._dead_letter_script
    copied = await stream._call(
        "XADD dead",
        lambda: script(keys=keys, args=args),  # type: ignore[arg-type]
    )
    return copied is not None


async def wrong_type(stream: SampleStream, what: str) -> str:
    """Which of `stream`'s keys holds something else than a stream (Redis's WRONGTYPE names
    none), and the fix: a traceback before."""
    ledger = stream.ledger or f"{stream.stream}:ledger"
    keys = {stream.stream: "stream", f"{stream.stream}:dead": "stream", ledger: "stream"}
    keys[dead_ids_key(stream.stream)] = "hash"
    keys[f"{stream.stream}:acked:{stream.group}"] = "hash"  # the commit's acked steps
    foreign = []
    for key, ours in keys.items():
        try:
            kind = await stream.redis.type(key)
        except (ResponseError, RedisConnectionError, RedisTimeoutError, OSError):
            continue
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind not in (ours, "none"):
            foreign.append(f"key {key!r} holds a {kind}")
    held = "; ".join(foreign) or f"a key of stream {stream.stream!r} holds another kind of value"
    return (
        f"redis at {shown_url(stream.url)}: {what} failed: {held}, not a Ludic stream: another "
        "program uses that name. Pass another --stream, or delete the key if its data may go "
        "(redis-cli DEL KEY)"
    )
