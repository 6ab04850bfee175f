"""What a learner rank takes back after a restart or a lost reply: its own pending entries (read
but not checkpointed), the entries of consumers that are not ranks of this run, and deliveries
whose reply a dropped connection lost. It also refuses a checkpoint whose other ranks left
samples unacknowledged. It does not read new entries, ack or train (`PipelineBatchSource` does).
"""

from __future__ import annotations

import logging

from ludic.pipeline.stream import SampleStream, StreamEntry
from ludic.types import JSON

logger = logging.getLogger(__name__)
_PAGE = 512


def rank_name(consumer: str, rank: int) -> str:
    """The consumer name rank `rank` of learner job `consumer` reads under."""
    return f"{consumer}-r{rank}"


def is_rank_name(consumer: str, name: str) -> bool:
    prefix = f"{consumer}-r"
    return name.startswith(prefix) and name[len(prefix) :].isdigit()


async def read_pending(stream: SampleStream, consumer_name: str) -> list[StreamEntry]:
    """Every entry delivered to `consumer_name` and not yet acked, oldest first."""
    after, pending = "0", []
    while page := await stream.read_pending(consumer_name, after=after, count=_PAGE):
        pending += page
        after = page[-1].entry_id
    return pending


async def check_world(
    stream: SampleStream, resume: JSON, *, consumer: str, rank: int, world_size: int
) -> None:
    """A checkpoint from another number of ranks lists only rank 0's entries: resuming is
    safe only if every other old rank acked what the checkpoint holds before it stopped."""
    saved = int(resume["world_size"])
    if saved == world_size:
        if int(resume["rank"]) != rank:
            raise ValueError(f"rank {rank} was handed rank {resume['rank']}'s state")
        return
    step = int(resume["batches_served"])
    acked = await stream.acked_steps()
    behind = [
        name
        for name in (rank_name(consumer, r) for r in range(1, saved))
        if acked.get(name, -1) < step
    ]
    if behind:
        raise RuntimeError(
            f"the checkpoint at step {step} was written by {saved} learner ranks and "
            f"{', '.join(behind)} had not acknowledged its samples when the run stopped; "
            f"with {world_size} ranks they would be trained twice. Resume once with "
            f"{saved} ranks (it acknowledges them at its first step), then change the number "
            "of ranks"
        )
    if rank == 0:  # every rank checks; one says so
        logger.info(
            "resuming a %d-rank checkpoint on %d rank%s", saved, world_size, "s" * (world_size != 1)
        )


async def claim_orphans(
    stream: SampleStream, *, consumer: str, world_size: int, claimant: str, min_idle_ms: int
) -> list[StreamEntry]:
    """Entries of consumers that are not ranks of this run, taken over by `claimant` (rank 0):
    a previous run's extra ranks (dead: claimed at once) and unknown names (claimed once idle
    `min_idle_ms`, unless a live learner holds that name's lease). Never a live sibling's."""
    siblings = {rank_name(consumer, r) for r in range(world_size)}
    claimed: list[StreamEntry] = []
    for owner in await stream.pending_consumers():
        if owner in siblings:
            continue
        ours = is_rank_name(consumer, owner)  # an earlier run's extra rank: dead,
        # as this run holds rank 0's lease (its lease may not have expired yet)
        holder = None if ours else await stream.lease_holder(owner)
        if holder is not None:  # a live learner of another job is training them
            logger.info("consumer %s is held by a live learner (%s): not taken", owner, holder)
            continue
        idle = 0 if ours else min_idle_ms
        taken = await stream.claim_from(owner, claimant, min_idle_ms=idle)
        if taken:
            logger.info("took over %d entries left by consumer %s", len(taken), owner)
        claimed += taken
    return claimed


def repeated_id(who: str, entry_id: str, sample_id: str) -> str:
    """Why a sample id read twice is dropped, and what to do when it is more than a retry."""
    actor = sample_id.split(":", 1)[0]
    return (
        f"entry {entry_id} repeats sample id {sample_id!r}, which {who} already read: it is "
        "dropped, as are later repeats (counted as pipeline/duplicates). One add retried without "
        "a key does that; so does an actor restarted after Redis lost its data (restarted "
        "without --appendonly yes: its batch counter starts again at 0), and then every batch "
        f"it pushes repeats ids already trained: restart actor {actor!r} with a new --actor-id"
    )


async def lost_deliveries(
    stream: SampleStream, consumer_name: str, held: set[str]
) -> list[StreamEntry]:
    """A read retried after a connection failure may have been served by redis with the reply
    lost: its entries now sit in this consumer's pending list and `>` never returns them again.
    Returns every pending entry whose id is not in `held` (what the source already holds)."""
    lost = [e for e in await read_pending(stream, consumer_name) if e.entry_id not in held]
    if lost:
        logger.warning(
            "consumer %s takes back %d entries whose delivery reply was lost",
            consumer_name,
            len(lost),
        )
    return lost
