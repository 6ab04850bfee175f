"""`ConsumerLease`: one live learner per consumer name of a group, enforced through Redis.

A lease is a key `<stream>:lease:<group>:<consumer>` taken with `SET NX PX ttl` and holding
who took it (host, pid, a random token). A daemon thread with its own synchronous Redis client
renews it every `ttl/3`, so it stays held while a training step blocks the event loop, and
stops once the lease is released, dropped unreleased (it then deletes it), or the main thread
is gone. A second learner finding it held waits up to one ttl (a killed holder's lease expires
by then) and otherwise refuses, naming the holder. A renewal that fails (Redis restarting) is
retried at the next tick; if the lease expired meanwhile it is taken again, and if someone else
took it, the lease is lost and `check()` raises. A lease may also publish the run its learner
trains (`publish_run`: `<stream>:learner-run`, renewed and released with the lease), which an
actor of another run reads to refuse (`stream_runs`). It does not read or ack samples.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any

import redis

from ludic.errors import Refusal

logger = logging.getLogger(__name__)

# KEYS: lease, published run. ARGV: token (a random hex string inside the value), ttl (ms),
# value, published run's value ('' for none). Renew our lease, or take it again if it expired
# (an outage longer than the ttl, or Redis lost it), and the run with it; 0 when another holder
# has it (the run is then left alone).
_RENEW = """
local value = redis.call('GET', KEYS[1])
local state = 0
if value == false then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  state = 2
elseif string.find(value, ARGV[1], 1, true) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  state = 1
end
if state > 0 and ARGV[4] ~= '' then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[2])
end
return state
"""

# KEYS: lease, published run. ARGV: token. Delete each only if it is still ours.
_RELEASE = """
local deleted = 0
for _, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  if value ~= false and string.find(value, ARGV[1], 1, true) then
    deleted = deleted + redis.call('DEL', key)
  end
end
return deleted
"""


class ConsumerInUseError(Refusal, RuntimeError):
    """Another live learner holds this consumer name of the group."""


class ConsumerLeaseLostError(Refusal, RuntimeError):
    """This learner's lease was taken by another process (while Redis was unreachable)."""


def lease_key(stream: str, group: str, consumer: str) -> str:
    return f"{stream}:lease:{group}:{consumer}"


def learner_run_key(stream: str) -> str:
    """The key where the live learner of `stream` publishes the run it trains."""
    return f"{stream}:learner-run"


def describe_holder(raw: bytes | str | None) -> str:
    """`host H pid P` from a lease value (or what it holds if unreadable)."""
    if raw is None:
        return "nobody"
    try:
        value = json.loads(raw)
        return f"host {value['host']} pid {value['pid']}"
    except (ValueError, KeyError, TypeError):
        return repr(raw)


