"""The actor's checks, before its first batch, that its stream's learner trains its run: a live
learner publishes the run it trains (`refuse_live_learner_run`, also once the stream is drained,
and again before each batch is pushed: a learner started after the actor),
and a stream still holding another run's samples (a backlog no learner acknowledged) would have
a new learner take that run, from the first sample it reads (`refuse_another_run`); either
learner would dead-letter this actor's samples.

It reads the newest entries (XREVRANGE: nothing is delivered or acked): any of them stamped
with this actor's run lets it start (its run is on the stream; a stray sample of another run
is the learner's to dead-letter), else the newest one stamped with another run refuses it.
Entries without a run id (older actors) or undecodable ones say nothing.
It never changes the stream.
"""

from __future__ import annotations

import shlex

from ludic.errors import LudicUsageError
from ludic.pipeline.codec import PayloadError, decode_sample
from ludic.pipeline.run_check import RUN_KEY
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.stream_url import shown_url

NEWEST = 32
"""How many of the stream's newest entries are read for a run id."""


async def refuse_live_learner_run(
    stream: SampleStream, *, run_id: str, actor_id: str, batch: int | None = None
) -> None:
    """Raise LudicUsageError, naming both runs, the learner and the fixes, when a live learner
    of `stream` publishes that it trains another run than `run_id` (`SampleStream.learner_run`).
    `batch`: the generated batch the actor was about to push (a learner started since its
    first batch), which the message says it drops."""
    published = await stream.learner_run()
    if published is None or published[0] == run_id:
        return
    other, holder = published
    where = (
        f"stream {stream.stream!r} at {shown_url(stream.url)} is read by a live learner "
        f"({holder}) that trains run {other}"
    )
    if batch is not None:
        where = (
            f"actor {actor_id!r} stops without pushing its batch {batch}: since it started, "
            + where
        )
    raise LudicUsageError(
        f"{where}, but this actor ({actor_id!r}) is run {run_id}: "
        "that learner would dead-letter every sample this actor pushes. Its flags differ from "
        "that run's actors' (--env, --env-kwargs, --algorithm and its flags, --group-size, "
        "--max-tokens, --temperature, --top-p, the model, ...), or its --run-id does. To "
        f"continue run {other} with these flags on purpose, pass --run-id {other}; to start "
        "this run, give it its own stream (the same new --stream for its actors and a learner "
        f"of its own), or stop that learner first (then `ludic learner --run-id {run_id}` "
        "trains this run on this stream; a learner killed just now holds its claim until its "
        "lease expires, one --lease-ttl-s after its last renewal)"
    )


async def refuse_another_run(stream: SampleStream, *, run_id: str, actor_id: str) -> None:
    """Raise LudicUsageError, naming both runs, the stream and the fixes, when the newest
    `NEWEST` entries of `stream` hold stamped samples of other runs and none of `run_id`."""
    first: tuple[str, dict] | None = None  # the newest sample of another run
    for entry in await stream.newest(NEWEST):
        if entry.fields is None:
            continue
        try:
            meta = decode_sample(entry.fields).item.meta
        except PayloadError:  # a learner dead-letters it; it names no run
            continue
        stamped = meta.get(RUN_KEY)
        if stamped is None:
            continue
        if str(stamped) == run_id:
            return
        first = first or (entry.entry_id, meta)
    if first is not None:
        entry_id, meta = first
        other = meta[RUN_KEY]
        held = await stream.length()
        key = shlex.quote(stream.stream)  # a name with spaces is one argument
        raise LudicUsageError(
            f"stream {stream.stream!r} at {shown_url(stream.url)} holds {held} samples no "
            f"learner has acknowledged, the newest (entry {entry_id}, from actor "
            f"{str(meta.get('actor_id', '?'))!r}) of run {other}, but this actor "
            f"({actor_id!r}) is run {run_id}: its flags differ from that run's actors' (--env, "
            "--env-kwargs, --algorithm and its flags, --group-size, --max-tokens, "
            "--temperature, --top-p, the model, ...). A learner trains one run per stream and "
            f"dead-letters the other's samples, and a new one takes run {other}, whose samples "
            "it reads first. Start this run on its own stream (the same new --stream for its "
            f"actors and learner), or, if run {other} is over, stop its learner and delete its "
            f"samples first (`redis-cli -u {shown_url(stream.url)} DEL {key}`), or, "
            f"to continue run {other} with these flags on purpose, pass --run-id {other} (a new "
            "run on this stream: --run-id NEW to its actors and `ludic learner --run-id NEW`, "
            "which dead-letters the old samples)"
        )
