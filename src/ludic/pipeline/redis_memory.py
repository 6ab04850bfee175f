"""What the pipeline says about Redis's memory limit: a Redis past its `maxmemory` refuses
writes (each actor's push, the learner's ledger and dead letters), and one that evicts keys
when full (a `maxmemory-policy` other than noeviction) can drop the sample stream, its consumer
group, leases or dedupe keys without a word. It does not change Redis's settings.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import OutOfMemoryError, ResponseError

from ludic.errors import Refusal

logger = logging.getLogger(__name__)


class RedisFullError(Refusal, RuntimeError):
    """Redis refused a write: its used memory is past its `maxmemory`."""


def is_out_of_memory(error: ResponseError) -> bool:
    """A write Redis refused for its memory limit (inside a script too, where it keeps the
    reply's OOM prefix)."""
    return isinstance(error, OutOfMemoryError) or str(error).startswith("OOM ")


def full_error(shown_url: str, what: str, error: Exception) -> RedisFullError:
    return RedisFullError(
        f"redis at {shown_url} is full: it refused {what} because its used memory is past its "
        f"maxmemory ({error}). Raise the limit (`redis-cli -u {shown_url} CONFIG SET maxmemory "
        "4gb`, and in redis.conf), or lower the actors' --max-backlog so the undelivered "
        "samples fit; a learner reading the stream frees what it acknowledges"
    )


def warn_if_evicting(client: Any, shown_url: str) -> None:
    """Warn when Redis has a memory limit and evicts keys to stay under it (CONFIG GET; a Redis
    that refuses CONFIG, as managed ones may, is not checked)."""
    try:
        config = client.config_get("maxmemory*")
    except ResponseError:
        return
    limit, policy = int(config.get("maxmemory", 0) or 0), config.get("maxmemory-policy")
    if isinstance(policy, bytes):
        policy = policy.decode()
    if limit == 0 or policy in (None, "noeviction"):
        return
    logger.warning(
        "redis at %s evicts keys once its memory reaches maxmemory (%d bytes) "
        "(maxmemory-policy %s): it can drop the sample stream, its consumer group, a learner's "
        "lease or a sample's dedupe key without a word, losing samples. Set "
        "`redis-cli -u %s CONFIG SET maxmemory-policy noeviction`: a full Redis then refuses "
        "pushes, and the actor stops saying so",
        shown_url,
        limit,
        policy,
        shown_url,
    )