class ConsumerLease:
    """The lease on consumer `consumer` of `group` on `stream` at `url`, renewed while held.

    - `ttl_s`: how long a lease outlives its holder's last renewal (a crashed learner's name
      is free after at most this; a restart waits that long at worst).
    - `wait_s`: how long `acquire` waits for a held lease to expire before refusing
      (default: one ttl, so a holder killed just before is waited out).
    """

    def __init__(
        self,
        url: str,
        *,
        stream: str,
        group: str,
        consumer: str,
        ttl_s: float = 15.0,
        wait_s: float | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"the lease ttl must be > 0 seconds, got {ttl_s}")
        self.url, self.stream, self.group, self.consumer = url, stream, group, consumer
        self.key = lease_key(stream, group, consumer)
        self.keys = [self.key, learner_run_key(stream)]
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.wait_s = ttl_s if wait_s is None else wait_s
        self.value = json.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex}
        )
        self.token = json.loads(self.value)["token"]
        self.run_value = ""  # what `publish_run` set ('': no run published)
        self.redis = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._renew = self.redis.register_script(_RENEW)
        self._release = self.redis.register_script(_RELEASE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost_to: str | None = None  # the holder that took the lease from us

    @property
    def held(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def acquire(self) -> None:
        """Take the lease (waiting up to `wait_s` for a previous holder's to expire) and start
        renewing it; raise ConsumerInUseError if another learner still holds it."""
        deadline = time.monotonic() + self.wait_s
        announced = False
        left_ms: int | None = None  # the held lease's time to live when last looked at
        while not self.redis.set(self.key, self.value, nx=True, px=self.ttl_ms):
            holder = describe_holder(self.redis.get(self.key))
            pttl = int(self.redis.pttl(self.key))
            if left_ms is not None and pttl > left_ms + 50:  # renewed: its holder is alive
                raise ConsumerInUseError(self._in_use(holder))
            if left_ms is None and pttl > 0:  # a holder with a longer ttl than ours: wait it out
                deadline = max(deadline, time.monotonic() + pttl / 1000 + 0.5)
            left_ms = pttl if pttl > 0 else left_ms
            if time.monotonic() >= deadline:
                raise ConsumerInUseError(self._in_use(holder))
            if not announced:
                logger.info(
                    "consumer %s of group %s is leased by %s: waiting up to %.0fs for the "
                    "previous holder's lease to expire (if that learner stopped without "
                    "releasing it; a live one renews it, and this learner is then refused)",
                    self.consumer,
                    self.group,
                    holder,
                    self.wait_s,
                )
                announced = True
            if self._stop.wait(min(0.2, max(0.0, deadline - time.monotonic())) or 0.01):
                return  # released meanwhile (the learner was interrupted while waiting)
        if self._stop.is_set():  # released as the lease was taken: give it back
            self._release(keys=self.keys, args=[self.token])
            return
        # the thread holds the lease only weakly: a dropped lease (its source never closed) is
        # freed, which stops the thread, instead of being renewed for the life of the process
        weakref.finalize(self, self._stop.set)
        self._thread = threading.Thread(
            target=_heartbeat,
            args=(
                weakref.ref(self),
                self._stop,
                self.ttl_ms / 3000,
                self.redis,
                self.keys,
                self.token,
            ),
            name=f"lease-{self.consumer}",
            daemon=True,
        )
        self._thread.start()

    def check(self) -> None:
        """Raise ConsumerLeaseLostError if another process took the lease from this one."""
        if self.lost_to is not None:
            raise ConsumerLeaseLostError(
                f"learner consumer {self.consumer!r} of group {self.group!r} on stream "
                f"{self.stream!r} is now leased by {self.lost_to} (this learner's lease expired "
                "while Redis was unreachable): two learners under one consumer name train the "
                "same samples. Stopping this one; keep one learner per --consumer name"
            )

    def confirm(self) -> None:
        """Renew the lease now, in one round trip, and raise ConsumerLeaseLostError if another
        process holds it: called right before an ack, so a learner whose lease was taken
        between two heartbeats never acks entries the new holder is replaying. A Redis error
        is left to the ack's own retries."""
        if self.lost_to is None:
            try:
                renewed = self._renew_script()
            except redis.RedisError:
                return
            if int(renewed) == 0:
                self._lost()
        self.check()

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still this process's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
            try:
                self._release(keys=self.keys, args=[self.token])
            except redis.RedisError as e:  # it expires after one ttl anyway
                logger.warning("could not release the lease on %s (%s)", self.consumer, e)
        self.redis.close()

    def _renew_once(self, failing: bool) -> bool:
        """One heartbeat: renew the lease (or learn it was lost); whether Redis failed."""
        try:
            renewed = self._renew_script()
        except redis.RedisError as e:
            if not failing:
                logger.warning("renewing the lease on %s failed (%s); retrying", self.consumer, e)
            return True
        if failing:
            logger.info("lease on consumer %s renewed after a Redis outage", self.consumer)
        if int(renewed) == 0:
            self._lost()
        return False

    def publish_run(self, run: str) -> None:
        """Publish, while the lease is held, that this learner trains `run` (with who holds the
        lease): written now, renewed with the lease, deleted on release, and gone one ttl after
        a killed learner's last renewal. A Redis error is left to the next renewal."""
        value = json.loads(self.value)
        self.run_value = json.dumps({"run": run, **value})
        with contextlib.suppress(redis.RedisError):
            if int(self._renew_script()) == 0:
                self._lost()

    def _renew_script(self) -> Any:
        return self._renew(
            keys=self.keys, args=[self.token, self.ttl_ms, self.value, self.run_value]
        )

    def _lost(self) -> None:
        try:
            self.lost_to = describe_holder(self.redis.get(self.key))
        except redis.RedisError:
            self.lost_to = "another learner"
        self._stop.set()
        logger.error(
            "the lease on consumer %s was taken by %s: this learner stops at its next batch",
            self.consumer,
            self.lost_to,
        )

    def _in_use(self, holder: str) -> str:
        return (
            f"learner consumer {self.consumer!r} of group {self.group!r} on stream "
            f"{self.stream!r} is held by a running learner ({holder}; its lease did not expire "
            f"in {self.wait_s:.0f}s): two learners under one consumer name would train the same "
            "samples: stop the other one first, or start this one on its own --stream with its "
            "own actors (under another --consumer name it would be refused too: two learner "
            "jobs on one stream each train only part of its samples)"
        )


def refuse_other_learners(url: str, *, stream: str, group: str, consumer: str) -> None:
    """Raise ConsumerInUseError when a learner of another job (a lease on `stream` that is not
    a rank of `consumer` in `group`) is alive: a group splits the stream's samples between its
    consumers, and a learner of another group deletes what it acknowledges from under this one,
    so each would train only part of the run. A lease nobody renews (a learner killed just
    before) is waited out."""
    client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    ours = lease_key(stream, group, f"{consumer}-r")
    prefix = f"{stream}:lease:"  # of every group's leases (`lease_key`), glob-escaped
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
    expires: dict[bytes, float] = {}  # when each lease expires unless renewed (monotonic s)
    announced = False
    try:
        while True:
            others = [
                key
                for key in client.scan_iter(match=pattern, count=1000)
                if not (key.decode().startswith(ours) and key.decode()[len(ours) :].isdigit())
            ]
            if not others:
                return
            for key in others:
                pttl, now = int(client.pttl(key)), time.monotonic()
                renewed = pttl / 1000 + now > expires.get(key, math.inf) + 0.05
                if pttl == -1 or renewed:  # no expiry, or renewed: a live learner's
                    holder = describe_holder(client.get(key))
                    raise ConsumerInUseError(_other_learner(stream, key.decode(), holder))
                expires[key] = pttl / 1000 + now
            if not announced:
                announced = True
                logger.info(
                    "another learner's lease on stream %r (%s) is still set: waiting for it to "
                    "expire (a learner stopped without releasing it) or be renewed (a live one: "
                    "this learner is then refused)",
                    stream,
                    others[0].decode(),
                )
            time.sleep(0.2)
    finally:
        client.close()


def _other_learner(stream: str, key: str, holder: str) -> str:
    group_consumer = key[len(f"{stream}:lease:") :]
    return (
        f"stream {stream!r} is read by another running learner ({holder}, lease {key!r}: group "
        f"and consumer {group_consumer!r}): two learner jobs on one stream each train only part "
        "of its samples (a group splits them between its consumers; another group's learner "
        "deletes what it acknowledges from under this one). Stop that learner first, or start "
        "this one on its own --stream with its own actors; data-parallel learners are the ranks "
        "of one torchrun job"
    )


def _heartbeat(
    ref: weakref.ref[ConsumerLease],
    stop: threading.Event,
    every_s: float,
    client: redis.Redis,
    keys: list[str],
    token: str,
) -> None:
    """Renew the lease behind `ref` every `every_s` until `stop`. A lease dropped unreleased
    (`ref` dead; its finalizer sets `stop`) is deleted here through its own `client`, so its
    consumer name is free at once rather than after one ttl."""
    failing = False
    main = threading.main_thread()
    while not stop.wait(every_s):
        if not main.is_alive():
            return  # the process is ending without a release: let the lease expire
        lease = ref()
        if lease is None:
            break
        failing = lease._renew_once(failing)
        del lease  # between heartbeats only the lease's owner keeps it alive
    if ref() is None:
        with contextlib.suppress(redis.RedisError):  # else it expires after one ttl
            client.register_script(_RELEASE)(keys=keys, args=[token])
        client.close()
