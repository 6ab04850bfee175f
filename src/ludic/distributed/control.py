"""The per-push control channel of a weight-sync group, over the trainer's TCPStore.

Both sides of a `BroadcastPolicyPublisher` group already share the trainer's TCPStore (the
group is built on it), so a push can be driven through it instead of two HTTP requests: one
store round trip costs ~0.1 ms on 127.0.0.1, an HTTP request to the embedded server ~2-6 ms,
which is most of a small model's push. Each push `n` is three keys under `ludic-control/`:

    trainer: push/n = manifest JSON (or {"close": true}, acked once the server let go)
    server:  ack/n  = {"ok": true} or {"error": ..., "status": 400}   (before any bucket)
    trainer: broadcasts the buckets over the group
    server:  done/n = {"policy_version", "num_tensors", "num_bytes", "checksums" (of what it
             holds after loading), "held_dtypes"} or {"error": ...}

The reader of a key deletes it once the push is over (the trainer when it sends the next
request, the server after its done reply), off the critical path. The server refuses a
manifest in the ack, so a refused push never starts a broadcast and the group stays usable. A
push whose layout (the manifest without its version) the server already accepted on this
channel sends only {"layout": id, "version": v} and goes straight to the buckets, with no ack:
the server knows that layout is valid.

Several servers in one group (`BroadcastPolicyPublisher` with many URLs) each get a channel of
their own, named by their first rank in the group (`channel_prefix`), so one store carries
them all. Waiting for a reply can ask, every `slice_s`, whether the server is still there
(`alive`), so a server that died mid-push is named within seconds instead of after the store's
timeout. A server waiting for the next request sees a trainer that exited without a goodbye as
`TrainerGone`, without c10d's C++ stack trace (`quiet_c10d`, around that wait only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ludic.distributed.manifest import WeightManifest
from ludic.distributed.quiet_c10d import quiet_c10_warnings


def channel_prefix(rank: int) -> str:
    """The store prefix of the channel to the server whose first rank is `rank` (rank 1, the
    only server of a two-process group, keeps the plain prefix)."""
    return "ludic-control" if rank == 1 else f"ludic-control/r{rank}"


def layout_id(manifest_json: dict[str, Any]) -> str:
    """An id of a manifest's layout: everything but the version."""
    layout = {k: v for k, v in manifest_json.items() if k != "version"}
    return hashlib.sha1(json.dumps(layout, sort_keys=True).encode()).hexdigest()


class ControlChannelClosed(RuntimeError):
    """The trainer's store went away (the trainer exited) or the channel was stopped."""


class TrainerGone(ControlChannelClosed):
    """The trainer's store closed its connection while the server waited for a request: the
    trainer exited (normally without `close()`, or killed)."""


class ServerGone(RuntimeError):
    """While the trainer waited for a reply, the server stopped answering (the reason says
    why: unreachable, restarted, left the group)."""


class StoreControl:
    """One side of the control channel on `store` (the trainer hosts it, the server joins).
    Waiting for a reply is bounded by the store's own timeout."""

    def __init__(
        self, store: dist.Store, *, waker: dist.Store | None = None, rank: int = 1
    ) -> None:
        prefix = channel_prefix(rank)
        self.store = dist.PrefixStore(prefix, store)
        # `wake()` needs a second client: a TCPStore client blocked in `wait` holds its socket.
        self._waker = None if waker is None else dist.PrefixStore(prefix, waker)
        self.seq = 0  # the push in progress (both sides count pushes from 0)
        self.accepted: set[str] = set()  # layout ids the server accepted on this channel
        self._offered: str | None = None
        self._last_layout: tuple[object, str] | None = None
        self._consumed: list[str] = []  # keys read, deleted once the push is over

    # -- trainer side ----------------------------------------------------------------------

    def send_request(self, body: dict[str, Any]) -> None:
        self.store.set(f"push/{self.seq}", json.dumps(body))
        self._delete_consumed()  # the last push's replies, while the server wakes up

    def send_close(self, timeout_s: float = 5.0) -> bool:
        """Say goodbye; True once the server acknowledged it (it then no longer waits on this
        store, so closing the store right after is quiet on its side), False without a reply
        within `timeout_s` (a server that is gone or busy)."""
        self.send_request({"close": True})
        key = f"ack/{self.seq}"
        try:
            with quiet_c10_warnings():  # a timeout here is a c10d warning: expected if gone
                self.store.wait([key], timedelta(seconds=timeout_s))
        except RuntimeError:
            return False
        self._consumed.append(key)
        return True

    def send_manifest(self, manifest: WeightManifest) -> bool:
        """Request a push of `manifest`; True if the server must ack it first (a layout not yet
        accepted on this channel), False if the buckets may follow at once."""
        if self._last_layout is None or self._last_layout[0] is not manifest.tensors:
            # A manifest re-planned with only a new version keeps its `tensors` tuple.
            self._last_layout = (manifest.tensors, layout_id(manifest.to_json()))
        layout = self._last_layout[1]
        if layout in self.accepted:
            self.send_request({"layout": layout, "version": manifest.version})
            return False
        self.send_request({**manifest.to_json(), "layout": layout})
        self._offered = layout
        return True

    def wait_reply(
        self,
        kind: str,
        *,
        alive: Callable[[], str | None] | None = None,
        slice_s: float = 1.0,
        timeout_s: float = 3600.0,
    ) -> dict[str, Any]:
        """The server's `kind` ("ack" or "done") reply to the current push (blocks). With
        `alive`, every `slice_s` without a reply it is asked why the server cannot answer;
        a reason, or `timeout_s` without a reply, raises ServerGone."""
        key = f"{kind}/{self.seq}"
        deadline = time.monotonic() + timeout_s
        while alive is not None:
            try:
                self.store.wait([key], timedelta(seconds=slice_s))
                break
            except RuntimeError:  # DistStoreError on a timeout
                reason = alive()
                if reason is None and time.monotonic() > deadline:
                    reason = f"no {kind} reply within {timeout_s:g} s"
                if reason is not None:
                    self.seq += 1  # this push is over for this channel
                    raise ServerGone(reason) from None
        reply = self._take(key)
        if kind == "ack" and "error" not in reply and self._offered is not None:
            self.accepted.add(self._offered)
        if kind == "done" or "error" in reply:
            self.seq += 1
        return reply

    # -- server side -----------------------------------------------------------------------

    def next_request(self, stop: threading.Event, slice_s: float = 3600.0) -> dict[str, Any]:
        """Block until the trainer sends the next push request; `wake()` ends the wait.

        Raises TrainerGone if the store closes its connection (the trainer exited), else
        ControlChannelClosed once `stop` is set or the store fails. Waits in `slice_s` slices
        (each timeout logs a c10d warning). c10d's C++ warnings are silenced during the wait:
        the store closing under it is the expected end of a trainer's run.
        """
        key = f"push/{self.seq}"
        while not stop.is_set():
            started = time.monotonic()
            try:
                with quiet_c10_warnings():
                    self.store.wait([key], timedelta(seconds=slice_s))
                    body = self._take(key)
            except dist.DistNetworkError as e:  # the socket closed: the trainer exited
                raise TrainerGone(f"lost the trainer's store ({_first_line(e)})") from e
            except RuntimeError as e:  # DistStoreError on a timeout, ...
                if time.monotonic() - started < slice_s / 2:  # failed, did not time out
                    raise ControlChannelClosed(f"lost the trainer's store: {e}") from e
                continue
            if stop.is_set():
                break
            return body
        raise ControlChannelClosed("the control channel was stopped")

    def wake(self) -> None:
        """End a `next_request` wait from another thread (set `stop` first). Best effort."""
        if self._waker is None:
            raise RuntimeError("StoreControl.wake needs a waker store (a second client)")
        with contextlib.suppress(RuntimeError), quiet_c10_warnings():  # a closed store: the
            self._waker.set(f"push/{self.seq}", json.dumps({"close": True}))  # wait fails too

    def accept(
        self,
        body: dict[str, Any],
        layouts: dict[str, WeightManifest],
        check: Callable[[WeightManifest], object],
    ) -> WeightManifest | None:
        """The manifest of push request `body`: a layout accepted before on this channel
        (`layouts`; no ack: the buckets are already coming), or a new one, refused by
        `check` (raising) or accepted, and acked either way; None if refused."""
        layout = str(body.get("layout"))
        known = layouts.get(layout)
        if known is not None and "tensors" not in body:
            return dataclasses.replace(known, version=_request_version(body.get("version")))
        try:
            manifest = WeightManifest.from_json(body)
            check(manifest)
        except (ValueError, RuntimeError) as e:  # malformed (ManifestError), or refused
            self.reply("ack", {"error": str(e), "status": 400})
            return None
        layouts[layout] = manifest
        self.reply("ack", {"ok": True})
        return manifest

    def reply(self, kind: str, body: dict[str, Any]) -> None:
        self.store.set(f"{kind}/{self.seq}", json.dumps(body))
        if kind == "done" or "error" in body:
            self.seq += 1
            self._delete_consumed()  # the request, now that the trainer is released

    def _take(self, key: str) -> dict[str, Any]:
        """The value of `key`, waiting for it (up to the store's own timeout)."""
        body: dict[str, Any] = json.loads(self.store.get(key))
        self._consumed.append(key)
        return body

    def _delete_consumed(self) -> None:
        for key in self._consumed:
            self.store.delete_key(key)
        self._consumed.clear()


def _request_version(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ControlChannelClosed(f"a push request carries version {value!r}, not an int >= 0")
    return value


def _first_line(error: BaseException) -> str:
    """An error's message without the C++ frames c10 appends to some."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
